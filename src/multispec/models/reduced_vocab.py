"""A draft output layer over a subset S of the vocabulary (FR-Spec, 2025; SGLang's --speculative-token-map).

A small draft spends much of its step in the output layer ([V, H] for one row of logits). Restricted to S (the N
most frequent tokens of a calibration text, see token_freq.py, plus the prompt's tokens), the layer is a [|S|, H]
matmul over rows gathered once per subset. Logits come back at full width V with -inf outside S, so the draft law
q = softmax(logits) (after the sampling transforms) is exactly the law the draft samples from, renormalised over
S, with q = 0 outside S: every verifier runs unchanged and the output law still depends on the target alone.

Backends take a subset with `set_vocab_subset(ids)` (fast and hf backends; None restores the full layer) and grow
it with `extend_vocab_subset(ids)` (only the new rows are gathered: cheap enough to add, between rounds, the tokens
a generation has produced).
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


class HeadRows:
    """The rows of an output layer, ready to gather: float weight [V, H] (+ bias), or an int8 layer's int8 rows
    with their per-row scales (read out once; gathering them never dequantizes)."""

    def __init__(self, head: torch.nn.Module):
        if is_int8(head):
            w = head.weight()  # quantized [V, H], per-row scales
            self.int8, self.weight = w.int_repr(), None  # [V, H] int8
            self.scales, self.zero_points = w.q_per_channel_scales(), w.q_per_channel_zero_points()
            self.in_features = int(head.in_features)
            bias = head.bias()
        else:
            self.int8, self.weight = None, head.weight.detach()
            bias = getattr(head, "bias", None)
        self.bias = None if bias is None else bias.detach()

    def gather(self, ids: torch.Tensor):
        """(rows, bias) for ids: float [K, H] or a per-row quantized qint8 [K, H]; bias [K] or None."""
        bias = None if self.bias is None else self.bias.index_select(0, ids)
        if self.int8 is None:
            return self.weight.index_select(0, ids).contiguous(), bias
        rows = torch._make_per_channel_quantized_tensor(self.int8.index_select(0, ids),
                                                        self.scales.index_select(0, ids),
                                                        self.zero_points.index_select(0, ids), 0)
        return rows, bias


class RestrictedHead:
    """The output layer on the rows S of the vocabulary. ids: long [K], sorted (extend appends). The layer's rows
    for them are gathered once (float rows, or int8 rows with their own scales for an int8 layer, so the logits on
    S are exactly the full layer's)."""

    def __init__(self, head: torch.nn.Module | HeadRows, ids, vocab_size: int):
        self.source = head if isinstance(head, HeadRows) else HeadRows(head)
        self.vocab_size = vocab_size
        device = (self.source.weight if self.source.int8 is None else self.source.int8).device
        self.ids = subset_ids(ids, vocab_size).to(device)
        self._build(*self.source.gather(self.ids))

    def _build(self, rows, bias) -> None:
        self.size = int(self.ids.numel())
        if self.source.int8 is None:
            self.weight, self.bias, self.int8 = rows, bias, None
        else:
            from torch.ao.nn.quantized.dynamic import Linear

            self.int8 = Linear(self.source.in_features, self.size, bias_=bias is not None, dtype=torch.qint8)
            self.int8.set_weight_bias(rows, bias)
            self.weight = self.bias = None

    def extend(self, ids) -> "RestrictedHead":
        """This subset plus `ids`: gathers only the rows of ids not yet in S (appended, so ids are no longer
        sorted); self when there are none. For S that grows during a generation (tokens the target produced)."""
        ids = subset_ids(ids, self.vocab_size).to(self.ids.device)
        new = ids[~torch.isin(ids, self.ids)]
        if new.numel() == 0:
            return self
        out = object.__new__(RestrictedHead)
        out.source, out.vocab_size, out.ids = self.source, self.vocab_size, torch.cat([self.ids, new])
        rows, bias = self.source.gather(new)
        if self.int8 is None:
            out._build(torch.cat([self.weight, rows]), None if bias is None else torch.cat([self.bias, bias]))
        else:
            old = self.int8.weight()
            rows = torch._make_per_channel_quantized_tensor(
                torch.cat([old.int_repr(), rows.int_repr()]),
                torch.cat([old.q_per_channel_scales(), rows.q_per_channel_scales()]),
                torch.cat([old.q_per_channel_zero_points(), rows.q_per_channel_zero_points()]), 0)
            old_bias = self.int8.bias()
            out._build(rows, None if bias is None else torch.cat([old_bias, bias]))
        return out

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
