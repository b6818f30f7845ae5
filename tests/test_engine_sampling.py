"""Sampling is lossless end to end: the joint law of the first 3 generated tokens equals the target's exact law.

Tiny random-init Llama pair (V = 8), 4e3 seeded generations per configuration (ti-mcsd 1.2e4), Pearson chi-square
(cells with expected count < 5 merged), failing below p = 1e-3. The engine runs on MemoBackend (records
token/position per cache row and looks logits up by the visible context), so mask, position and keep-path bugs are
caught; HF-backend cache correctness is tested in test_engine_cache.py. The lossy `mcns` and W = 2
target-initialized trees must fail the same test.
"""
import numpy as np
import pytest

from engine_utils import chi_square_pvalue, exact_joint, tiny_pair
from memo_backend import MemoBackend
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_policy
from multispec.decoding.methods import build_method
from multispec.sampling import SamplingConfig

V, L, N = 8, 3, 4_000
PROMPT = [1, 4, 2]
SAMPLINGS = {"T1": SamplingConfig(temperature=1.0), "T0.8-k5-p0.9": SamplingConfig(0.8, top_k=5, top_p=0.9)}
# Each lossless configuration runs 4e3 generations (~10 CPU-seconds; 2e4, then 1.5e4, until the suite passed 15
# minutes), the size at which the lossy mcns below fails this same test (p = 1e-10 on this seed stream; 2e3: 7e-7,
# 5e3: 5e-15). Broken chain verifiers fail it at this size too (sd k = 2): the residual drawn from p instead of
# (p - q)+ gives p = 2e-8 with verifier sd at T = 1, 2e-8 with block at T = 1 and 4e-72 with block under the top-k +
# top-p processing below. ti-mcsd runs 1.2e4 (N_TI): its lossy W = 2 variant below needs more than 1e4. Every
# verifier is covered once, half of them under top-k + top-p processing, and sd under both.
LOSSLESS = [
    ("ar", {}, "T0.8-k5-p0.9"),  # the reference every benchmark compares with samples the target law too
    ("sd", {"k": 2, "verifier": "sd"}, "T1"),  # token-level sd; the default (block) below
    ("sd", {"k": 2}, "T0.8-k5-p0.9"),
    ("mcsd", {"tree": (3, 2), "verifier": "rrs"}, "T1"),
    ("mcsd", {"tree": (3, 2), "verifier": "rrs-wor"}, "T0.8-k5-p0.9"),
    ("mcsd", {"tree": (3, 2), "verifier": "kseq"}, "T1"),
    ("mcsd", {"tree": (2, 2), "verifier": "spechub"}, "T0.8-k5-p0.9"),
    ("mcsd", {"tree": (3, 2), "verifier": "greedy-md"}, "T1"),
    ("ti-mcsd", {"tree": (1, 2, 1)}, "T1"),
    ("dynamic", {"width": 2, "depth": 2}, "T0.8-k5-p0.9"),
]
N_TI = 12_000
N_LOSSY = N  # mcns moves the first token's law by TV 0.057 on this pair: far beyond chance at this size

_PAIR = {}
_MEMO = {}


def _pair():
    if not _PAIR:
        _PAIR["pair"] = tiny_pair(vocab=V, seed=3, noise=0.6)
    return _PAIR["pair"]


def sample_counts(method, options, sampling, n=N, policy_factory=None):
    target, draft = _pair()
    t = MemoBackend(target, _MEMO.setdefault("t", {}))
    d = None if method == "ar" else MemoBackend(draft, _MEMO.setdefault("d", {}))  # ar: target only
    config = build_method(method, **options)
    counts = np.zeros(V ** L, dtype=np.int64)
    policy = policy_factory() if policy_factory else build_policy(config)
    for seed in range(n):
        ids, _ = generate_ids(t, d, PROMPT, config, sampling, L, seed, set(), policy=policy)
        counts[np.ravel_multi_index(ids[:L], (V,) * L)] += 1
    return counts


def law_pvalue(counts, probs):
    """The smaller p-value of two Pearson tests: the joint law of the first L tokens, and the law of the first
    token alone (where a per-token distortion is not diluted over V**L cells)."""
    first_counts = counts.reshape(V, -1).sum(1)
    first_probs = probs.reshape(V, -1).sum(1)
    return min(chi_square_pvalue(counts, probs), chi_square_pvalue(first_counts, first_probs))


def exact(sampling_name):
    key = ("exact", sampling_name)
    if key not in _MEMO:
        _MEMO[key] = exact_joint(_pair()[0], PROMPT, SAMPLINGS[sampling_name], L, V)
    return _MEMO[key]


@pytest.mark.slow
@pytest.mark.parametrize("method,options,sampling_name", LOSSLESS, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}{v}" for k, v in v.items()).replace(" ", ""))
def test_lossless_methods_match_target_law(method, options, sampling_name):
    n = N_TI if method == "ti-mcsd" else N
    counts = sample_counts(method, options, SAMPLINGS[sampling_name], n=n)
    assert counts.sum() == n
    assert law_pvalue(counts, exact(sampling_name)) > 1e-3


# The sequence verifiers (issue 13) at 2e3 generations each (~5 s; 3e3 until the suite passed 15 minutes; mcns
# fails the test above at 2e3, p = 7e-7, and block with the residual drawn from p instead of (p - q)+ fails the
# sd-block row below at 2e3, p = 2e-5): their exact-enumeration tests in test_verifiers_sequence.py carry the
# fine-grained proof and catch the broken variants; this checks the production path (drafting law, masks,
# keep-path) end to end.
N_SEQUENCE = 2_000


@pytest.mark.parametrize("method,options,sampling_name", [
    ("sd", {"k": 3, "verifier": "block"}, "T1"),
    ("mcsd", {"tree": (2, 2), "verifier": "traversal"}, "T0.8-k5-p0.9"),
    ("ti-mcsd", {"tree": (1, 2, 1), "verifier": "traversal"}, "T1"),
    ("mcsd", {"tree": (2, 2), "verifier": "univer"}, "T0.8-k5-p0.9"),
], ids=["sd-block", "mcsd-traversal", "ti-mcsd-traversal", "mcsd-univer"])
def test_sequence_verifiers_match_target_law(method, options, sampling_name):
    counts = sample_counts(method, options, SAMPLINGS[sampling_name], n=N_SEQUENCE)
    assert counts.sum() == N_SEQUENCE
    assert law_pvalue(counts, exact(sampling_name)) > 1e-3


# ti-mcsd's longest-chain bias is smaller on this pair: on this seed stream 5,000 runs give p = 0.09, 10,000 3e-6,
# 12,000 (N_TI, the size of ti-mcsd's lossless test above) 3e-8, 15,000 3e-10, 20,000 3e-22
@pytest.mark.slow
@pytest.mark.parametrize("method,options,n", [("mcsd", {"tree": (3, 2), "verifier": "mcns"}, N_LOSSY),
                                              ("ti-mcsd", {"tree": (2, 2, 1)}, N_TI)])
def test_lossy_methods_fail_the_same_test(method, options, n):
    counts = sample_counts(method, options, SAMPLINGS["T1"], n=n)
    assert law_pvalue(counts, exact("T1")) < 1e-3
