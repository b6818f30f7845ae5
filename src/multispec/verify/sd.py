"""Single-draft speculative sampling (design §2.1): accept x ~ q with probability min(1, p(x)/q(x)),
otherwise draw from norm((p - q)_+). p is the target, q the draft."""
from __future__ import annotations

import torch

from multispec.verify.base import Plan, VerifierSpec, draw_iid, gather, law_iid, normalize_or


def plan_sd(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    """p: target float [B, V]; q: draft float [B, V]; drafts: long [B, 1] drawn from q."""
    x = drafts[:, 0]
    residual = normalize_or((p - q).clamp_min(0), p)
    return Plan((0,), gather(p, x)[:, None], gather(q, x)[:, None], residual)


SPEC = VerifierSpec(
    name="sd",
    description="single-draft speculative sampling (Leviathan/Chen): accept min(1, p/q), else residual (p-q)+",
    lossless=True,
    drafts=1,
    draw_fn=draw_iid,
    plan_fn=plan_sd,
    law_fn=law_iid,
    draft_law="one draft from q",
)
