"""Logit processing shared by target and draft: temperature, top-k, top-p.

The processed target distribution is the distribution every lossless method preserves (SPEC §1 conv. 2).
Temperature 0 means greedy: the processed distribution is one-hot on the argmax (lowest index on ties).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multispec.errors import check


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become probabilities. Validated on construction.

    temperature: 0 for greedy, else > 0.  top_k: None or >= 1.  top_p: None or in (0, 1].
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        check(isinstance(t, (int, float)) and not isinstance(t, bool) and t == t, f"temperature must be a number, got {t!r}")
        check(t >= 0, f"temperature must be >= 0 (0 means greedy), got {t}")
        check(t != float("inf"), "temperature must be finite")
        if self.top_k is not None:
            check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= 1, f"top_k must be an integer >= 1, got {self.top_k!r}")
        if self.top_p is not None:
            check(
                isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool) and 0 < self.top_p <= 1,
                f"top_p must be in (0, 1], got {self.top_p!r}",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def process_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Turn raw logits into the processed next-token distribution.

    logits: float [..., V] on any device. Returns float32 [..., V] probabilities summing to 1 on the last axis.
    Greedy returns the one-hot argmax. Top-k keeps the k largest logits (ties at the k-th value are all kept,
    as in transformers); top-p keeps the smallest prefix of the sorted distribution whose mass reaches top_p
    (the token that crosses top_p is kept).
    """
    logits = logits.float()
    if config.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / config.temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if config.top_p is not None and config.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each sorted token
        drop_sorted = mass_before >= config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row. probs: float [..., V]. Returns long [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])
