"""K-SEQ (SpecTr; design §4.4). Drafts i.i.d. from q; not valid for drafts without replacement.

With beta(rho) = sum_x min(q(x), p(x)/rho) and kappa(rho) = sum_{j<n} (1 - beta)^j, rho is the smallest
value in [1, n] with rho >= kappa(rho), found per row (breakpoints p/q, then bisection). Draft i is accepted w.p.
min(1, p(x_i)/(rho q(x_i))); if all are rejected, the new token is drawn from norm(p - kappa min(q, p/rho)).
Acceptance = 1 - (1 - beta(rho))^n. p is the target, q the draft.
"""
from __future__ import annotations

import numpy as np
import torch

from multispec.verify.base import Plan, VerifierSpec, draw_iid, gather, law_iid, normalize_or

BISECTION_STEPS = 64
ONE_TOL = 1e-12  # rho = 1 is taken when kappa(1) <= 1 + tol: p = q must give rho = 1 despite rounding


def kseq_beta(p: torch.Tensor, q: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """beta(rho) = sum_x min(q, p/rho). p, q: float [B, V]; rho: float [B]. Returns float [B]."""
    return torch.minimum(q, p / rho[:, None]).sum(-1)


def kseq_kappa(beta: torch.Tensor, n: int) -> torch.Tensor:
    """kappa = sum_{j<n} (1 - beta)^j = (1 - (1 - beta)^n) / beta, defined at beta = 0 too. float [B]."""
    return sum((1 - beta) ** j for j in range(n)) + torch.zeros_like(beta)


def kseq_rho(p: torch.Tensor, q: torch.Tensor, n: int) -> torch.Tensor:
    """The smallest valid rho per row, to float64 precision. p, q: float [B, V]. Returns float [B] (p's dtype).

    beta(rho) = A + B/rho between consecutive breakpoints rho = p(x)/q(x), with A the q-mass of tokens whose
    breakpoint is above rho and B the p-mass of the others. The test rho >= kappa(beta(rho)) is evaluated at
    every breakpoint in [1, n] and at 1 and n (a fixed number of [B, V] tensor ops; rho = n is always valid);
    the first valid point is then refined by bisection inside its segment on host float64 scalars.
    """
    b, v = p.shape
    p64, q64 = p.double(), q.double()
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=p.device)
    ratio = torch.where(q64 > 0, p64 / torch.where(q64 > 0, q64, torch.ones_like(q64)), inf)  # [B, V]
    ratio, order = ratio.sort(-1)
    q_sorted, p_sorted = q64.gather(1, order), p64.gather(1, order)
    zero = torch.zeros(b, 1, dtype=torch.float64, device=p.device)
    above_q = torch.cat([q_sorted.flip(-1).cumsum(-1).flip(-1), zero], 1)  # [B, V+1]: q-mass of sorted j >= k
    below_p = torch.cat([zero, p_sorted.cumsum(-1)], 1)  # [B, V+1]: p-mass of sorted j < k
    ends = torch.tensor([1.0, float(n)], dtype=torch.float64, device=p.device).expand(b, 2)
    points = torch.cat([ends, ratio.clamp(1, n)], 1)  # [B, V+2] candidate values of rho
    count = torch.searchsorted(ratio, points.contiguous(), right=True)  # [B, V+2]: breakpoints <= point
    beta = above_q.gather(1, count) + below_p.gather(1, count) / points
    kappa = kseq_kappa(beta, n)
    valid = (points >= kappa) | ((points == 1) & (kappa <= 1 + ONE_TOL))
    hi = torch.where(valid, points, inf).amin(-1)  # [B], <= n
    lo = torch.where(points < hi[:, None], points, -inf).amax(-1)  # [B], -inf when hi == 1
    seg = torch.searchsorted(ratio, lo.clamp_min(1)[:, None].contiguous(), right=True)  # [B, 1]
    a_seg, b_seg = above_q.gather(1, seg)[:, 0], below_p.gather(1, seg)[:, 0]
    rho = _refine(lo.cpu().numpy(), hi.cpu().numpy(), a_seg.cpu().numpy(), b_seg.cpu().numpy(), n)  # host sync
    return torch.from_numpy(rho).to(dtype=p.dtype, device=p.device)


def _refine(lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Bisection of rho >= kappa(a + b/rho) on (lo, hi], lo invalid (or -inf: hi is 1) and hi valid.
    All float64 [B]; returns hi, always valid."""
    if lo.shape[0] <= 4:  # a tree walk: plain floats are ~10x faster than numpy on tiny arrays
        return np.array([_refine_one(*row, n) for row in zip(lo.tolist(), hi.tolist(), a.tolist(), b.tolist())])
    lo, hi = lo.copy(), hi.copy()
    active = np.isfinite(lo)
    if not active.any():
        return hi
    lo, hi_a, a, b = lo[active], hi[active], a[active], b[active]
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi_a) / 2
        left = 1 - (a + b / mid)
        ok = mid >= sum(left**j for j in range(n))
        hi_a = np.where(ok, mid, hi_a)
        lo = np.where(ok, lo, mid)
    hi[active] = hi_a
    return hi


def _refine_one(lo: float, hi: float, a: float, b: float, n: int) -> float:
    """`_refine` for one row, on Python floats."""
    if lo == float("-inf"):
        return hi
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        left = 1 - (a + b / mid)
        if mid >= sum(left**j for j in range(n)):
            hi = mid
        else:
            lo = mid
    return hi


def plan_kseq(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    """p: target float [B, V]; q: draft float [B, V]; drafts: long [B, n], i.i.d. from q.

    rho, kappa and the residual are computed in float64 (the residual is returned in p's dtype), so that the
    validity rho >= kappa(rho) survives rounding; num/den stay float64.
    """
    n = drafts.shape[1]
    p64, q64 = p.double(), q.double()
    rho = kseq_rho(p64, q64, n)  # [B]
    capped = torch.minimum(q64, p64 / rho[:, None])  # [B, V]
    kappa = kseq_kappa(capped.sum(-1), n)  # [B]
    left = p64 - kappa[:, None] * capped  # [B, V], >= 0 when rho >= kappa
    if bool((left < -1e-9).any()):
        raise RuntimeError("K-SEQ: negative residual, rho < kappa(rho); the bisection returned an invalid rho")
    num = torch.stack([gather(p64, drafts[:, i]) for i in range(n)], 1)  # [B, n]
    den = torch.stack([rho * gather(q64, drafts[:, i]) for i in range(n)], 1)  # [B, n]
    return Plan(tuple(range(n)), num, den, normalize_or(left.clamp_min(0), p64).to(p.dtype))


SPEC = VerifierSpec(
    name="kseq",
    description="K-SEQ (SpecTr): accept min(1, p/(rho q)) per i.i.d. draft, residual p - kappa min(q, p/rho)",
    lossless=True,
    drafts="any",
    draw_fn=draw_iid,
    plan_fn=plan_kseq,
    law_fn=law_iid,
    draft_law="i.i.d. from q",
)
