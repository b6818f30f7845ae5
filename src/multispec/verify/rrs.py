"""Recursive rejection sampling with replacement (SpecInfer; design §4.2). Drafts i.i.d. from q.

p' = p; for each draft: accept with probability min(1, p'(x_i)/q(x_i)), else p' = norm((p' - q)_+) (q is
not modified); if all are rejected, the new token is drawn from p'. p is the target, q the draft.
"""
from __future__ import annotations

import torch

from multispec.verify.base import Plan, VerifierSpec, draw_iid, gather, law_iid, normalize_or


def plan_rrs(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    """p: target float [B, V]; q: draft float [B, V]; drafts: long [B, n], i.i.d. from q."""
    target = p
    nums, dens = [], []
    for i in range(drafts.shape[1]):
        x = drafts[:, i]
        nums.append(gather(target, x))
        dens.append(gather(q, x))
        target = normalize_or((target - q).clamp_min(0), target)  # the residual after rejecting x_i
    return Plan(tuple(range(drafts.shape[1])), torch.stack(nums, 1), torch.stack(dens, 1), target)


SPEC = VerifierSpec(
    name="rrs",
    description="recursive rejection sampling, i.i.d. drafts (SpecInfer / MCSD replacement=True)",
    lossless=True,
    drafts="any",
    draw_fn=draw_iid,
    plan_fn=plan_rrs,
    law_fn=law_iid,
    draft_law="i.i.d. from q",
)
