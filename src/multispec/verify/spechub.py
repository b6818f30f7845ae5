"""SpecHub (n = 2 only; design §4.5).

Hub a = argmax q (lowest index on ties). Draft pair: x_1 ~ q; if x_1 != a then x_2 = a, else x_2 ~ q restricted
to tokens != a. Verification in four stages (pair (i, a) = hub second, pair (a, i) = hub first):
  1. (i, a): accept x_1 = i w.p. min(1, p(i)/q(i));            p1 = (p - q)_+ off a, q_ia_left = (q - p)_+ off a
  2. (a, i): accept x_2 = i w.p. min(1, p1(i)/q_ai(i));        q_ai(i) = q(a) q(i) / (1 - q(a))
  3. (a, i): accept x_1 = a w.p. min(1, p(a)/sum q_ai_left);   q_ai_left = (q_ai - p1)_+
  4. (i, a): accept x_2 = a w.p. min(1, p1(a)/sum q_ia_left);  p1(a) = (p(a) - sum q_ai_left)_+
  else the new token is drawn from norm(p2), p2 = (p1 - q_ai)_+ off a and (p1(a) - sum q_ia_left)_+ at a.
When q(a) = 1 (no mass off the hub) it falls back to single-draft speculative sampling on x_1 = a; x_2 is then a
padding token (the lowest index != a) that is never accepted. p is the target, q the draft.
"""
from __future__ import annotations

import torch

from multispec.errors import check
from multispec.verify.base import Plan, VerifierSpec, gather, normalize_or


def _hub(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q: float [B, V] -> (hub a long [B], q off the hub float [B, V], degenerate bool [B] where q(a) = 1)."""
    a = q.argmax(-1)  # lowest index on ties
    off = q.scatter(1, a[:, None], 0.0)
    return a, off, off.sum(-1) <= 0


def draw_hub(q: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """The SpecHub pair for q: float [B, V]; n must be 2. Returns long [B, 2]."""
    check(n == 2, f"spechub drafts exactly 2 tokens per node, got {n}")
    check(q.shape[1] >= 2, "spechub needs a vocabulary of at least 2 tokens")
    a, off, degenerate = _hub(q)
    pad = (a == 0).long()  # lowest index != a
    x1 = torch.multinomial(q, 1, generator=generator).squeeze(1)
    other = torch.where(degenerate[:, None], torch.nn.functional.one_hot(pad, q.shape[1]).to(q.dtype), off)
    x2 = torch.multinomial(other, 1, generator=generator).squeeze(1)
    x1 = torch.where(degenerate, a, x1)
    x2 = torch.where(x1 == a, x2, a)
    return torch.stack([x1, x2], 1)


def law_hub(q: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact law of `draw_hub` for one q: float [V]: ordered pairs long [M, 2], weights float [M]."""
    check(n == 2, f"spechub drafts exactly 2 tokens per node, got {n}")
    q = q / q.sum()
    a_row, off, degenerate = (t[0] for t in _hub(q[None]))
    a = int(a_row)
    if bool(degenerate):
        return torch.tensor([[a, 1 if a == 0 else 0]]), torch.ones(1, dtype=q.dtype)
    rest = float(off.sum())
    pairs, weights = [], []
    for i in range(q.shape[0]):
        if i != a and q[i] > 0:
            pairs += [[i, a], [a, i]]
            weights += [float(q[i]), float(q[a]) * float(q[i]) / rest]
    return torch.tensor(pairs), torch.tensor(weights, dtype=q.dtype)


def plan_spechub(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    """p: target float [B, V]; q: draft float [B, V]; drafts: long [B, 2] drawn with `draw_hub`."""
    q = q / q.sum(-1, keepdim=True)
    a, q_off, degenerate = _hub(q)
    x1, x2 = drafts[:, 0], drafts[:, 1]
    hub_first = x1 == a  # pair (a, i); otherwise pair (i, a)
    qa, pa = gather(q, a), gather(p, a)
    rest = q_off.sum(-1)
    q_ai = qa[:, None] * q_off / torch.where(degenerate, torch.ones_like(rest), rest)[:, None]  # [B, V], 0 at a
    p_off = p.scatter(1, a[:, None], 0.0)
    p1 = (p_off - q_off).clamp_min(0)
    q_ia_left = (q_off - p_off).clamp_min(0).sum(-1)  # [B]
    p2 = (p1 - q_ai).clamp_min(0)
    q_ai_left = (q_ai - p1).clamp_min(0).sum(-1)  # [B]
    p1_a = (pa - q_ai_left).clamp_min(0)
    p2_a = (p1_a - q_ia_left).clamp_min(0)
    zero, one = torch.zeros_like(pa), torch.ones_like(pa)
    num = torch.stack([
        torch.where(degenerate, pa, torch.where(hub_first, zero, gather(p, x1))),  # 1: (i, a) accepts x_1 = i
        torch.where(hub_first & ~degenerate, gather(p1, x2), zero),  # 2: (a, i) accepts x_2 = i
        torch.where(hub_first & ~degenerate, pa, zero),  # 3: (a, i) accepts x_1 = a
        torch.where(hub_first, zero, p1_a),  # 4: (i, a) accepts x_2 = a
    ], 1)  # [B, 4]
    den = torch.stack([
        torch.where(degenerate, qa, torch.where(hub_first, one, gather(q, x1))),
        torch.where(hub_first, gather(q_ai, x2), one),
        torch.where(hub_first, q_ai_left, one),
        torch.where(hub_first, one, q_ia_left),
    ], 1)  # [B, 4]
    final = p2.scatter(1, a[:, None], p2_a[:, None])  # [B, V]
    single = normalize_or((p - q).clamp_min(0), p)
    residual = torch.where(degenerate[:, None], single, normalize_or(final, p))
    return Plan((0, 1, 0, 1), num, den, residual)


SPEC = VerifierSpec(
    name="spechub",
    description="SpecHub: 2 drafts sharing the hub argmax q; optimal acceptance for its draft law",
    lossless=True,
    drafts=2,
    draw_fn=draw_hub,
    plan_fn=plan_spechub,
    law_fn=law_hub,
    draft_law="hub pair: x1 ~ q, x2 = hub (argmax q) or, if x1 is the hub, x2 ~ q off the hub",
)
