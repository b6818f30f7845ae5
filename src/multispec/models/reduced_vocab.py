"""A draft output layer over a subset S of the vocabulary (FR-Spec, 2025; SGLang's --speculative-token-map).

A small draft spends much of its step in the output layer ([V, H] for one row of logits). Restricted to S (the N
most frequent tokens of a calibration text, see token_freq.py, plus the prompt's tokens), the layer is a [|S|, H]
matmul over rows gathered once per subset. Logits come back at full width V with -inf outside S, so the draft law
q = softmax(logits) (after the sampling transforms) is exactly the law the draft samples from, renormalised over
S, with q = 0 outside S: every verifier runs unchanged and the output law still depends on the target alone.

Backends take a subset with `set_vocab_subset(ids)` (fast and hf backends; None restores the full layer).
Scattering [N, |S|] into [N, V] costs a few microseconds per step (benchmarks/results/cheap_draft/steps.md), so
full width is what they return.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multispec.errors import check
from multispec.models.int8 import is_int8


def subset_ids(ids, vocab_size: int) -> torch.Tensor:
    """ids (any int sequence or tensor) as sorted unique long [K]; refused in one line when empty or out of
    range [0, vocab_size)."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten().unique()  # sorted
    check(ids.numel() >= 1, "a draft vocabulary subset needs at least one token id")
    check(int(ids[0]) >= 0 and int(ids[-1]) < vocab_size,
          f"draft vocabulary ids must lie in [0, {vocab_size}); got {int(ids[0])}..{int(ids[-1])}")
    return ids


class RestrictedHead:
    """The output layer on the rows S of the vocabulary. ids: long [K] sorted; the layer's rows for them are
    gathered here, once (float rows, or int8 rows with their own scales for an int8 head, so the logits on S are
    exactly the full layer's)."""

    def __init__(self, head: torch.nn.Module, ids, vocab_size: int):
        self.vocab_size = vocab_size
        self.ids = subset_ids(ids, vocab_size)
        self.size = int(self.ids.numel())
        if is_int8(head):
            from torch.ao.nn.quantized.dynamic import Linear

            w = head.weight()  # quantized [V, H], per-row scales
            ids = self.ids.to(w.device)
            rows = torch.quantize_per_channel(w.dequantize().index_select(0, ids),
                                              w.q_per_channel_scales().index_select(0, ids),
                                              w.q_per_channel_zero_points().index_select(0, ids), 0, torch.qint8)
            bias = head.bias()
            self.int8 = Linear(head.in_features, self.size, bias_=bias is not None, dtype=torch.qint8)
            self.int8.set_weight_bias(rows, None if bias is None else bias.index_select(0, ids))
            self.weight = self.bias = None
        else:
            self.int8 = None
            ids = self.ids.to(head.weight.device)
            self.weight = head.weight.detach().index_select(0, ids).contiguous()  # [K, H]
            bias = getattr(head, "bias", None)
            self.bias = None if bias is None else bias.detach().index_select(0, ids)
        self.ids = ids

    def compact(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, H] (the output layer's input) -> logits [N, K] in the layer's dtype, before the model's own
        final transforms."""
        if self.int8 is not None:
            return self.int8(hidden)
        return F.linear(hidden, self.weight, self.bias)

    def widen(self, compact: torch.Tensor) -> torch.Tensor:
        """compact: [N, K] -> float32 [N, V], -inf outside S."""
        out = torch.full((compact.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32,
                         device=compact.device)
        return out.index_copy_(1, self.ids, compact.float())

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Full logits [N, V] -> float32 [N, V] kept on S, -inf elsewhere (for paths that computed every row)."""
        return self.widen(logits.index_select(1, self.ids))
