"""A draft output layer over a subset S of the vocabulary (FR-Spec, 2025; SGLang's --speculative-token-map).

A small draft spends much of its step in the output layer ([V, H] for one row of logits). Restricted to S (the N
most frequent tokens of a calibration text, see token_freq.py, plus the prompt's tokens), the layer is a [|S|, H]
matmul over rows gathered once per subset. Logits come back at full width V with -inf outside S, so the draft law
q = softmax(logits) (after the sampling transforms) is exactly the law the draft samples from, renormalised over
S, with q = 0 outside S: every verifier runs unchanged and the output law still depends on the target alone.

Backends take a subset with `set_vocab_subset(ids)` (fast and hf backends; None restores the full layer) and grow
it with `extend_vocab_subset(ids)` (a float gather of |S| rows: cheap enough to add, between rounds, the tokens a
generation has produced). Scattering [N, |S|] into [N, V] costs 8 us for one row and 27 us for eight at |S| = 1k,
0.5-1.5% of a small draft's step (benchmarks/results/cheap_draft/steps.md), so full width is what they return.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multispec.errors import check
from multispec.models.int8 import QuantLinear, PackedInt8, float_bias, float_weight, is_int8


def subset_ids(ids, vocab_size: int) -> torch.Tensor:
    """ids (any int sequence or tensor) as sorted unique long [K]; refused in one line when empty or out of
    range [0, vocab_size)."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten().unique()  # sorted
    check(ids.numel() >= 1, "a draft vocabulary subset needs at least one token id")
    check(int(ids[0]) >= 0 and int(ids[-1]) < vocab_size,
          f"draft vocabulary ids must lie in [0, {vocab_size}); got {int(ids[0])}..{int(ids[-1])}")
    return ids


class HeadRows:
    """The rows of an output layer, ready to gather: its float weight [V, H] (+ bias). An int8 layer's rows are
    dequantized once (the int8 values times their row scales): a subset head of a few thousand rows is as fast in
    float32 as in int8 (benchmarks/results/cheap_draft/steps.md), and a float gather makes growing S cheap, where
    int8 rows would be packed again on every change."""

    @classmethod
    def of(cls, head: torch.nn.Module) -> "HeadRows":
        """The layer's HeadRows, made on first use and kept on the layer (as FastNet is kept on its model): reading
        an int8 layer's rows out of its packed form takes ~20 ms, once per draft rather than once per request."""
        rows = head.__dict__.get("_multispec_head_rows")
        device = torch.device("cpu") if is_int8(head) else head.weight.device  # int8 layers run on CPU only
        if rows is None or rows.weight.device != device:
            rows = cls(head)
            head.__dict__["_multispec_head_rows"] = rows
        return rows

    def __init__(self, head: torch.nn.Module):
        self.weight, self.bias = float_weight(head), float_bias(head)  # [V, H] float32 (int8: dequantized), [V]
        self.int8 = isinstance(head, QuantLinear)  # a quantized target's layer: subsets multiply in int8 too

    def gather(self, ids: torch.Tensor):
        """(rows [K, H], bias [K] or None) for ids: long [K]."""
        bias = None if self.bias is None else self.bias.index_select(0, ids)
        return self.weight.index_select(0, ids).contiguous(), bias


class RestrictedHead:
    """The output layer on the rows S of the vocabulary. ids: long [K] sorted; the layer's rows for them are
    gathered once, so the logits on S are the full layer's (an int8 layer's within its activation rounding: the
    subset multiplies its int8-valued rows in float32).

    The rows of an int8 target's layer (models/int8.py quantize_target: an EAGLE head drafting for it) are packed
    in int8 again (a quarter of the bytes to read per drafted token: SmolLM2's 8,192-row head layer 2.6 -> ~0.4 ms);
    rows added by `extend` are multiplied in float32 beside them until there are REPACK of them."""

    REPACK = 1024

    def __init__(self, head: torch.nn.Module | HeadRows, ids, vocab_size: int, packed: tuple | None = None):
        self.source = head if isinstance(head, HeadRows) else HeadRows.of(head)
        self.vocab_size = vocab_size
        self.ids = subset_ids(ids, vocab_size).to(self.source.weight.device)
        self.size = int(self.ids.numel())
        self.weight, self.bias = self.source.gather(self.ids)  # [K, H], [K] or None
        self._members: set[int] | None = None  # S as a Python set, made on the first extend
        self.packed = None  # (PackedInt8 of the first n rows, n): an int8 source only
        if self.source.int8:
            fresh = packed is None or self.size - packed[1] > self.REPACK
            self.packed = (PackedInt8([self.weight], [self.bias]), self.size) if fresh else packed

    def extend(self, ids) -> "RestrictedHead":
        """This subset plus `ids` (a gather of the rows of S ∪ ids), or self when they are all in S already (a set
        lookup: the engine calls this every round with the committed tokens)."""
        if self._members is None:
            self._members = set(self.ids.tolist())
        values = ids.flatten().tolist() if isinstance(ids, torch.Tensor) else list(ids)
        new = [i for i in map(int, values) if i not in self._members]
        if not new:
            return self
        return RestrictedHead(self.source, torch.cat([self.ids, subset_ids(new, self.vocab_size).to(self.ids.device)]),
                              self.vocab_size, self.packed)  # S's ids first: their packed rows carry over

    def compact(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, H] (the output layer's input) -> logits [N, K] in the layer's dtype, before the model's own
        final transforms."""
        if self.packed is None:
            return F.linear(hidden, self.weight, self.bias)
        packed, n = self.packed
        flat = hidden.reshape(-1, hidden.shape[-1]).float()
        out = packed.apply(flat)
        if n < self.size:
            out = torch.cat([out, F.linear(flat, self.weight[n:], None if self.bias is None else self.bias[n:])], -1)
        return out.reshape(*hidden.shape[:-1], self.size)

    def widen(self, compact: torch.Tensor) -> torch.Tensor:
        """compact: [N, K] -> float32 [N, V], -inf outside S."""
        out = torch.full((compact.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32,
                         device=compact.device)
        return out.index_copy_(1, self.ids, compact.float())

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Full logits [N, V] -> float32 [N, V] kept on S, -inf elsewhere (for paths that computed every row)."""
        return self.widen(logits.index_select(1, self.ids))


class VocabSubset:
    """A backend's reduced output layer (mixin): `vocab_subset`, a RestrictedHead or None (the full layer), set with
    `set_vocab_subset` and grown with `extend_vocab_subset`. A backend gives `_full_head()` (its output layer) and
    may refuse in `_check_vocab_subset()`."""

    vocab_subset = None

    @property
    def cost_key(self) -> str:
        """Part of auto's cost-cache key (drafting/costs.model_key): a reduced layer's steps cost less than the full
        one's, so its size (to the next power of two) keeps their calibrations apart."""
        return "" if self.vocab_subset is None else f"vocab{1 << (self.vocab_subset.size - 1).bit_length()}"

    def _full_head(self) -> torch.nn.Module:
        raise NotImplementedError

    def _check_vocab_subset(self) -> None:
        """Raise MultispecError where this backend cannot restrict its output layer."""

    def set_vocab_subset(self, ids) -> None:
        """Restrict the output layer to token ids `ids` (long [K], any order; None: the full layer again). Logits
        stay [N, V], -inf outside the subset."""
        if ids is None:
            self.vocab_subset = None
            return
        self._check_vocab_subset()
        rows = self._full_head() if self.vocab_subset is None else self.vocab_subset.source  # read out once
        self.vocab_subset = RestrictedHead(rows, ids, self.vocab_size)

    def extend_vocab_subset(self, ids) -> None:
        """Add token ids `ids` (long [K]) to the subset (a gather of its rows, ~0.3 ms for 1k rows; none when
        nothing is new); a no-op for the full vocabulary. Call between rounds (a round's q must be the law it was
        drafted from)."""
        if self.vocab_subset is not None:
            self.vocab_subset = self.vocab_subset.extend(ids)
