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
from multispec.models.int8 import QuantLinear, PackedInt8, float_bias, float_weight


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
    int8 rows would be packed again on every change. A model's sidecar keeps its layer's (ModelSidecar.head_rows):
    reading an int8 layer's rows out of its packed form takes ~20 ms."""

    def __init__(self, head: torch.nn.Module):
        self.layer = head
        self.weight, self.bias = float_weight(head), float_bias(head)  # [V, H] float32 (int8: dequantized), [V]
        self.int8 = isinstance(head, QuantLinear)  # a quantized target's layer: subsets multiply in int8 too

    def gather(self, ids: torch.Tensor):
        """(rows [K, H], bias [K] or None) for ids: long [K]."""
        bias = None if self.bias is None else self.bias.index_select(0, ids)
        return self.weight.index_select(0, ids).contiguous(), bias


class RestrictedHead:
    """The output layer on the rows S of the vocabulary. ids: long [K], the first set's ids sorted, then the ids
    each `extend` added, in that order (the logits' columns follow it); the layer's rows for them are gathered once,
    so the logits on S are the full layer's (an int8 layer's within its activation rounding: the subset multiplies
    its int8-valued rows in float32).

    The rows are held in two parts: the first n (the base) and the rows added by `extend` since (the tail, gathered
    alone, multiplied beside the base), until REPACK of them are added and the base is gathered again. So growing S
    by a few tokens between rounds gathers those rows, not all K (SmolLM2's 8,192-row head layer: a full gather is
    19 MB). An int8 target's layer (models/int8.py quantize_target: an EAGLE head drafting for it) keeps its base
    packed in int8 (a quarter of the bytes to read per drafted token: 2.6 -> ~0.4 ms); `half` keeps a float layer's
    rows in float16 (half_rows_pay). The tail multiplies in float32."""

    REPACK = 1024

    def __init__(self, head: torch.nn.Module | HeadRows, ids, vocab_size: int, half: bool = False,
                 _grown: tuple | None = None):
        self.source = head if isinstance(head, HeadRows) else HeadRows(head)
        self.vocab_size = vocab_size
        self.half = half and self.source.weight.dtype == torch.float32 and not self.source.int8  # half_rows_pay
        self._members: set[int] | None = None  # S as a Python set, made on the first extend
        if _grown is not None:  # (ids in order, the base of the subset it grew from) from `extend`
            self.ids, (self.base, self.n, self.bias) = _grown
        else:
            self.ids = subset_ids(ids, vocab_size).to(self.source.weight.device)
            self.base, self.n, self.bias = self._gather_base(self.ids)
        self.size = int(self.ids.numel())
        self.tail = self.source.gather(self.ids[self.n:])[0] if self.n < self.size else None  # float32 [K - n, H]

    @property
    def packed(self) -> PackedInt8 | None:
        """An int8 source's packed base (None for a float one)."""
        return self.base if isinstance(self.base, PackedInt8) else None

    def _gather_base(self, ids: torch.Tensor) -> tuple:
        """(the rows of ids as the base: PackedInt8 for an int8 source, float16 for `half`, else float32 [n, H];
        n; the bias of every row of ids, [n] or None)."""
        weight, bias = self.source.gather(ids)
        if self.source.int8:
            return PackedInt8([weight], [None]), len(ids), bias  # (the bias is added to every column in compact)
        return (weight.half() if self.half else weight), len(ids), bias

    def extend(self, ids) -> "RestrictedHead":
        """This subset plus `ids` (their rows gathered into the tail; past REPACK added rows, the base again), or
        self when they are all in S already (a set lookup: the engine calls this every round with the committed
        tokens)."""
        if self._members is None:
            self._members = set(self.ids.tolist())
        values = ids.flatten().tolist() if isinstance(ids, torch.Tensor) else list(ids)
        new = [i for i in map(int, values) if i not in self._members]
        if not new:
            return self
        grown = torch.cat([self.ids, subset_ids(new, self.vocab_size).to(self.ids.device)])  # S's order kept
        if len(grown) - self.n > self.REPACK:
            return RestrictedHead(self.source, None, self.vocab_size, self.half, (grown, self._gather_base(grown)))
        bias = None if self.source.bias is None else self.source.bias.index_select(0, grown)
        return RestrictedHead(self.source, None, self.vocab_size, self.half, (grown, (self.base, self.n, bias)))

    def compact(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, H] (the output layer's input) -> logits [N, K] (columns in the order of ids) in the layer's
        dtype (float32 for an int8 layer or float16 rows), before the model's own final transforms."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        return self._finish(flat, self._base_product(flat)).reshape(*hidden.shape[:-1], self.size)

    def _base_product(self, flat: torch.Tensor) -> torch.Tensor:
        """flat [N, H] times the base rows: [N, n]."""
        if self.packed is not None:
            return self.packed.apply(flat.float())
        if self.half:
            return F.linear(flat.half(), self.base).to(flat.dtype)
        return F.linear(flat, self.base)

    def _finish(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The base product `out` [N, n] of flat [N, H] completed: the tail's columns, the bias -> [N, K]."""
        if self.tail is not None:
            out = torch.cat([out, F.linear(flat.float() if self.packed is not None else flat, self.tail)], -1)
        if self.bias is not None:
            out = out + self.bias
        return out

    def widen(self, compact: torch.Tensor) -> torch.Tensor:
        """compact: [N, K] -> float32 [N, V], -inf outside S."""
        out = torch.full((compact.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32,
                         device=compact.device)
        return out.index_copy_(1, self.ids, compact.float())

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Full logits [N, V] -> float32 [N, V] kept on S, -inf elsewhere (for paths that computed every row)."""
        return self.widen(logits.index_select(1, self.ids))


def compact_together(heads: list, hidden: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each heads[i].compact(hidden[i]) (hidden[i]: [n_i, H]), the product of the heads that share their base rows
    (grown from one subset: a batch's slots of a head's reduced vocabulary) taken once over all their rows: the
    base is read once per batched forward, not once per sequence (8,192 x 576 float32: 19 MB)."""
    out: list = [None] * len(heads)
    groups: dict[int, list[int]] = {}
    for i, h in enumerate(heads):
        groups.setdefault(id(h.base), []).append(i)
    for members in groups.values():
        flats = [hidden[i].reshape(-1, hidden[i].shape[-1]) for i in members]
        first = heads[members[0]]
        joint = first._base_product(torch.cat(flats) if len(flats) > 1 else flats[0])
        for i, flat, part in zip(members, flats, joint.split([f.shape[0] for f in flats])):
            out[i] = heads[i]._finish(flat, part)
    return out


def vocab_bucket(size: int) -> int:
    """The power of two nearest to size >= 1 in log scale (8,192 ... 11,585 -> 8,192; 11,586 -> 16,384)."""
    low = 1 << (size.bit_length() - 1)
    return low if size * size < 2 * low * low else 2 * low


_HALF_PAYS: dict[tuple, bool] = {}


def half_rows_pay(rows: int, width: int, device) -> bool:
    """Whether a one-row product with float16 rows [rows, width] takes at most 0.7 of the float32 one here: the
    product reads every row for one drafted token, so it is bound by the bytes read (SmolLM2's 8,192-row head layer:
    2.0 ms in float32, 0.6 ms in float16 on this CPU). Timed once per shape, device and thread count (~20 ms)."""
    import time

    key = (rows, width, str(device), torch.get_num_threads())
    if key not in _HALF_PAYS:
        w = torch.randn(rows, width, device=device)
        x = torch.randn(1, width, device=device)
        forms = ((w, x), (w.half(), x.half()))
        best = [float("inf")] * 2
        with torch.inference_mode():
            for _ in range(8):
                for i, (wi, xi) in enumerate(forms):
                    t0 = time.perf_counter()
                    F.linear(xi, wi)
                    best[i] = min(best[i], time.perf_counter() - t0)
        _HALF_PAYS[key] = best[1] <= 0.7 * best[0]
    return _HALF_PAYS[key]


class VocabSubset:
    """A backend's reduced output layer (mixin): `vocab_subset`, a RestrictedHead or None (the full layer), set with
    `set_vocab_subset` and grown with `extend_vocab_subset`. A backend gives `_full_head()` (its output layer) and
    may refuse in `_check_vocab_subset()`."""

    vocab_subset = None
    half_rows = False  # the subset's rows in float16 (a head's proposal layer where that pays: half_rows_pay)
    sidecar = None  # the sidecar of the model whose output layer this is: it keeps the layer's rows (models/sidecar)

    @property
    def cost_key(self) -> str:
        """Part of auto's cost-cache key (drafting/costs.model_key): a reduced layer's steps cost less than the full
        one's, so its size keeps their calibrations apart, rounded to the nearest power of two (in log scale). The
        subset grows by the tokens a generation meets: rounding up instead gave a subset of exactly 8,192 (the
        shipped SmolLM2 head's) a new key, and a 2 s calibration mid-run, at its first added token."""
        return "" if self.vocab_subset is None else f"vocab{vocab_bucket(self.vocab_subset.size)}"

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
        if self.vocab_subset is not None:
            rows = self.vocab_subset.source  # read out once
        else:
            head = self._full_head()
            rows = self.sidecar.head_rows(head) if self.sidecar is not None else HeadRows(head)
        self.vocab_subset = RestrictedHead(rows, ids, self.vocab_size, half=self.half_rows)

    def extend_vocab_subset(self, ids) -> None:
        """Add token ids `ids` (long [K]) to the subset (a gather of its rows, ~0.3 ms for 1k rows; none when
        nothing is new); a no-op for the full vocabulary. Call between rounds (a round's q must be the law it was
        drafted from)."""
        if self.vocab_subset is not None:
            self.vocab_subset = self.vocab_subset.extend(ids)
