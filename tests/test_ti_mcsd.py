"""Target-initialized trees (P1, design §6.1, §6.6) and the dynamic sliced mask (§3.5, §6.2).

- W = 1 is lossless: greedy output equals target greedy; at T > 0 the subtree below the single level-1 token is
  verified by the RRS-without-replacement walk (P1's independent chain tests are lossy once siblings exist).
- W >= 2 is reported lossy everywhere (MethodConfig, generate stats, CLI warning).
- The exact first-token law of `multispec.optimal.ti_distortion` matches the engine (Monte Carlo, chi-square).
- The target verifies only drafted nodes, with mask and positions sliced from the max tree's one mask.
"""
from functools import cached_property

import numpy as np
import pytest
import torch

from engine_utils import chi_square_pvalue, greedy_reference, run, tiny_pair
from helpers import tiny_llama
from memo_backend import MemoBackend
from multispec.drafting.policies import AnyChainAbove
from multispec.optimal.ti_distortion import first_token_law, first_token_tv
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_policy
from multispec.decoding.methods import build_method
from multispec.models import forward_chain, make_backend
from multispec.sampling import SamplingConfig
from multispec.tree import Tree
from multispec.verify.rrs_wor import draw_wor
from multispec.verify.ti_chains import verify_chains

GREEDY = SamplingConfig(temperature=0.0)
T1 = SamplingConfig(temperature=1.0)


@pytest.mark.parametrize("vocab", [12, 64])
def test_width_one_equals_target_greedy(vocab):
    target, draft = tiny_pair(vocab=vocab, seed=vocab + 1)
    prompt = [1, 5, 3, 7]
    ref = greedy_reference(target, prompt, 30)
    for method, options in [("ti-mcsd", {"tree": (1, 4, 3, 1, 1)}), ("ti-mcsd", {"tree": (1, 1, 1)}),
                            ("dynamic", {"width": 1, "depth": 3, "target_init": True})]:
        out, c = run(target, draft, prompt, method, GREEDY, 30, **options)
        assert out == ref, (method, options)
        assert c.target_calls < 30


def test_width_two_greedy_commits_target_tokens_only():
    """Lossy but sane: every committed token is one of the target's top-2 at its position (level 1) or the
    target argmax (accepted draft tokens)."""
    target, draft = tiny_pair(vocab=12, seed=5)
    prompt = [1, 5, 3, 7]
    out, _ = run(target, draft, prompt, "ti-mcsd", GREEDY, 20, tree=(2, 2, 1))
    ids = prompt + out
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([ids])).logits[0]
    for i, tok in enumerate(out):
        assert tok in logits[len(prompt) - 1 + i].topk(2).indices.tolist()


def test_single_root_chains_are_lossless():
    """q = (.5, .5, 0), p = (.5, 0, .5), two siblings under the one level-1 token: P1's independent chain tests
    always commit token 0; the RRS-without-replacement walk used for W = 1 gives p."""
    tree = Tree.from_shape((1, 2))
    p = torch.zeros(len(tree), 3)
    q = torch.zeros(len(tree), 3)
    p[1], q[1] = torch.tensor([0.5, 0.0, 0.5]), torch.tensor([0.5, 0.5, 0.0])
    p[2:] = torch.tensor([1 / 3, 1 / 3, 1 / 3])
    gen = torch.Generator().manual_seed(0)
    counts = np.zeros(3)
    n = 4000
    for _ in range(n):
        tokens = torch.tensor([0, 1, 0, 0])
        tokens[2:] = draw_wor(q[1][None], 2, gen)[0]
        v = verify_chains(tree, tokens, p, q, greedy=False, generator=gen)
        second = int(tokens[v.path[2]]) if len(v.path) > 2 else int(v.residual.argmax())
        counts[second] += 1
    assert counts[1] == 0
    assert abs(counts[2] / n - 0.5) < 4 * (0.25 / n) ** 0.5


def test_padding_siblings_are_never_accepted():
    """W = 2 chains with more siblings than q has tokens: the padding tokens (q = 0) must not pass u*q < p."""
    tree = Tree.from_shape((2, 3))
    p = torch.full((len(tree), 4), 0.25)
    q = torch.zeros(len(tree), 4)
    q[1:3] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    tokens = torch.tensor([0, 2, 3, 0, 1, 2, 0, 1, 2])  # siblings 1, 2 of each level-1 node are padding
    for seed in range(50):
        v = verify_chains(tree, tokens, p, q, greedy=False, generator=torch.Generator().manual_seed(seed))
        assert all(int(tokens[u]) == 0 for u in v.path[2:])


def test_wide_trees_are_reported_lossy(capsys):
    from multispec.api import Pair, generate
    from multispec.cli import main

    assert build_method("ti-mcsd", tree=(2, 4, 3, 1, 1)).lossless is False
    assert build_method("ti-mcsd", width=3).lossless is False
    assert build_method("ti-mcsd", tree=(1, 4, 3, 1, 1)).lossless is True
    assert build_method("dynamic", width=4, target_init=True).lossless is False
    assert build_method("dynamic", width=1, target_init=True).lossless is True

    class Tok:
        eos_token_id = None
        bos_token_id = None

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    target, draft = tiny_pair(vocab=12, seed=2)
    pair = Pair(target=target, draft=draft, tokenizer=Tok(), target_path="t", draft_path="d")
    wide = generate(pair, [1, 2, 3], method="ti-mcsd", max_new_tokens=8, temperature=0.7, seed=0, tree=(2, 2, 1))
    narrow = generate(pair, [1, 2, 3], method="ti-mcsd", max_new_tokens=8, temperature=0.7, seed=0, tree=(1, 2, 1))
    assert wide.stats["lossless"] is False and narrow.stats["lossless"] is True
    with pytest.raises(SystemExit):
        main(["generate", "hi", "--method", "ti-mcsd", "--width", "2", "--target", "/nonexistent/model/dir"])
    err = capsys.readouterr().err
    assert "LOSSY" in err


def test_first_token_law_is_exact_for_width_one():
    target, draft = tiny_pair(vocab=6, seed=1)
    law = first_token_law(target, draft, [1, 2], (1, 2, 1), T1)
    assert law.tv < 1e-12
    assert abs(float(law.out.sum()) - 1) < 1e-12


def test_first_token_law_matches_the_engine():
    """The exact law of the first committed token (W = 2) against 3000 seeded engine runs (MemoBackend)."""
    target, draft = tiny_pair(vocab=6, seed=3, noise=1.0)
    prompt, tree, sampling = [1, 4, 2], (2, 1, 1), SamplingConfig(temperature=0.3)
    law = first_token_law(target, draft, prompt, tree, sampling)
    assert law.tv > 0.08  # a visibly lossy case, so the test has power
    assert abs(float(law.out.sum()) - 1) < 1e-9
    config = build_method("ti-mcsd", tree=tree)
    t, d = MemoBackend(target), MemoBackend(draft)
    counts = np.zeros(6, dtype=np.int64)
    policy = build_policy(config)
    for seed in range(3000):
        ids, _ = generate_ids(t, d, prompt, config, sampling, 1, seed, set(), policy=policy)
        counts[ids[0]] += 1
    assert chi_square_pvalue(counts, law.out.numpy()) > 1e-3
    assert chi_square_pvalue(counts, law.p.numpy()) < 1e-3
    assert first_token_tv(target, draft, prompt, tree, sampling) == pytest.approx(law.tv)


def test_sliced_fork_mask_with_target_level_one_matches_full_tree():
    """Fork tree (W, 1, 1, 1) with level 1 from the target, as `_ti_round` sends it: the root is already in the
    cache and nodes 1..N_d-1 go with the top-left block of the max tree's mask. Logits of the existing nodes equal
    the full tree's and per-path sequential forwards'."""
    model = tiny_llama(vocab=40)
    width, depth = 3, 4
    full = Tree.from_shape((width,) + (1,) * (depth - 1))
    tokens = torch.randint(0, 40, (len(full),), generator=torch.Generator().manual_seed(2))
    prefix = [4, 5, 6, int(tokens[0])]  # the root is the last prefix token
    lt = len(prefix)
    ref = make_backend(model)
    forward_chain(ref, torch.tensor(prefix))
    out_full = ref.forward(tokens[1:], full.position_ids(lt - 1)[1:],
                           full.attention_mask(lt - 1, rows=range(1, len(full))))
    for d in range(1, depth + 1):
        n = full.level_end(d)
        assert n - 1 == width * d  # design §3.5: N_d = W (d + 1) with d draft levels below level 1 (here d - 1)
        be = make_backend(model)
        forward_chain(be, torch.tensor(prefix))
        out = be.forward(tokens[1:n], full.position_ids(lt - 1)[1:n],
                         full.attention_mask(lt - 1, rows=range(1, n), cols=n))
        assert torch.allclose(out.logits, out_full.logits[: n - 1], atol=1e-4)
        for path in full.truncate(d).paths:
            ids = prefix + tokens[list(path[1:])].tolist()
            with torch.no_grad():
                seq = model(input_ids=torch.tensor([ids])).logits[0, lt:]
            assert torch.allclose(out.logits[[u - 1 for u in path[1:]]], seq, atol=1e-4)


class _Recorder:
    """Wraps a backend and records each forward's (n, mask)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def cache_len(self):
        return self.inner.cache_len

    def forward(self, tokens, positions, mask, want_hidden=False):
        self.calls.append((self.inner.cache_len, tokens.shape[0], mask.clone(), positions.clone()))
        return self.inner.forward(tokens, positions, mask, want_hidden)


@pytest.mark.parametrize("target_init", [False, True])
def test_dynamic_verifies_only_drafted_nodes_with_the_sliced_max_mask(monkeypatch, target_init):
    builds = []
    orig = Tree.ancestor_mask.func

    def counted(self):
        builds.append(len(self))
        return orig(self)

    prop = cached_property(counted)
    prop.__set_name__(Tree, "ancestor_mask")
    monkeypatch.setattr(Tree, "ancestor_mask", prop)

    target, draft = tiny_pair(vocab=16, seed=4)
    width, depth = 3, 5
    config = build_method("dynamic", width=width, depth=depth, target_init=target_init)
    max_tree = Tree.from_shape(config.tree)
    gen = torch.Generator().manual_seed(0)
    policy = AnyChainAbove(max_tree, lambda h, q: torch.rand(h.shape[0], generator=gen), beta=0.7)
    t = _Recorder(make_backend(target))
    prompt = [1, 2, 3, 4]
    ids, c = generate_ids(t, make_backend(draft), prompt, config, GREEDY, 40, 0, set(), policy=policy)
    if not target_init:  # W = 3 with a target-drawn level 1 is lossy, even greedy
        assert ids == greedy_reference(target, prompt, 40)
    verify_calls = t.calls[1:]  # the first call is the prefill
    depths = set()
    for cache_len, n, mask, positions in verify_calls:
        if target_init:  # nodes 1..N_d-1, root in the cache at row cache_len - 1
            assert n % width == 0
            d = n // width
            full = max_tree.attention_mask(cache_len - 1, rows=range(1, n + 1), cols=n + 1)
            assert torch.equal(positions, max_tree.position_ids(cache_len - 1)[1:n + 1])
        else:  # root + W d drafted nodes
            assert (n - 1) % width == 0
            d = (n - 1) // width
            full = max_tree.attention_mask(cache_len, rows=range(n), cols=n)
            assert torch.equal(positions, max_tree.position_ids(cache_len)[:n])
        assert torch.equal(mask, full)
        depths.add(d)
    assert len(depths) >= 2  # the drafted depth really varied
    assert builds == [len(max_tree)]  # one ancestor mask, the max tree's, built once
