"""Recursive rejection sampling without replacement (MCSD default; design §4.3).

Drafts: sequential sampling without replacement, x_1 ~ q_1 = q, q_{i+1} = norm(q_i with x_i zeroed).
Verification mirrors the renormalisation: step i accepts x_i with probability min(1, p'(x_i)/q'(x_i)) using
the CURRENT q', the residual p' = norm((p' - q')_+) uses the same q', then x_i is removed from q'. When q' has
no mass left (n > |supp q|) the remaining drafts are padding tokens with q = 0; they are never accepted and
leave p' unchanged, so the new token comes from p'. p is the target, q the draft.
"""
from __future__ import annotations

import torch

from multispec.errors import check
from multispec.sampling import sample_rows
from multispec.verify.base import Plan, VerifierSpec, gather, normalize_or

_PAD_KEY = -1e6  # below any log q + Gumbel key; padding tokens (q = 0) follow in index order


def draw_wor(q: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """n drafts without replacement from q: float [B, V] (Gumbel-top-n, same law as sequential sampling).

    When q has fewer than n tokens with mass, the rest are the lowest-index unused tokens. Returns long [B, n].
    """
    b, v = q.shape
    check(n <= v, f"cannot draw {n} drafts without replacement from a vocabulary of {v} tokens")
    if n == 1 and bool((q.sum(-1) > 0).all()):  # one draft: plain sampling, without V Gumbel keys
        return sample_rows(q, 1, generator)
    u = torch.rand(b, v, generator=generator, dtype=torch.float64, device=q.device).clamp_min(1e-300)
    gumbel = -torch.log(-torch.log(u))  # [B, V]
    pad = _PAD_KEY - torch.arange(v, dtype=torch.float64, device=q.device)  # [V]
    keys = torch.where(q > 0, torch.log(q.double()) + gumbel, pad)
    return keys.topk(n, dim=-1).indices


def law_wor(q: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact law of `draw_wor` for one q: float [V]: ordered tuples long [M, n] with weights float [M]."""
    v = q.shape[0]
    check(n <= v, f"cannot draw {n} drafts without replacement from a vocabulary of {v} tokens")
    qs = (q / q.sum()).tolist()
    tuples: list[list[int]] = []
    weights: list[float] = []

    def extend(prefix: list[int], weight: float) -> None:
        if len(prefix) == n:
            tuples.append(prefix)
            weights.append(weight)
            return
        left = [x for x in range(v) if x not in prefix]
        mass = sum(qs[x] for x in left)
        live = [x for x in left if qs[x] > 0]
        if not live:  # padding: the lowest-index unused token
            extend(prefix + [left[0]], weight)
            return
        for x in live:
            extend(prefix + [x], weight * qs[x] / mass)

    extend([], 1.0)
    return torch.tensor(tuples, dtype=torch.long), torch.tensor(weights, dtype=q.dtype)


def plan_rrs_wor(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    """p: target float [B, V]; q: draft float [B, V]; drafts: long [B, n], drawn with `draw_wor`."""
    target, draft = p, q / q.sum(-1, keepdim=True)
    nums, dens = [], []
    for i in range(drafts.shape[1]):
        x = drafts[:, i]
        qx = gather(draft, x)
        nums.append(torch.where(qx > 0, gather(target, x), torch.zeros_like(qx)))  # padding is never accepted
        dens.append(qx)
        target = normalize_or((target - draft).clamp_min(0), target)  # residual against the CURRENT q'
        draft = draft.scatter(1, x[:, None], 0.0)  # remove x_i and renormalise
        mass = draft.sum(-1, keepdim=True)
        draft = torch.where(mass > 0, draft / torch.where(mass > 0, mass, torch.ones_like(mass)), draft)
    return Plan(tuple(range(drafts.shape[1])), torch.stack(nums, 1), torch.stack(dens, 1), target)


SPEC = VerifierSpec(
    name="rrs-wor",
    description="recursive rejection sampling, drafts without replacement (MCSD default)",
    lossless=True,
    drafts="any",
    draw_fn=draw_wor,
    plan_fn=plan_rrs_wor,
    law_fn=law_wor,
    draft_law="without replacement from q (Gumbel-top-n)",
)
