"""The greedy hot path (issue 15, overhead parity): `walk_tree_greedy` on argmax ints must give exactly what
`walk_tree` gives with the greedy verifier on the one-hot processed p, and the engine must skip keep() only when
it would drop nothing."""
import pytest
import torch

from engine_utils import greedy_reference, run, tiny_pair
from multispec.sampling import SamplingConfig, process_logits
from multispec.tree import Tree
from multispec.verify import get_verifier
from multispec.verify.tree_walk import walk_tree, walk_tree_greedy

GREEDY = SamplingConfig(temperature=0.0)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 2, 1), (2, 2, 2), (4,)])
def test_greedy_walk_equals_the_verifier_walk(shape):
    """Random logits over a small vocabulary (ties and repeated sibling tokens included)."""
    tree = Tree.from_shape(shape)
    g = torch.Generator().manual_seed(sum(shape))
    spec = get_verifier("greedy")
    for _ in range(200):
        logits = torch.randint(0, 3, (len(tree), 4), generator=g).float()  # many ties: lowest index must win
        tokens = torch.randint(0, 4, (len(tree),), generator=g)
        p = process_logits(logits, GREEDY)
        expected = walk_tree(tree, tokens, p, torch.zeros_like(p), spec, g)
        assert walk_tree_greedy(tree, tokens.tolist(), logits.argmax(-1).tolist()) == expected


def test_a_broken_greedy_walk_is_caught():
    """The comparison above can fail: taking the last matching child instead of the first differs."""
    tree = Tree.from_shape((2, 1))
    tokens = [0, 3, 3, 1, 2]  # two children with token 3
    best = [3, 1, 2, 0, 0]

    def last_match(tree, tokens, best):
        node, path = 0, [0]
        while True:
            kids = [k for k in tree.children[node] if tokens[k] == best[node]]
            if not kids:
                return tuple(path), best[node]
            path.append(kids[-1])
            node = kids[-1]

    p = torch.nn.functional.one_hot(torch.tensor(best), 4).float()
    expected = walk_tree(tree, torch.tensor(tokens), p, torch.zeros_like(p), get_verifier("greedy"), None)
    assert walk_tree_greedy(tree, tokens, best) == expected == ((0, 1, 3), 0)
    assert last_match(tree, tokens, best) != expected


@pytest.mark.parametrize("method,options", [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 1)})])
def test_engine_skips_only_no_op_keeps(method, options, monkeypatch):
    """ar never calls keep (nothing to drop); every call that is made drops something; output stays greedy."""
    from multispec.models.hf import HFBackend

    calls = []
    real = HFBackend.keep

    def spy(self, indices):
        calls.append((self.cache_len, len(indices), indices.tolist() == list(range(len(indices)))))
        real(self, indices)

    monkeypatch.setattr(HFBackend, "keep", spy)
    target, draft = tiny_pair(vocab=12, seed=2)
    prompt = [1, 5, 2]
    ids, _ = run(target, draft, prompt, method, GREEDY, 16, **options)
    assert ids == greedy_reference(target, prompt, 16)
    assert all(before != kept or not prefix for before, kept, prefix in calls)  # never a no-op
    if method == "ar":
        assert calls == []
