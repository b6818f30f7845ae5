"""P3 greedy multi-draft (design §4.6): T = top-(n-1) tokens of q, the n-th draft x_n ~ q_T = norm(q off T).

Verification is single-draft speculative sampling with draft q_T: accept x_n w.p. min(1, p(x_n)/q_T(x_n)),
else y ~ norm((p - q_T)_+); a y in T is routed to that draft and counts as acceptance. This is lossless and
reaches the optimal acceptance for its draft law, p(T) + sum_{y not in T} min(p(y), q_T(y)). When q has no mass
off T, x_n is a padding token (the lowest index off T) and the verifier is design §4.1's naive scheme:
y ~ p, accepted if it is a draft. p is the target, q the draft.
"""
from __future__ import annotations

import torch

from multispec.errors import check
from multispec.verify.base import Plan, VerifierSpec, gather, normalize_or, top_tokens


def draw_greedy_md(q: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """Top-(n-1) of q: float [B, V] (lowest index on ties), then one draw from q_T. Returns long [B, n]."""
    check(n <= q.shape[1], f"cannot take {n} distinct drafts from a vocabulary of {q.shape[1]} tokens")
    order = top_tokens(q, n)  # [B, n]; order[:, n-1] is the pad when q has no mass off T
    top = order[:, : n - 1]
    q_t = q.scatter(1, top, 0.0)
    degenerate = q_t.sum(-1, keepdim=True) <= 0
    pad = torch.nn.functional.one_hot(order[:, n - 1], q.shape[1]).to(q.dtype)
    last = torch.multinomial(torch.where(degenerate, pad, q_t), 1, generator=generator)  # [B, 1]
    return torch.cat([top, last], 1)


def law_greedy_md(q: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact law of `draw_greedy_md` for one q: float [V]: tuples long [M, n], weights float [M]."""
    order = top_tokens(q[None], n)[0]
    top = order[: n - 1].tolist()
    q_t = q.clone()
    q_t[top] = 0
    rest = float(q_t.sum())
    if rest <= 0:
        return torch.tensor([top + [int(order[n - 1])]]), torch.ones(1, dtype=q.dtype)
    lasts = [x for x in range(q.shape[0]) if q_t[x] > 0]
    return torch.tensor([top + [x] for x in lasts]), q_t[lasts] / rest


def plan_greedy_md(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    """p: target float [B, V]; q: draft float [B, V]; drafts: long [B, n] drawn with `draw_greedy_md`."""
    n = drafts.shape[1]
    x = drafts[:, n - 1]
    q_t = q.scatter(1, drafts[:, : n - 1], 0.0)  # T is read from the drafts, so drafting and verifying agree
    rest = q_t.sum(-1, keepdim=True)
    degenerate = (rest <= 0).squeeze(1)
    q_t = q_t / torch.where(rest > 0, rest, torch.ones_like(rest))
    num = torch.where(degenerate, torch.zeros_like(rest[:, 0]), gather(p, x))
    den = torch.where(degenerate, torch.ones_like(rest[:, 0]), gather(q_t, x))
    residual = torch.where(degenerate[:, None], p, normalize_or((p - q_t).clamp_min(0), p))
    return Plan((n - 1,), num[:, None], den[:, None], residual, route=True)


SPEC = VerifierSpec(
    name="greedy-md",
    description="P3 greedy multi-draft: top-(n-1) of q plus one draw off them; optimal for its draft law",
    lossless=True,
    drafts="any",
    draw_fn=draw_greedy_md,
    plan_fn=plan_greedy_md,
    law_fn=law_greedy_md,
    draft_law="top-(n-1) of q (deterministic) + one draw from q restricted to the rest",
)
