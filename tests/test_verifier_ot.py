"""The optimal-transport verifier `ot` (issue 14, docs/optimal.md §7): exact enumeration, production sampling,
both constructions of the key pieces, and a deliberately broken variant that the same checks must catch.

Exact: the i.i.d. draft law is enumerated (law_iid) and every tuple goes through the production law
(OTVerifierSpec.law -> OTSelection.node_law, the function `verify` samples from). The output law must equal p
and the acceptance must equal optimal_acceptance(p, q, n), both within 1e-9.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from multispec.errors import MultispecError
from multispec.optimal import optimal_acceptance, verifier_acceptance, verifier_optimum
from multispec.optimal.verifiers import ot_measured_acceptance
from multispec.verify import REGISTRY
from multispec.verify.ot import OTVerifierSpec, ot_selection, selection_law
from test_verifiers_sampled import ALPHA, sampled_check

F64 = torch.float64
TOL = 1e-9
SPEC = REGISTRY["ot"]


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def random_instances(count: int, seed: int) -> list[tuple[str, np.ndarray, np.ndarray, int]]:
    """(label, p, q, n): V in 2..6, n in 1..4, Dirichlet 0.1–3, some with zeros in q or p."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        v, n, alpha = int(rng.integers(2, 7)), int(rng.integers(1, 5)), float(rng.choice([0.1, 0.3, 1.0, 3.0]))
        p, q = rng.dirichlet([alpha] * v), rng.dirichlet([alpha] * v)
        if i % 5 == 0:
            q[rng.integers(v)] = 0.0
        if i % 7 == 0:
            p[rng.integers(v)] = 0.0
        out.append((f"random-{i}", p / p.sum(), q / q.sum(), n))
    return out


def edge_instances() -> list[tuple[str, np.ndarray, np.ndarray, int]]:
    rng = np.random.default_rng(3)
    p5 = rng.dirichlet([1.0] * 5)
    cases = [("p=q", p5, p5.copy()), ("disjoint", np.array([0.5, 0.5, 0, 0, 0]), np.array([0, 0, 0.2, 0.3, 0.5])),
             ("one-hot-q", rng.dirichlet([1.0] * 4), np.array([0, 1.0, 0, 0])),
             ("one-hot-p", np.array([0, 0, 1.0, 0]), rng.dirichlet([1.0] * 4)),
             ("zeros-in-q", rng.dirichlet([1.0] * 5), np.array([0.6, 0, 0.4, 0, 0])),
             ("ratio-ties", np.array([0.2, 0.2, 0.3, 0.3]), np.array([0.1, 0.1, 0.4, 0.4])),
             ("q-ties", rng.dirichlet([1.0] * 4), np.array([0.25, 0.25, 0.25, 0.25])),
             ("uniform-both", np.full(6, 1 / 6), np.full(6, 1 / 6))]
    return [(label, p, q, n) for label, p, q in cases for n in range(1, 5)]


def enumerate_law(p: np.ndarray, q: np.ndarray, n: int, force_sweep: bool) -> tuple[np.ndarray, float]:
    """Exact output law and acceptance of OTSelection over all n-tuples of q's support (float64)."""
    sel = ot_selection(p, q, n, force_sweep=force_sweep)
    support = np.flatnonzero(q > 0)
    drafts = np.array(list(itertools.product(support, repeat=n))).reshape(-1, n)
    weights = q[drafts].prod(1)
    accept, residual = sel.node_law(drafts)
    out = weights @ residual
    np.add.at(out, drafts.ravel(), (weights[:, None] * accept).ravel())
    return out, float(weights @ accept.sum(1))


@pytest.mark.parametrize("force_sweep", [False, True], ids=["closed-form", "sweep"])
def test_output_is_p_and_acceptance_is_optimal(force_sweep):
    cases = random_instances(220, seed=14) + edge_instances()
    for label, p, q, n in cases:
        out, acc = enumerate_law(p, q, n, force_sweep)
        best = optimal_acceptance(p, q, n)
        assert np.abs(out - p).max() < TOL, f"{label} n={n}: max |out − p| = {np.abs(out - p).max():.3g}"
        assert abs(acc - best) < TOL, f"{label} n={n}: acceptance {acc} vs α* {best}"


def test_spec_exact_and_closed_form_match_the_optimum():
    for label, p, q, n in random_instances(40, seed=5) + edge_instances():
        out, acc = SPEC.exact(torch.from_numpy(p), torch.from_numpy(q), n)  # production law, enumerated
        assert float((out - torch.from_numpy(p)).abs().max()) < TOL, label
        best = verifier_optimum("ot", p, q, n)
        assert acc == pytest.approx(best, abs=TOL), label
        assert verifier_acceptance("ot", p, q, n).value == pytest.approx(best, abs=TOL), label


def test_selection_law_is_feasible_and_optimal():
    """r <= p on A, r >= p on H, Σ r = 1, and r(S) <= 1 − (1 − q(S))^n on every subset S (Hall's condition)."""
    for label, p, q, n in random_instances(60, seed=9):
        r, order, k = selection_law(p, q, n)
        assert r.sum() == pytest.approx(1.0, abs=1e-12) and np.all(r[q == 0] == 0)
        assert np.all(r[order[:k]] <= p[order[:k]] + 1e-12) and np.all(r[order[k:]] >= p[order[k:]] - 1e-12)
        for size in range(1, p.size + 1):
            for s in itertools.combinations(range(p.size), size):
                assert r[list(s)].sum() <= 1 - (1 - q[list(s)].sum()) ** n + 1e-12, label
        assert np.minimum(p, r).sum() == pytest.approx(optimal_acceptance(p, q, n), abs=TOL)


def test_larger_vocabulary_realizes_the_selection_law():
    """V = 2,000 LLM-like pair: the pieces tile [0, 1] and realize r; the closed form and the sweep agree."""
    rng = np.random.default_rng(0)
    v = 2000
    logits = -1.1 * np.log(np.arange(1, v + 1)) + rng.normal(0, 1, v)
    p = np.exp(logits - logits.max())
    q = np.exp(logits + rng.normal(0, 0.7, v) - logits.max())
    p, q = p / p.sum(), q / q.sum()
    for n in (2, 4):
        fast = ot_selection(p, q, n)
        assert np.abs(fast.piece_lengths() - q).max() < 1e-12 and (fast.hi - fast.lo).min() >= 0
        assert fast.acceptance == pytest.approx(optimal_acceptance(p, q, n), abs=1e-9)
        drafts = rng.choice(v, size=(200, n), p=q)
        assert np.abs(fast.select_probs(drafts).sum(1) - 1).max() < 1e-9
    small = np.argsort(-q)[:40]  # the sweep is O(V^2): check it on a truncated pair
    p2, q2 = p[small] / p[small].sum(), q[small] / q[small].sum()
    a, b = ot_selection(p2, q2, 3), ot_selection(p2, q2, 3, force_sweep=True)
    assert np.abs(a.r - b.r).max() < 1e-12
    assert a.acceptance == pytest.approx(optimal_acceptance(p2, q2, 3), abs=1e-9)


def test_measured_acceptance_is_within_monte_carlo_error():
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet([0.5] * 50), rng.dirichlet([0.5] * 50)
    est = ot_measured_acceptance(p, q, 3, samples=4000, generator=torch.Generator().manual_seed(0))
    assert abs(est.value - optimal_acceptance(p, q, 3)) <= 4 * est.stderr


def test_ot_beats_rrs_and_kseq():
    for label, p, q, n in random_instances(40, seed=21):
        if n < 2:
            continue
        ot = verifier_acceptance("ot", p, q, n).value
        assert ot >= verifier_acceptance("rrs", p, q, n).value - 1e-12, label
        assert ot >= verifier_acceptance("kseq", p, q, n).value - 1e-12, label


def test_no_plan_and_bad_shapes():
    with pytest.raises(MultispecError, match="no Plan"):
        SPEC.plan(_t([[0.5, 0.5]]), _t([[0.5, 0.5]]), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(MultispecError):
        SPEC.law(_t([[0.5, 0.5]]), _t([[0.5, 0.5, 0.0]]), torch.zeros(1, 2, dtype=torch.long))


# ----------------------------------------------------------------------------------- broken variant
class UniformPickOT(OTVerifierSpec):
    """BROKEN: picks a uniformly random draft but still corrects with the optimal r (not the law it picks)."""

    def law(self, p, q, drafts):
        node = super().law(p, q, drafts)
        d = drafts.numpy()
        sel = ot_selection(p[0], q[0], d.shape[1])
        accept = np.minimum(1.0, sel.p[d] / np.maximum(sel.r[d], 1e-300)) / d.shape[1]
        accept = torch.from_numpy(accept).to(p.dtype)
        residual = node.residual / node.residual.sum(-1, keepdim=True).clamp_min(1e-300)
        return dataclasses.replace(node, accept=accept, residual=(1 - accept.sum(-1, keepdim=True)) * residual)


BROKEN = UniformPickOT(**{f.name: getattr(SPEC, f.name) for f in dataclasses.fields(SPEC)})
ROW = (_t([0.1, 0.2, 0.3, 0.4]), _t([0.4, 0.3, 0.2, 0.1]), 3)


def test_exact_check_catches_the_broken_variant():
    p, q, n = ROW
    out, _ = BROKEN.exact(p, q, n)
    assert float((out - p).abs().max()) > 1e-2
    out, _ = SPEC.exact(p, q, n)
    assert float((out - p).abs().max()) < TOL


def test_sampled_check_passes_ot_and_catches_the_broken_variant():
    p, q, n = ROW
    pvalue, z = sampled_check(SPEC, p, q, n, trials=40_000, seed=3)
    assert pvalue >= ALPHA and z <= 4
    pvalue, _ = sampled_check(BROKEN, p, q, n, trials=40_000, seed=3)
    assert pvalue < ALPHA
