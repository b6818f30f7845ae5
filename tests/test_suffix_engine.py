"""`suffix` through the engine: lossless at T = 1 with trees of width >= 2 drawn from a store shared across
generations (every generation's output joins the store, so later ones draft several continuations of the prompt),
a broken variant caught, greedy identity, and the registry entry (one store per Decoder family)."""
import numpy as np
import pytest

from engine_utils import exact_joint, greedy_reference, tiny_pair
from memo_backend import MemoBackend
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_method, build_policy
from multispec.drafting.suffix import SuffixStore
from multispec.errors import MultispecError
from multispec.sampling import SamplingConfig
from test_engine_sampling import law_pvalue

V, L = 8, 3
PROMPT = [1, 4, 2]
T1 = SamplingConfig(temperature=1.0)


def _counts(n: int, config, widths: list[int], seed0: int = 0):
    target, _ = tiny_pair(vocab=V, seed=3, noise=0.6)
    memo: dict = {}
    store = SuffixStore(max_tokens=50_000)
    policy = build_policy(config, None, {"store": store})
    observe = policy.observe
    policy.observe = lambda o: (widths.append(max(len(o.tree.level(d)) for d in range(o.tree.max_depth + 1))),
                                observe(o))
    counts = np.zeros(V ** L, dtype=np.int64)
    for seed in range(seed0, seed0 + n):
        ids, _ = generate_ids(MemoBackend(target, memo), None, PROMPT, config, T1, L, seed, set(), policy=policy)
        counts[np.ravel_multi_index(ids[:L], (V,) * L)] += 1
    return counts, target


@pytest.mark.slow
def test_suffix_trees_from_a_shared_store_are_lossless_and_the_iid_variant_is_caught(monkeypatch):
    config = build_method("suffix", max_nodes=8, min_prob=0.0)
    widths: list[int] = []
    counts, target = _counts(6_000, config, widths)
    exact = exact_joint(target, PROMPT, T1, L, V)
    assert sum(w >= 2 for w in widths) > 1_000, "the store should give trees of width >= 2"
    assert law_pvalue(counts, exact) > 1e-3
    # broken: siblings verified as if each were drawn i.i.d. from the first child's law (rrs instead of the
    # without-replacement walk): a rejected first sibling makes the second one certain
    import dataclasses

    from multispec.drafting.proposers import PROPOSERS, SuffixTreeProposer

    class IidSiblings(SuffixTreeProposer):
        def propose(self, inputs, plan, max_tree):
            return dataclasses.replace(super().propose(inputs, plan, max_tree), verifier="rrs")

    monkeypatch.setitem(PROPOSERS, "suffix", IidSiblings())
    bad, _ = _counts(3_000, config, [])
    assert law_pvalue(bad, exact) < 1e-6


def test_suffix_is_greedy_identical_and_learns_across_generations():
    target, _ = tiny_pair(vocab=48, seed=2)
    ref = greedy_reference(target, [1, 2, 3], 40)
    config = build_method("suffix")
    store = SuffixStore()
    policy = build_policy(config, None, {"store": store})
    from multispec.models import make_backend

    taus = []
    for _ in range(2):
        ids, m = generate_ids(make_backend(target), None, [1, 2, 3], config, SamplingConfig(0.0), 40, 0, set(),
                              policy=policy)
        assert ids == ref
        taus.append(m.new_tokens / m.target_calls)
    assert taus[1] >= 4 * taus[0] / 2 and store.n_tokens >= 86  # the second pass copies the first from the store


def test_suffix_options_are_checked():
    for bad, msg in (({"max_nodes": 0}, "max_nodes"), ({"max_nodes": 65}, "at most 64"), ({"factor": 0}, "factor"),
                     ({"min_prob": 2}, "min_prob"), ({"store": "x"}, "SuffixStore"), ({"verifier": "rrs"}, "does not take")):
        with pytest.raises(MultispecError, match=msg):
            build_method("suffix", **bad)


@pytest.mark.slow
def test_auto_with_suffix_trees_keeps_the_target_law_and_uses_them():
    """auto with the suffix proposer (cheap target steps: speculation predicted to pay) and a store shared across
    generations: its suffix rounds are verified by naive sampling; the law stays the target's."""
    from multispec.drafting.auto import AutoPolicy
    from test_auto import _costs

    target, _ = tiny_pair(vocab=V, seed=3, noise=0.6)
    store = SuffixStore(max_tokens=50_000)
    policy = AutoPolicy(proposers=("lookup", "suffix"), max_nodes=8, cost_model=_costs(1e-2, 1e-4, 1e-3),
                        suffix_store=store)
    labels = []
    observe = policy.observe
    policy.observe = lambda o: (labels.append(o.plan.proposer), observe(o))
    config = build_method("auto", proposers="lookup,suffix")
    memo: dict = {}
    counts = np.zeros(V ** L, dtype=np.int64)
    for seed in range(4_000):
        ids, _ = generate_ids(MemoBackend(target, memo), None, PROMPT, config, T1, L, seed, set(), policy=policy)
        counts[np.ravel_multi_index(ids[:L], (V,) * L)] += 1
    assert labels.count("suffix") > 1_000
    assert law_pvalue(counts, exact_joint(target, PROMPT, T1, L, V)) > 1e-3
