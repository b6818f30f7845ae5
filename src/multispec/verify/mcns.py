"""MCNS: the naive multi-candidate baseline of our issue tracker. LOSSY for n >= 2.

Each candidate x_i (i.i.d. from q) is accepted with probability min(1, p(x_i)/q(x_i)) against the UNCHANGED
target p (a fresh coin each); the first accepted wins. If all are rejected, the new token is drawn once from
norm((p - q)_+). The residual is not updated after each rejection (unlike RRS, design §4.2), so for n >= 2
the output is biased towards tokens that q over-proposes. Kept as a baseline and as a negative control.

Naming note: design §4.1 calls "naive multi-candidate sampling" a DIFFERENT, lossless scheme (MCSD
`speculative_sampling=False`): draw y ~ p and accept if y is among the drafts. Its acceptance with i.i.d.
drafts is sum_y p(y) (1 - (1 - q(y))^n), the "naive iid" column of design §11.5; `naive_match_acceptance`
computes it. (greedy-md falls back to that scheme when its random draft has no mass, design §4.6.)
"""
from __future__ import annotations

import torch

from multispec.verify.base import Plan, VerifierSpec, draw_iid, gather, law_iid, normalize_or


def plan_mcns(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    """p: target float [B, V]; q: draft float [B, V]; drafts: long [B, n], i.i.d. from q."""
    num = torch.stack([gather(p, drafts[:, i]) for i in range(drafts.shape[1])], 1)  # [B, n]
    den = torch.stack([gather(q, drafts[:, i]) for i in range(drafts.shape[1])], 1)  # [B, n]
    residual = normalize_or((p - q).clamp_min(0), p)
    return Plan(tuple(range(drafts.shape[1])), num, den, residual)


def naive_match_acceptance(p: torch.Tensor, q: torch.Tensor, n: int) -> torch.Tensor:
    """Acceptance of design §4.1's lossless naive scheme (y ~ p, accept if y is one of n i.i.d. drafts from q).

    p: target float [..., V]; q: draft float [..., V]. Returns float [...]: sum_y p(y) (1 - (1 - q(y))^n).
    """
    return (p * (1 - (1 - q) ** n)).sum(-1)


SPEC = VerifierSpec(
    name="mcns",
    description="naive multi-candidate baseline: min(1, p/q) per draft against the unchanged p; lossy for n >= 2",
    lossless=False,
    drafts="any",
    draw_fn=draw_iid,
    plan_fn=plan_mcns,
    law_fn=law_iid,
    draft_law="i.i.d. from q",
)
