"""Acceptance rate of each registered node verifier at one position, and the optimum of its draft law.

p is ALWAYS the target distribution and q the draft distribution (processed, design §1). Exact values come from
closed forms or O(n·V) recursions; RRS without replacement is exact (by enumerating its draft law with the
production plan, `VerifierSpec.exact`) only when the support is small, otherwise Monte Carlo over the drafts
with the production `draw` and `law` (coins replaced by their probabilities), reported with its standard error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from multispec.errors import check
from multispec.optimal.acceptance import (
    check_n,
    check_pair,
    greedy_top,
    optimal_acceptance,
    optimal_acceptance_greedy,
    optimal_acceptance_hub,
)

VERIFIERS = ("sd", "mcns", "rrs", "rrs-wor", "kseq", "spechub", "greedy-md", "greedy", "ot")
EXACT_WOR_TUPLES = 5_000  # enumerate RRS-wor's draft law up to this many ordered tuples
EPS = 1e-12  # residual mass below this keeps the current target (design §1.5, as in verify.base)


@dataclass(frozen=True)
class Estimate:
    """An acceptance rate. stderr is None when exact; ci95 is the 95% normal interval half-width."""

    value: float
    stderr: float | None
    exact: bool
    method: str

    @property
    def ci95(self) -> float | None:
        return None if self.stderr is None else 1.96 * self.stderr


def naive_acceptance(p, q, n: int) -> float:
    """design §4.1 / §11.5 'naive iid': y ~ p accepted iff it is one of n i.i.d. drafts from q.

    p: target float [V]; q: draft float [V]. Returns Σ_y p(y)(1 − (1 − q(y))^n).
    """
    p, q = check_pair(p, q)
    n = check_n(n)
    return float(np.sum(p * -np.expm1(n * np.log1p(-np.minimum(q, 1.0)))))


def rrs_betas(p: np.ndarray, q: np.ndarray, n: int) -> np.ndarray:
    """Per-step accept probabilities of RRS with i.i.d. drafts (design §4.2). float [n].

    The residual sequence p'_{i+1} = norm((p'_i − q)_+) does not depend on the drafted tokens, and given a
    rejection so far draft i ~ q is accepted with probability β_i = Σ min(q, p'_i).
    """
    betas = np.empty(n)
    target = p.copy()
    for i in range(n):
        betas[i] = np.minimum(q, target).sum()
        left = np.maximum(target - q, 0.0)
        mass = left.sum()
        if mass > EPS:
            target = left / mass
    return betas


def kseq_acceptance(p: np.ndarray, q: np.ndarray, n: int) -> tuple[float, float]:
    """K-SEQ acceptance 1 − (1 − β(ρ*))^n and ρ*, with ρ* from the production bisection (design §4.4)."""
    from multispec.verify.kseq import kseq_beta, kseq_rho

    pt, qt = torch.from_numpy(p)[None], torch.from_numpy(q)[None]  # [1, V] float64
    rho = kseq_rho(pt, qt, n)
    beta = float(kseq_beta(pt, qt, rho)[0])
    return 1.0 - (1.0 - beta) ** n, float(rho[0])


def spechub_acceptance(p: np.ndarray, q: np.ndarray) -> float:
    """SpecHub's acceptance summed stage by stage (design §4.5), O(V). p: target [V]; q: draft [V]."""
    a = int(np.argmax(q))  # lowest index on ties, as verify.spechub
    qa, pa = q[a], p[a]
    q_off, p_off = q.copy(), p.copy()
    q_off[a] = p_off[a] = 0.0
    rest = q_off.sum()
    if rest <= 0:  # q(a) = 1: the pair is (a, pad); only a can be accepted, as a single draft
        return float(min(pa, 1.0))
    q_ai = qa * q_off / rest
    p1 = np.maximum(p_off - q_off, 0.0)
    stage1 = np.minimum(p_off, q_off).sum()  # pairs (i, a): accept i
    stage2 = np.minimum(p1, q_ai).sum()  # pairs (a, i): accept i against p1
    q_ai_left = np.maximum(q_ai - p1, 0.0).sum()
    q_ia_left = np.maximum(q_off - p_off, 0.0).sum()
    stage3 = min(pa, q_ai_left)  # pairs (a, i): accept a
    stage4 = min(max(pa - q_ai_left, 0.0), q_ia_left)  # pairs (i, a): accept a with what is left
    return float(stage1 + stage2 + stage3 + stage4)


def rrs_wor_acceptance(p: np.ndarray, q: np.ndarray, n: int, samples: int = 4096,
                       generator: torch.Generator | None = None) -> Estimate:
    """RRS without replacement (design §4.3): exact by enumeration when small, else Monte Carlo over drafts."""
    from multispec.verify import REGISTRY

    spec = REGISTRY["rrs-wor"]
    keep = (p > 0) | (q > 0)  # tokens with p = q = 0 play no part
    pk, qk = torch.from_numpy(p[keep]), torch.from_numpy(q[keep])
    m = int(np.count_nonzero(q > 0))
    if math.perm(m, min(n, m)) <= EXACT_WOR_TUPLES:
        _, value = spec.exact(pk, qk, n)
        return Estimate(value, None, True, "exact: draft law enumerated, production plan")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    drafts = spec.draw(qk.expand(samples, -1), n, generator)  # [S, n]
    law = spec.law(pk.expand(samples, -1), qk.expand(samples, -1), drafts)  # coins -> probabilities
    acc = law.acceptance.double()
    return Estimate(float(acc.mean()), float(acc.std() / math.sqrt(samples)), False,
                    f"monte carlo: {samples} draft tuples, production draw/plan, coins exact")


def ot_measured_acceptance(p: np.ndarray, q: np.ndarray, n: int, samples: int = 4096,
                           generator: torch.Generator | None = None) -> Estimate:
    """`ot` measured: Monte Carlo over i.i.d. draft tuples from q, the production law per tuple (coins exact)."""
    from multispec.verify.ot import ot_selection

    sel = ot_selection(p, q, n)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(torch.from_numpy(q), samples * n, replacement=True, generator=generator)
    acc = np.array([sel.node_law(d)[0].sum() for d in drafts.view(samples, n).numpy()])
    return Estimate(float(acc.mean()), float(acc.std(ddof=1) / math.sqrt(samples)) if samples > 1 else 0.0,
                    False, f"monte carlo: {samples} draft tuples, production law of ot")


def verifier_acceptance(name: str, p, q, n: int, samples: int = 4096,
                        generator: torch.Generator | None = None) -> Estimate:
    """Acceptance rate (P(output token is a draft)) of registry verifier `name` at one position.

    p: target float [V]; q: draft float [V] (numpy or torch); n: drafts per node (sd: 1, spechub: 2).
    samples, generator: only used for Monte Carlo (rrs-wor on a large support). Returns an Estimate.
    """
    check(name in VERIFIERS, f"unknown verifier {name!r}; valid names: {', '.join(VERIFIERS)}")
    p, q = check_pair(p, q)
    n = check_n(n)
    if name == "sd":
        check(n == 1, f"verifier 'sd' takes exactly 1 draft, got n = {n}")
        return Estimate(float(np.minimum(p, q).sum()), None, True, "closed form: Σ min(p, q)")
    if name == "mcns":
        beta = float(np.minimum(p, q).sum())
        return Estimate(1.0 - (1.0 - beta) ** n, None, True, "closed form: 1 − (1 − Σ min(p, q))^n (LOSSY)")
    if name == "rrs":
        betas = rrs_betas(p, q, n)
        return Estimate(float(1.0 - np.prod(1.0 - betas)), None, True, "recursion: 1 − Π(1 − β_i)")
    if name == "kseq":
        value, rho = kseq_acceptance(p, q, n)
        return Estimate(value, None, True, f"closed form: 1 − (1 − β(ρ*))^n, ρ* = {rho:.6f}")
    if name == "spechub":
        check(n == 2, f"verifier 'spechub' takes exactly 2 drafts, got n = {n}")
        return Estimate(spechub_acceptance(p, q), None, True, "closed form: sum of the 4 stages")
    if name == "greedy-md":
        check(n <= p.size, f"greedy-md needs n <= vocabulary size {p.size}, got n = {n}")
        return Estimate(optimal_acceptance_greedy(p, q, n), None, True,
                        "closed form: p(T) + Σ_{y∉T} min(p, q_T)")
    if name == "ot":
        from multispec.verify.ot import ot_selection

        return Estimate(ot_selection(p, q, n).acceptance, None, True,
                        "closed form: Σ min(p, r), r the realized selection law")
    if name == "greedy":
        check(n <= p.size, f"greedy needs n <= vocabulary size {p.size}, got n = {n}")
        hit = int(np.argmax(p)) in set(greedy_top(q, n).tolist())
        return Estimate(float(hit), None, True, "exact: argmax p among the top-n of q")
    check(n <= int(np.count_nonzero(q > 0)),
          f"rrs-wor needs at least n = {n} tokens with q > 0, q has {int(np.count_nonzero(q > 0))}")
    return rrs_wor_acceptance(p, q, n, samples, generator)


def verifier_optimum(name: str, p, q, n: int) -> float | None:
    """Optimal acceptance of the draft law that verifier `name` uses (None for the lossy mcns).

    sd: n = 1 (1 − TV); rrs, kseq, ot: i.i.d.; rrs-wor: without replacement; spechub: hub pair;
    greedy-md: P3 greedy drafts; greedy: deterministic top-n drafts, p(top-n of q).
    """
    check(name in VERIFIERS, f"unknown verifier {name!r}; valid names: {', '.join(VERIFIERS)}")
    if name == "mcns":
        return None
    if name == "sd":
        return optimal_acceptance(p, q, 1)
    if name in ("rrs", "kseq", "ot"):
        return optimal_acceptance(p, q, n, replacement=True)
    if name == "rrs-wor":
        return optimal_acceptance(p, q, n, replacement=False)
    if name == "spechub":
        return optimal_acceptance_hub(p, q)
    if name == "greedy-md":
        return optimal_acceptance_greedy(p, q, n)
    p, q = check_pair(p, q)
    return float(p[greedy_top(q, check_n(n))].sum())
