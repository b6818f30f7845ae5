"""Optimal acceptance (design §8, §11.4, §11.5): prefix search vs a generic LP and vs brute force over subsets;
verifier acceptance vs the production enumeration and vs the optimum of its draft law."""
import itertools
import math

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse
import torch

import multispec.optimal.acceptance as acc
import multispec.optimal.verifiers as ver
from multispec.errors import MultispecError
from multispec.optimal import (
    naive_acceptance,
    optimal_acceptance,
    optimal_acceptance_greedy,
    optimal_acceptance_hub,
    verifier_acceptance,
    verifier_optimum,
)


# ----------------------------------------------------------------------------------- oracles
def draft_sets(q: np.ndarray, n: int, law: str) -> tuple[np.ndarray, np.ndarray]:
    """Exact law of the SET of drafts: bitmasks int [M] and probabilities float [M] (aggregated over orders)."""
    v = q.size
    support = [int(i) for i in np.flatnonzero(q > 0)]
    masks, probs = [], []
    if law == "iid":
        for tup in itertools.product(support, repeat=n):
            masks.append(sum(1 << x for x in set(tup)))
            probs.append(math.prod(q[x] for x in tup))
    elif law == "wor":
        for tup in itertools.permutations(support, n):
            pr, left = 1.0, list(support)
            for x in tup:
                pr *= q[x] / sum(q[y] for y in left)
                left.remove(x)
            masks.append(sum(1 << x for x in tup))
            probs.append(pr)
    else:  # greedy: top n-1 of q, then one draw from q off the top (design §4.6)
        top = [int(i) for i in np.argsort(-q, kind="stable")[: n - 1]]
        rest = [i for i in range(v) if i not in top and q[i] > 0]
        mass = sum(q[i] for i in rest)
        base = sum(1 << x for x in top)
        if mass <= 0:
            pad = int(np.argsort(-q, kind="stable")[n - 1])
            return np.array([base | (1 << pad)]), np.array([1.0])
        for i in rest:
            masks.append(base | (1 << i))
            probs.append(q[i] / mass)
    masks, probs = np.array(masks), np.array(probs)
    uniq, inv = np.unique(masks, return_inverse=True)
    return uniq, np.bincount(inv, weights=probs)


def lp_optimum(p: np.ndarray, masks: np.ndarray, probs: np.ndarray) -> float:
    """design §8.4: max Σ 1[y ∈ S] π(S, y) over couplings of the draft-set law and p (HiGHS)."""
    v, m = p.size, masks.size
    member = ((masks[:, None] >> np.arange(v)[None, :]) & 1).astype(float)  # [M, V]
    a_rows = scipy.sparse.kron(scipy.sparse.eye(m), np.ones((1, v)))  # Σ_y π(S, y) = Q(S)
    a_cols = scipy.sparse.kron(np.ones((1, m)), scipy.sparse.eye(v))  # Σ_S π(S, y) = p(y)
    # rows as equalities, columns as <= p(y)·(1 + 1e-12): the totals agree, so the columns are tight at any
    # feasible point; the slack only absorbs float rounding (spurious infeasibility, design §8.4)
    qs = np.maximum(probs, 0) / probs.sum()
    res = scipy.optimize.linprog(-member.ravel(), A_eq=a_rows.tocsr(), b_eq=qs, A_ub=a_cols.tocsr(),
                                 b_ub=p / p.sum() * (1 + 1e-12), bounds=(0, None), method="highs")
    assert res.status == 0, res.message
    return -res.fun


def brute_force(p: np.ndarray, masks: np.ndarray, probs: np.ndarray) -> float:
    """design §8.1 subset form over all 2^V subsets H: min [1 + p(H) − Q(all drafts ∈ H)]."""
    v = p.size
    h = np.arange(2 ** v)
    inside = (masks[None, :] & ~h[:, None]) == 0  # [2^V, M] every draft in H
    p_h = (((h[:, None] >> np.arange(v)[None, :]) & 1) * p[None, :]).sum(1)
    return float(np.min(1 + p_h - inside @ probs))


def instance(rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Random (p, q, n), V <= 8, n <= 4: Dirichlet of several sharpness, sparse, peaked, identical, one-hot."""
    v = int(rng.integers(2, 9))
    n = int(rng.integers(1, 5))
    alpha = [0.1, 0.3, 1.0, 3.0][k % 4]
    p, q = rng.dirichlet(np.full(v, alpha)), rng.dirichlet(np.full(v, alpha))
    kind = k % 6
    if kind == 1:  # sparse: zero some entries of each
        p[rng.random(v) < 0.3] = 0
        q[rng.random(v) < 0.3] = 0
        p[rng.integers(v)] += 0.1
        q[rng.integers(v)] += 0.1
    elif kind == 2:  # peaked
        p[rng.integers(v)] += 5
        q[rng.integers(v)] += 5
    elif kind == 3:
        p = q.copy()
    elif kind == 4:
        p = np.eye(v)[rng.integers(v)]
    return p / p.sum(), q / q.sum(), n


def cases(count: int, seed: int, wor: bool):
    rng = np.random.default_rng(seed)
    out, k = [], 0
    while len(out) < count:
        p, q, n = instance(rng, k)
        k += 1
        if wor and np.count_nonzero(q) < n:
            continue
        out.append((p, q, n))
    return out


# ----------------------------------------------------------------------------------- optimum
@pytest.mark.parametrize("replacement", [True, False])
def test_prefix_search_matches_lp(replacement):
    law = "iid" if replacement else "wor"
    for p, q, n in cases(300, 1 if replacement else 2, wor=not replacement):
        masks, probs = draft_sets(q, n, law)
        assert optimal_acceptance(p, q, n, replacement) == pytest.approx(lp_optimum(p, masks, probs), abs=1e-7)


@pytest.mark.parametrize("law", ["iid", "wor", "greedy"])
def test_prefix_search_matches_brute_force(law):
    for p, q, n in cases(150, 3, wor=law != "iid"):
        if law == "greedy" and n > p.size:
            continue
        masks, probs = draft_sets(q, n, law)
        want = brute_force(p, masks, probs)
        got = {"iid": lambda: optimal_acceptance(p, q, n),
               "wor": lambda: optimal_acceptance(p, q, n, replacement=False),
               "greedy": lambda: optimal_acceptance_greedy(p, q, n)}[law]()
        assert got == pytest.approx(want, abs=1e-9)


def test_greedy_and_hub_optima_match_lp():
    for p, q, n in cases(60, 4, wor=True):
        if n > p.size:
            continue
        masks, probs = draft_sets(q, n, "greedy")
        assert optimal_acceptance_greedy(p, q, n) == pytest.approx(lp_optimum(p, masks, probs), abs=1e-7)
        if p.size >= 2:
            masks, probs = draft_sets(q, 2, "greedy")
            assert optimal_acceptance_hub(p, q) == pytest.approx(lp_optimum(p, masks, probs), abs=1e-7)


def test_quadrature_matches_exact_enumeration():
    # the large-V path (log-time trapezoid) against ordered-tuple enumeration, peaked and flat q
    rng = np.random.default_rng(5)
    for k in range(40):
        m, n = int(rng.integers(4, 11)), int(rng.integers(2, 5))
        q = rng.dirichlet(np.full(m, [0.1, 0.3, 1.0, 3.0][k % 4]))
        q = np.sort(q[q > 1e-300])
        q /= q.sum()
        if q.size < n or q[::-1][: n - 1].sum() > 1 - 1e-8:  # ill-conditioned (docs/optimal.md §2)
            continue
        exact = acc.all_in_prefix_wor_exact(q, n)
        assert np.abs(acc.all_in_prefix_wor_quad(q, n) - exact).max() < 1e-10


def test_quadrature_path_matches_lp(monkeypatch):
    monkeypatch.setattr(acc, "EXACT_TUPLES", 0)
    for p, q, n in cases(40, 6, wor=True):
        masks, probs = draft_sets(q, n, "wor")
        assert optimal_acceptance(p, q, n, replacement=False) == pytest.approx(lp_optimum(p, masks, probs), abs=1e-7)


def test_single_draft_is_one_minus_tv():
    for p, q, _ in cases(30, 7, wor=False):
        tv = 0.5 * np.abs(p - q).sum()
        assert optimal_acceptance(p, q, 1) == pytest.approx(1 - tv, abs=1e-12)
        assert optimal_acceptance(p, q, 1, replacement=False) == pytest.approx(1 - tv, abs=1e-12)


def test_without_replacement_is_at_least_iid():
    for p, q, n in cases(100, 8, wor=True):
        assert optimal_acceptance(p, q, n, False) >= optimal_acceptance(p, q, n) - 1e-12


def test_torch_input_and_zero_tokens():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.2, 0.6, 0.0], dtype=torch.float64)
    assert optimal_acceptance(p, q, 2) == pytest.approx(0.84, abs=1e-6)
    assert optimal_acceptance(p, q, 2, replacement=False) == pytest.approx(1.0, abs=1e-6)


# ----------------------------------------------------------------------------------- design §11.5 fixtures
FIXTURES = [
    # p, q, n, 1-TV, a*iid, a*wor, a*greedy, RRS iid, K-SEQ, RRS wor, greedy verify, naive iid, SpecHub
    ((.5, .3, .2), (.2, .2, .6), 2, .6, .84, 1.0, 1.0, .76, .785330, .9, 1.0, .456, 1.0),
    ((.1, .2, .3, .4), (.4, .3, .2, .1), 2, .6, .79, .834524, .766667, .72, .75, .764286, .766667, .35, .766667),
    ((.1, .2, .3, .4), (.4, .3, .2, .1), 3, .6, .871, 1.0, .933333, .768, .793950, .840298, .933333, .4646, None),
]


@pytest.mark.parametrize("row", FIXTURES)
def test_spec_fixtures(row):
    p, q, n, tv, iid, wor, greedy, rrs, kseq, rrs_wor, greedy_md, naive, hub = row
    assert round(optimal_acceptance(p, q, 1), 6) == pytest.approx(tv)
    assert round(optimal_acceptance(p, q, n), 6) == pytest.approx(iid)
    assert round(optimal_acceptance(p, q, n, replacement=False), 6) == pytest.approx(wor)
    assert round(optimal_acceptance_greedy(p, q, n), 6) == pytest.approx(greedy)
    assert round(verifier_acceptance("rrs", p, q, n).value, 6) == pytest.approx(rrs)
    assert round(verifier_acceptance("kseq", p, q, n).value, 6) == pytest.approx(kseq)
    est = verifier_acceptance("rrs-wor", p, q, n)
    assert est.exact and round(est.value, 6) == pytest.approx(rrs_wor)
    assert round(verifier_acceptance("greedy-md", p, q, n).value, 6) == pytest.approx(greedy_md)
    assert round(naive_acceptance(p, q, n), 6) == pytest.approx(naive)
    if hub is not None:
        assert round(verifier_acceptance("spechub", p, q, 2).value, 6) == pytest.approx(hub)
        assert round(optimal_acceptance_hub(p, q), 6) == pytest.approx(hub)


# ----------------------------------------------------------------------------------- verifiers
def test_verifiers_match_production_enumeration_and_stay_below_optimum():
    from multispec.verify import REGISTRY

    for p, q, n in cases(60, 9, wor=True):
        if p.size < 2 or n > p.size or p.size ** n > 2000:
            continue
        pt, qt = torch.from_numpy(p), torch.from_numpy(q)
        for name in ("rrs", "kseq", "rrs-wor", "greedy-md", "spechub", "mcns", "sd"):
            m = {"spechub": 2, "sd": 1}.get(name, n)
            est = verifier_acceptance(name, p, q, m)
            _, exact = REGISTRY[name].exact(pt, qt, m)
            assert est.value == pytest.approx(exact, abs=1e-9), name
            best = verifier_optimum(name, p, q, m)
            if best is not None:  # mcns is lossy: its acceptance may exceed any lossless optimum
                assert est.value <= best + 1e-9, name
            if name in ("spechub", "greedy-md", "sd"):
                assert est.value == pytest.approx(best, abs=1e-9), name


def test_greedy_verifier_is_argmax_hit():
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.1, 0.4])
    assert verifier_acceptance("greedy", p, q, 2).value == 0.0
    assert verifier_acceptance("greedy", p, q, 3).value == 1.0
    assert verifier_optimum("greedy", p, q, 2) == pytest.approx(0.4)


def test_rrs_wor_monte_carlo_is_labelled_and_close(monkeypatch):
    monkeypatch.setattr(ver, "EXACT_WOR_TUPLES", 0)
    p, q = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.4, 0.3, 0.2, 0.1])
    est = verifier_acceptance("rrs-wor", p, q, 2, samples=4000, generator=torch.Generator().manual_seed(1))
    assert not est.exact and "monte carlo" in est.method and est.stderr > 0
    assert abs(est.value - 0.764286) < 4 * est.stderr + 1e-6


# ----------------------------------------------------------------------------------- invalid input
@pytest.mark.parametrize("p, q, n, kw, match", [
    ([0.5, 0.5], [0.3, 0.3, 0.4], 2, {}, "same shape"),
    ([[0.5, 0.5]], [[0.5, 0.5]], 2, {}, "1-D"),
    ([1.2, -0.2], [0.5, 0.5], 2, {}, "negative"),
    ([0.5, 0.4], [0.5, 0.5], 2, {}, "sum to 1"),
    ([0.5, 0.5], [0.5, 0.5], 0, {}, ">= 1"),
    ([0.5, 0.5], [0.5, 0.5], 2.0, {}, "integer"),
    ([0.5, 0.5], [0.5, 0.5], True, {}, "integer"),
    ([0.5, 0.5, 0.0], [1.0, 0.0, 0.0], 2, {"replacement": False}, "q > 0"),
    ([0.5, float("nan")], [0.5, 0.5], 2, {}, "non-finite"),
])
def test_invalid_input(p, q, n, kw, match):
    with pytest.raises(MultispecError, match=match):
        optimal_acceptance(np.array(p), np.array(q), n, **kw)


def test_invalid_verifier_input():
    with pytest.raises(MultispecError, match="unknown verifier"):
        verifier_acceptance("nope", [0.5, 0.5], [0.5, 0.5], 2)
    with pytest.raises(MultispecError, match="exactly 2"):
        verifier_acceptance("spechub", [0.5, 0.5], [0.5, 0.5], 3)
    with pytest.raises(MultispecError, match="sum to 1"):
        naive_acceptance([0.5, 0.6], [0.5, 0.5], 2)


def test_all_n_at_once_matches_single_calls(monkeypatch):
    from multispec.optimal.acceptance import optimal_acceptance_all_n

    for exact in (True, False):
        if not exact:
            monkeypatch.setattr(acc, "EXACT_TUPLES", 0)
        for p, q, _ in cases(20, 10, wor=True):
            got = optimal_acceptance_all_n(p, q, 4)
            for (n, repl), value in got.items():
                assert value == pytest.approx(optimal_acceptance(p, q, n, repl), abs=1e-10)
