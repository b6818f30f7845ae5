"""Greedy verification (temperature 0, design §2.3): accept the draft equal to argmax p.

Drafts are the n most probable tokens of q (deterministic, lowest index on ties). The output is argmax p
(lowest index on ties), so it is lossless when p is the processed greedy target, i.e. one-hot (design §1.3).
"""
from __future__ import annotations

import torch

from multispec.verify.base import Plan, VerifierSpec, top_tokens


def draw_top(q: torch.Tensor, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """The top-n tokens of q: float [B, V]. Returns long [B, n]. No randomness (generator unused)."""
    return top_tokens(q, n)


def law_top(q: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact draft law for one q: float [V]: a single tuple, long [1, n], weight float [1]."""
    return top_tokens(q[None], n), torch.ones(1, dtype=q.dtype)


def plan_greedy(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
    """p: target float [B, V] (one-hot at temperature 0); q: draft float [B, V] (unused); drafts: long [B, n].

    Step i accepts draft i iff it equals argmax p; otherwise the new token is argmax p.
    """
    best = p.argmax(-1)  # [B], lowest index on ties
    hit = (drafts == best[:, None]).to(p.dtype)  # [B, n]
    residual = torch.nn.functional.one_hot(best, p.shape[-1]).to(p.dtype)  # [B, V]
    return Plan(tuple(range(drafts.shape[1])), hit, torch.ones_like(hit), residual)


SPEC = VerifierSpec(
    name="greedy",
    description="temperature 0: accept the draft equal to the target argmax, else commit the argmax",
    lossless=True,
    drafts="any",
    draw_fn=draw_top,
    plan_fn=plan_greedy,
    law_fn=law_top,
    draft_law="top-n tokens of q (deterministic)",
)
