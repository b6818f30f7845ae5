"""Token-tree topology (design §3.1, §3.2, §3.5): masks, positions, paths, keep indices, sliced masks, validation."""
from __future__ import annotations

import random

import pytest
import torch

from multispec.errors import MultispecError
from multispec.tree import Tree, additive_mask, parse_shape


def _random_bfs_tree(rng: random.Random, max_nodes: int = 40) -> Tree:
    """A random breadth-first tree: nodes are expanded in order, each with 0..3 children."""
    parents = [-1]
    frontier = 0
    while frontier < len(parents) and len(parents) < max_nodes:
        for _ in range(rng.randint(0, 3) if frontier else rng.randint(1, 3)):
            parents.append(frontier)
        frontier += 1
    return Tree(tuple(parents))


def _trees() -> list[Tree]:
    rng = random.Random(0)
    shapes = [(1,), (3,), (4, 2, 2, 1), (2, 3), (1, 1, 1), (5, 1, 1, 1)]
    shapes += [tuple(rng.randint(1, 3) for _ in range(rng.randint(1, 4))) for _ in range(6)]
    return [Tree.from_shape(s) for s in shapes] + [_random_bfs_tree(rng) for _ in range(12)] + [Tree.chain(0)]


TREES = _trees()


def _ancestors_and_self(tree: Tree, i: int) -> set[int]:
    out = {i}
    while tree.parents[i] != -1:
        i = tree.parents[i]
        out.add(i)
    return out


def test_expansion_tree_sizes():
    tree = Tree.from_shape((4, 2, 2, 1))
    assert len(tree) == 1 + 44 and len(tree.paths) == 16 and tree.max_depth == 4
    assert Tree.from_shape((4, 2, 2)).level_end(3) == 29
    assert [len(tree.level(d)) for d in range(5)] == [1, 4, 8, 16, 16]


@pytest.mark.parametrize("prefix_len", [0, 5])
def test_mask_positions_paths_keep(prefix_len):
    for tree in TREES:
        n = len(tree)
        full = tree.attention_mask(prefix_len)
        assert full.shape == (n, prefix_len + n) and full.dtype == torch.bool
        assert full[:, :prefix_len].all()
        for i in range(n):
            admitted = set(torch.nonzero(full[i, prefix_len:]).flatten().tolist())
            assert admitted == _ancestors_and_self(tree, i)
            assert set(tree.path_to(i)) == admitted and tree.path_to(i)[0] == 0 and tree.path_to(i)[-1] == i
            assert tree.depths[i] == len(tree.path_to(i)) - 1
        assert torch.equal(tree.ancestor_mask, full[:, prefix_len:])
        assert tree.position_ids(prefix_len).tolist() == [prefix_len + d for d in tree.depths]
        # children, leaves, paths
        for i, kids in enumerate(tree.children):
            assert all(tree.parents[k] == i for k in kids) and list(kids) == sorted(kids)
            if kids:
                assert list(kids) == list(range(kids[0], kids[-1] + 1))  # siblings contiguous
        assert tree.leaves == tuple(i for i in range(n) if not tree.children[i])
        assert len(tree.paths) == len(tree.leaves)
        for path, leaf in zip(tree.paths, tree.leaves):
            assert path[-1] == leaf and all(tree.parents[b] == a for a, b in zip(path, path[1:]))
            keep = tree.keep_indices(path, prefix_len)
            assert keep.tolist() == list(range(prefix_len)) + [prefix_len + u for u in path]


def test_breadth_first_order():
    for tree in TREES:
        assert list(tree.depths) == sorted(tree.depths)
        assert all(tree.parents[i] < i for i in range(1, len(tree)))
        assert list(tree.parents[1:]) == sorted(tree.parents[1:])


@pytest.mark.parametrize("prefix_len", [0, 3])
def test_sliced_mask_is_the_truncated_tree_mask(prefix_len):
    for tree in TREES:
        full = tree.attention_mask(prefix_len)
        for depth in range(tree.max_depth + 1):
            n_d = tree.level_end(depth)
            sliced = tree.attention_mask(prefix_len, rows=range(n_d), cols=n_d)
            assert torch.equal(sliced, full[:n_d, : prefix_len + n_d])
            small = tree.truncate(depth)
            assert len(small) == n_d and small.parents == tree.parents[:n_d]
            assert torch.equal(sliced, small.attention_mask(prefix_len))
            assert torch.equal(small.position_ids(prefix_len), tree.position_ids(prefix_len)[:n_d])


def test_fork_tree_slices():
    width, depth = 3, 4
    tree = Tree.from_shape((width,) + (1,) * (depth - 1))
    for d in range(1, depth + 1):
        assert tree.level_end(d) == 1 + width * d  # design §3.5 with the root counted


def test_additive_mask():
    mask = Tree.from_shape((2, 1)).attention_mask(2)
    add = additive_mask(mask, torch.float16)
    assert add.dtype == torch.float16
    assert (add[mask] == 0).all() and (add[~mask] == torch.finfo(torch.float16).min).all()


def test_grow_node_by_node():
    tree = Tree.chain(0).add_children(0, 2).add_children(1, 1).add_children(2, 2)
    assert tree.parents == (-1, 0, 0, 1, 2, 2)
    with pytest.raises(MultispecError):
        tree.add_children(1, 1)  # would break breadth-first order
    with pytest.raises(MultispecError):
        tree.add_children(9, 1)


@pytest.mark.parametrize("shape", [(), (0,), (2, 0), (-1,), (2, -3), (2.5,), (2, 1.0), (True,), ("2",)])
def test_invalid_shapes_raise(shape):
    with pytest.raises(MultispecError):
        Tree.from_shape(shape)


@pytest.mark.parametrize("text", ["", "0", "2,0", "-1", "2.5", "a,b", "x", "4;2"])
def test_invalid_shape_text_raises(text):
    with pytest.raises(MultispecError):
        parse_shape(text)


def test_parse_shape():
    assert parse_shape("4,2,2,1") == (4, 2, 2, 1)
    assert parse_shape(" 3 , 1 ") == (3, 1)
    for bad in ("2x3", "4x", ",4,", "4,,1", "a", "", "0,1"):
        with pytest.raises(MultispecError):
            parse_shape(bad)


@pytest.mark.parametrize("parents", [(), (0,), (-1, 1), (-1, 0, 2), (-1, 0, 1, 0), (-1, -1)])
def test_invalid_parents_raise(parents):
    with pytest.raises(MultispecError):
        Tree(parents)


def test_huge_or_negative_sizes_raise():
    with pytest.raises(MultispecError):
        Tree.from_shape((64, 64, 64))
    with pytest.raises(MultispecError):
        Tree.chain(-1)
    with pytest.raises(MultispecError):
        Tree.chain(1.5)


def test_tree_is_frozen():
    tree = Tree.from_shape((2,))
    with pytest.raises(Exception):
        tree.parents = (-1,)



@pytest.mark.parametrize("broken", [False, True])
def test_a_long_catch_up_is_fed_alone_and_drafts_the_same(broken, monkeypatch):
    """A draft that has not read many committed tokens (a deferred prefill) reads them as a chain of their own whose
    output layer runs on its last row only; the drafted tree, its laws and the draft's cache are what one forward
    over the catch-up and the tree gives. The broken variant (the catch-up dropped instead of fed) is caught."""
    from helpers import tiny_llama
    import multispec.drafting.grow as grow
    from multispec.models.fast import FastBackend
    from multispec.sampling import SamplingConfig

    model = tiny_llama(vocab=32, seed=4, scale=3.0)
    pending = torch.randint(0, 32, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    drafts, logit_rows, cache = {}, {}, {}
    for split in (0, 10**6):  # 0: every catch-up fed alone; 10**6: never (one first forward)
        monkeypatch.setattr(grow, "CATCH_UP_ALONE", split)
        if broken and split == 0:
            monkeypatch.setattr(grow, "_catch_up", lambda *a, **k: None)
        backend, seen = FastBackend(model, max_len=96), []
        forward = backend.forward

        def counting(tokens, positions, mask, want_hidden=False, last_only=False, _f=forward, _s=seen):
            out = _f(tokens, positions, mask, want_hidden, last_only=last_only)
            _s.append(out.logits.shape[0])
            return out
        monkeypatch.setattr(backend, "forward", counting)
        drafts[split] = grow.grow_tree(backend, pending, Tree.from_shape((2, 1)), [], 0,
                                       SamplingConfig(temperature=1.0), _multinomial, torch.Generator().manual_seed(1))
        logit_rows[split], cache[split] = seen, backend.cache_len
    assert logit_rows[10**6] == [len(pending), 2]  # one first forward: a law for every caught-up row
    if broken:  # the draft never read the catch-up: its root's law differs
        assert not torch.allclose(drafts[0].q[:1], drafts[10**6].q[:1], atol=1e-3)
        return
    assert logit_rows[0] == [1, 1, 2]  # the catch-up's last row only, then the root, then its children
    assert cache[0] == cache[10**6]
    assert torch.equal(drafts[0].tokens, drafts[10**6].tokens)
    torch.testing.assert_close(drafts[0].q, drafts[10**6].q, rtol=1e-4, atol=1e-6)
    assert drafts[0].draft_calls == drafts[10**6].draft_calls + 1


def _multinomial(q: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(q, n, replacement=False, generator=generator)
