"""Many sequences through one forward: the fast backend's step over a batch of cache slots.

Each sequence owns one slot of a `SlotCache` (per layer, keys and values [slots, H_kv, rows, D]) and brings its own
step: its tokens, positions and mask (a one-token decode, a draft level, a whole tree or a prefill), written at its
own cache rows. `run_batch` runs the steps of many slots as one forward:

    tokens of every step, flattened (ragged, as vLLM does) ─► embedding, projections, MLP, output layer: one matmul
        each over all N tokens
    attention: steps of up to PAD_LIMIT tokens padded to [slots lo..hi, Nmax] queries over their own slots' rows
        (one scaled_dot_product_attention per layer, keys read in place: no copy); a longer step (a prefill)
        attends alone over its slot

A row attends only to its own slot's rows, so a sequence's output does not depend on what else is in the batch; the
arithmetic can differ from a batch-1 step in the last bits (a matmul over more rows may sum in another order),
which moves a greedy choice only at a near-tie (benchmarks/batching/batch_identity.py counts them).

`forward_all` is what the engine (decoding/engine.py) calls once a step's sequences have each asked for a forward:
the requests on slots of one cache run as one `run_batch`. `SlotBackend` is the backend protocol (models/base.py)
over one slot, so every method runs batched unchanged (a forward it makes outside the engine's requests runs as a
batch of one).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from multispec.errors import MultispecError
from multispec.models.base import Forward, ForwardOut
from multispec.models.reduced_vocab import VocabSubset, compact_together

class Role(IntEnum):
    """Which model a forward runs. When both models have requests waiting, the lower value runs first (the draft),
    so that drafting sequences reach the target forward and verify together with the others."""

    DRAFT = 0
    TARGET = 1


PAD_LIMIT = 64  # steps of more tokens (prefills) attend alone: padding every row to a prefill's length would cost more
PREFILL_CHUNK = 256  # a longer step (a prefill) goes in chunks of this many tokens, one batched forward each, so that
# a joining prompt adds at most this much to the running sequences' steps (chunked prefill)
SLIDE_SLACK = 3 * PREFILL_CHUNK  # rows a sliding-window layer holds past its window: a step's new rows, a round's
# uncommitted ones and a margin (SlotCache)


def _fits(buffers: list[list[torch.Tensor]], shapes: list[tuple], net) -> bool:
    """Whether spare buffers [keys, values] (each per layer [slots, H_kv, rows, D], values shaped as keys) hold
    `shapes`: as many layers, the same heads, head size, dtype and device, at least as many slots and rows."""
    return len(buffers[0]) == len(shapes) and all(
        b.dtype == net.dtype and b.device == net.device and b.shape[1::2] == torch.Size(shape[1::2])
        and b.shape[0] >= shape[0] and b.shape[2] >= shape[2] for b, shape in zip(buffers[0], shapes))


class SlotCache:
    """The KV cache of one model (`role`: Role.TARGET or Role.DRAFT) for `slots` sequences of up to `rows` rows
    each.

    Sliding-window layers hold only `window + slack` rows per slot when that is fewer than `rows`: a slot's rows
    [base, len) sit at their rows [0, len - base), and when a step would not fit, the rows that no query can see
    any more (positions at least `slack // 4` before the step's earliest query's window) are dropped by moving
    the rest down (`make_room`). Full-attention layers hold every row."""

    def __init__(self, sidecar, slots: int, rows: int, role: Role = Role.TARGET, slack: int = SLIDE_SLACK):
        """sidecar: the model's models/sidecar.ModelSidecar (its FastNet; it keeps an ended cache's buffers)."""
        net = sidecar.fast_net()
        self.sidecar, self.net, self.slots, self.rows, self.role = sidecar, net, slots, rows, role
        self.window = net.layout.windows.get("sliding_attention")
        self.slide_rows = min(rows, self.window + slack) if self.window else rows
        self.margin = slack // 4
        self.sliding = [t == "sliding_attention" and self.slide_rows < rows for t in net.layout.layer_types]
        shapes = [(slots, net.n_kv, self.slide_rows if sl else rows, net.head_dim) for sl in self.sliding]
        spare, sidecar.spare_slot_buffers = sidecar.spare_slot_buffers, None  # an ended batch's (see `release`)
        if spare is None or not _fits(spare, shapes, net):
            del spare  # freed before the new buffers are allocated
            spare = [[torch.zeros(shape, dtype=net.dtype, device=net.device) for shape in shapes] for _ in "kv"]
        self._buffers = spare
        self.k, self.v = ([b[:n, :, :r] for b, (n, _, r, _) in zip(bufs, shapes)] for bufs in spare)
        self.pos = torch.zeros(slots, rows, dtype=torch.long, device=net.device)  # position of each row
        self.lens = [0] * slots
        self.base = [0] * slots  # the row a slot's sliding layers hold at their row 0

    def release(self) -> None:
        """Hand the key/value buffers to the model's next SlotCache that fits in them (as views); this one is done
        (its batch has ended). One set per model is kept, in its sidecar, until a larger one replaces it.
        Allocating them cost every batch page faults over all of them: 0.4-1.8 s for 16 slots of 2,000 rows on
        pycode-v1 (0.9 GB), 2-10 % of a batch of Spec-Bench prompts.
        Rows a slot has not written since hold an earlier sequence's keys and values, as a slot does after its
        sequence ends within a batch: every query masks them out (it attends to its own slot's rows below its length).
        They are kept in the model's sidecar."""
        if self.k:
            self.sidecar.spare_slot_buffers = self._buffers
        self.k, self.v, self._buffers, self.lens = [], [], [], [0] * self.slots

    @property
    def nbytes(self) -> int:
        """Memory its buffers take (keys, values and positions of every slot's rows; reused buffers may be larger)."""
        return sum(t.nbytes for bufs in self._buffers for t in bufs) + self.pos.nbytes

    def reset(self, slot: int) -> None:
        self.lens[slot] = self.base[slot] = 0

    def _slot_views(self, slot: int, sliding: bool) -> list[torch.Tensor]:
        return [c[slot] for c, sl in zip((*self.k, *self.v), self.sliding * 2) if sl == sliding]

    def keep(self, slot: int, indices: torch.Tensor) -> None:
        """Keep rows `indices` (long [K], increasing) of `slot` (FastBackend.keep, on the slot's views)."""
        from multispec.models.fast import keep_rows

        self.lens[slot] = keep_rows(self._slot_views(slot, False), self.pos[slot], indices)
        if any(self.sliding):  # every kept row from base on (the rows before it are a kept prefix)
            b = self.base[slot]
            keep_rows(self._slot_views(slot, True), None, indices[indices >= b] - b)

    def make_room(self, slot: int, start: int, n: int, positions: torch.Tensor) -> None:
        """Before a step of n rows after `start` at `positions`: drop the sliding layers' rows that no query can see
        any more when the step would not fit; MultispecError when a query would need a dropped row or the step
        cannot fit."""
        if not any(self.sliding):
            return
        b, first_position = self.base[slot], int(positions.min())
        if 0 < b and first_position - self.window + 1 < b:  # never: a dropped row in a query's window would be wrong output
            raise MultispecError(f"a query at position {first_position} needs rows this slot's sliding-window cache "
                                 f"dropped (it holds rows from {b})")
        if start + n - b <= self.slide_rows:
            return
        cut = min(start, first_position - self.window - self.margin + 1)
        if cut > b and int(self.pos[slot, b:cut].max()) <= first_position - self.window:
            for c in self._slot_views(slot, True):
                c[:, :start - cut] = c[:, cut - b:start - b].clone()
            self.base[slot] = b = cut
        if start + n - b > self.slide_rows:
            raise MultispecError(f"a step of {n} rows after {start - b} does not fit the {self.slide_rows} rows of "
                                 "this slot's sliding-window layers")


@dataclass
class Step:
    """One sequence's part of a batched forward. tokens, positions: long [n]; mask: bool [n, start + n] or None (a
    plain chain after every cached row); head: the slot's reduced output layer (RestrictedHead) or None; argmax:
    also each row's argmax (ForwardOut.argmax; a greedy sequence's verification reads it). every_hidden: with
    last_only, hidden states of every row all the same (a feature tap keeps them). features: float [n, H], the
    parent feature each row reads, for a feature head's cache (its net's `feature_input`; models/eagle_batched.py)."""

    slot: int
    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None = None
    want_hidden: bool = False
    last_only: bool = False
    head: object = None
    argmax: bool = False
    every_hidden: bool = False
    features: torch.Tensor | None = None


@torch.inference_mode()
def run_batch(cache: SlotCache, steps: list[Step]) -> list[ForwardOut]:
    """Run every step (one per slot, slots distinct) as one forward and return each step's ForwardOut, as
    FastBackend.forward would: float32 logits [n, V] (last_only: [1, V]) and hidden states when asked."""
    net, dev = cache.net, cache.net.device
    ns = [s.tokens.shape[0] for s in steps]
    starts = [cache.lens[s.slot] for s in steps]
    tokens = torch.cat([s.tokens for s in steps]).to(dev)
    positions = torch.cat([s.positions for s in steps]).to(dev)
    for s, n, a in zip(steps, ns, starts):
        cache.make_room(s.slot, a, n, s.positions)
    repeat = torch.tensor(ns, device=dev)
    slot_of = torch.tensor([s.slot for s in steps], device=dev).repeat_interleave(repeat)
    row_of = torch.cat([torch.arange(a, a + n, device=dev) for a, n in zip(starts, ns)])
    slide_row_of = row_of - torch.tensor([cache.base[s.slot] for s in steps], device=dev).repeat_interleave(repeat)
    cache.pos[slot_of, row_of] = positions
    plan = _AttentionPlan(cache, steps, ns, starts, positions)
    ropes = net.ropes(positions)
    head_input = getattr(net, "feature_input", None)  # a feature head's input stage (models/eagle_batched.HeadNet)
    x = net.embed_input(tokens) if head_input is None else head_input(tokens, [s.features for s in steps], ns)
    total = x.shape[0]
    for i, layer in enumerate(net.layers):
        attn = layer.self_attn
        q, k, v = net.qkv(attn, net.layer_input(layer, x), total)  # [Hq, N, D], [Hkv, N, D]
        if net.use_rope[i]:
            cos, sin = ropes[net.rope_index[i]]
            q, k = net.rotate(q, cos, sin), net.rotate(k, cos, sin)
        rows = slide_row_of if cache.sliding[i] else row_of
        cache.k[i][slot_of, :, rows] = k.transpose(0, 1)  # [N, Hkv, D] at (slot, row) of each token
        cache.v[i][slot_of, :, rows] = v.transpose(0, 1)
        o = plan.attend(i, q, attn.scaling)  # [N, Hq * D]
        x = net.finish_layer(layer, x, o)
    for s, n, a in zip(steps, ns, starts):
        cache.lens[s.slot] = a + n
    return _outputs(net, x, steps, ns)


class _AttentionPlan:
    """Which queries attend where, built once per batched forward and used by every layer.

    Steps of up to PAD_LIMIT tokens attend padded, the one-token steps apart from the longer ones (drafts and trees):
    padding every row to the longest step would make one speculating sequence pay its query count for the whole
    batch (at batch 32 with a 400-row context, one 16-token step made the attention of all 32 cost 2.9x). Each of
    the two is split by width (`split_by_width`): a padded group reads every member's keys up to its widest member's,
    over the slots from its lowest to its highest. Members of a group whose slots lie far apart, and steps longer
    than PAD_LIMIT (prefills), attend alone, each over its own slot's rows in place."""

    def __init__(self, cache: SlotCache, steps: list[Step], ns: list[int], starts: list[int], positions):
        net = cache.net
        self.cache, self.net = cache, net
        offsets = [0]
        for n in ns:
            offsets.append(offsets[-1] + n)
        self.total = offsets[-1]
        widths = [a + n for a, n in zip(starts, ns)]
        slot_of = [s.slot for s in steps]
        alone, padded, call_rows = [j for j, n in enumerate(ns) if n > PAD_LIMIT], [], _call_rows(net)
        for kind in ([j for j, n in enumerate(ns) if n == 1], [j for j, n in enumerate(ns) if 1 < n <= PAD_LIMIT]):
            for part, dense in split_by_width(kind, widths, slot_of, call_rows) if kind else ():
                if dense:
                    padded.append(part)
                else:
                    alone.extend(part)
        self.alone = [(steps[j], offsets[j], ns[j], starts[j]) for j in sorted(alone)]
        self.alone_masks = [net.masks(s.mask, positions[o:o + n], cache.pos[s.slot, :a + n], a, n)
                            for s, o, n, a in self.alone]
        self.groups = [_Padded(cache, [steps[j] for j in g], [ns[j] for j in g], [starts[j] for j in g],
                               [offsets[j] for j in g], positions) for g in padded]
        if len(self.groups) == 1 and not self.alone:
            self.groups[0].whole(self.total)

    def attend(self, layer: int, q: torch.Tensor, scale) -> torch.Tensor:
        """q: [Hq, N, D] -> attention output [N, Hq * D]."""
        net, cache = self.net, self.cache
        hq, _, d = q.shape
        if len(self.groups) == 1 and self.groups[0].tokens_at is None:  # one group, every token in order
            return self.groups[0].attend(layer, q, scale)
        out = q.new_empty(self.total, hq * d)
        for g in self.groups:
            out[g.tokens_at] = g.attend(layer, q, scale)
        for (s, off, n, a), masks in zip(self.alone, self.alone_masks):
            b = cache.base[s.slot] if cache.sliding[layer] else 0  # a sized sliding layer holds rows [b, a + n)
            keys, values = cache.k[layer][s.slot, :, :a + n - b], cache.v[layer][s.slot, :, :a + n - b]
            mask = masks[net.mask_index[layer]]
            o = net.attend(q[:, off:off + n], keys, values, mask if mask is None else mask[..., b:], scale)
            out[off:off + n] = o.transpose(0, 1).reshape(n, hq * d)
        return out


CALL_BYTES = 250_000  # what one more attention call costs per layer (~20 us on this machine: the call, its query
# and output copies), in bytes of keys and values read at ~11 GB/s (split_by_width)


def _call_rows(net) -> int:
    """CALL_BYTES in cache rows of this model (keys and values of one row, every key/value head, one layer)."""
    return max(1, CALL_BYTES // (2 * net.n_kv * net.head_dim * net.dtype.itemsize))


def _group_cost(lo: int, hi: int, count: int, width: int, own: int, call_rows: int) -> tuple[int, bool]:
    """(cost in cache rows read per layer, dense) of `count` steps on slots lo..hi whose widest step reads `width`
    rows and whose own widths sum to `own`: padded over the slots lo..hi in place when they fill at least half of
    that range (dense), else each step alone over its own rows (one call each)."""
    span = hi - lo + 1
    if span <= 2 * count:
        return span * width + call_rows, True
    return own + count * call_rows, False


def split_by_width(members: list[int], widths: list[int], slots: list[int], call_rows: int,
                   depth: int = 2) -> list[tuple[list[int], bool]]:
    """Steps `members` (indices into widths/slots) as (group, dense) parts that read fewer cache rows: a padded group
    reads, for every slot from its lowest to its highest, as many rows as its widest member (the attention of a
    decode step is a read of keys and values), so one long prompt among short ones made each of them read its rows
    (Spec-Bench on pycode-v1, batch 32, prompts of 12-1,023 tokens: the forward took 106 ms, 56 ms split, its
    attention 67 ms before). Sorted by width, a group is cut in two where that reads fewer rows, twice over at most
    (up to 4 parts); a part that is not dense attends step by step (_group_cost)."""
    order = sorted(members, key=lambda j: widths[j])
    n = len(order)
    s, w = [slots[j] for j in order], [widths[j] for j in order]
    lo, hi, own = s[:], s[:], w[:]  # of order[:i + 1]: the lowest and highest slot, the widths' sum
    for i in range(1, n):
        lo[i], hi[i], own[i] = min(lo[i - 1], s[i]), max(hi[i - 1], s[i]), own[i - 1] + w[i]
    whole = _group_cost(lo[-1], hi[-1], n, w[-1], own[-1], call_rows)
    best, cut = whole[0], None
    right_lo = right_hi = s[-1]
    for i in range(n - 1, 0, -1):  # left: order[:i], right: order[i:]
        right_lo, right_hi = min(right_lo, s[i]), max(right_hi, s[i])
        cost = (_group_cost(lo[i - 1], hi[i - 1], i, w[i - 1], own[i - 1], call_rows)[0]
                + _group_cost(right_lo, right_hi, n - i, w[-1], own[-1] - own[i - 1], call_rows)[0])
        if cost < best:
            best, cut = cost, i
    if cut is None or depth == 0:
        return [(members, whole[1])]
    return [part for side in (order[:cut], order[cut:])
            for part in split_by_width(side, widths, slots, call_rows, depth - 1)]


class _Padded:
    """Steps attending together as [R, Hq, nmax, D] queries over the R slots lo..hi-1 (the caches' views, no copy;
    a slot in between with no step gets padding queries only). Only a dense group is padded (split_by_width): a copy
    of scattered slots' rows cost more than it saved (cold keys: 2.2 ms a layer for 5 slots x 678 rows, pycode-v1)."""

    def __init__(self, cache: SlotCache, steps: list[Step], ns: list[int], starts: list[int], offsets: list[int],
                 positions):
        net, dev = cache.net, cache.net.device
        self.cache, self.net = cache, net
        slots = [s.slot for s in steps]
        self.lo, self.hi = min(slots), max(slots) + 1
        self.rows_of = list(range(self.lo, self.hi))
        row = {slot: r for r, slot in enumerate(self.rows_of)}
        nr, nmax = len(self.rows_of), max(ns)
        self.nmax = nmax
        width = max(a + n for a, n in zip(starts, ns))
        # allowed[r, m, t]: query m of row r's slot may read row t. A chain reads every row before it; a tree
        # brings its own mask. Padding queries read row 0 only (their outputs are dropped).
        qrow = torch.arange(nmax, device=dev)
        start_of = torch.zeros(nr, dtype=torch.long, device=dev)
        n_of = torch.zeros(nr, dtype=torch.long, device=dev)
        index, tokens_at = [], []
        for st, n, a, off in zip(steps, ns, starts, offsets):
            r = row[st.slot]
            start_of[r], n_of[r] = a, n
            index.append(torch.arange(r * nmax, r * nmax + n, device=dev))
            tokens_at.append(torch.arange(off, off + n, device=dev))
        limit = start_of[:, None] + qrow[None, :] + 1  # [R, nmax]: a chain's rows end after the query itself
        allowed = torch.arange(width, device=dev)[None, None, :] < limit[:, :, None]  # [R, nmax, width]
        for st, n, a in zip(steps, ns, starts):
            if st.mask is not None:
                r = row[st.slot]
                allowed[r, :n, :a + n] = st.mask.to(dev)
                allowed[r, :n, a + n:] = False
        live = qrow[None, :] < n_of[:, None]  # [R, nmax]
        qpos = torch.zeros(nr, nmax, dtype=torch.long, device=dev)
        self.index, self.tokens_at = torch.cat(index), torch.cat(tokens_at)
        qpos.view(-1)[self.index] = positions[self.tokens_at]
        kpos = self._rows(cache.pos)[:, :width]
        slide_width = max(a + n - cache.base[st.slot] for st, n, a in zip(steps, ns, starts))
        self.widths = (width, slide_width)
        self.masks = []
        for kind in net.layout.distinct_types:
            m, w = allowed, net.layout.windows.get(kind)
            if kind == "sliding_attention":
                m = m & (qpos[:, :, None] - kpos[:, None, :] < w)
                if any(cache.sliding):
                    m = _from_base(m, [cache.base[slot] for slot in self.rows_of], slide_width)
            elif kind == "chunked_attention":
                m = m & (qpos[:, :, None] // w == kpos[:, None, :] // w)
            m = m | (~live)[:, :, None] & (torch.arange(m.shape[2], device=dev) == 0)
            self.masks.append(m[:, None])  # [R, 1, nmax, width] (a sized sliding layer's: slide_width)

    def whole(self, total: int) -> None:
        """These steps are every token of the forward: when in order, attend writes the output as it is."""
        if bool((self.tokens_at == torch.arange(total, device=self.tokens_at.device)).all()):
            self.tokens_at = None

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """t's entries for this group's slots lo..hi-1 (dim 0: slots), a view."""
        return t[self.lo:self.hi]

    def attend(self, layer: int, q: torch.Tensor, scale) -> torch.Tensor:
        """q: [Hq, N, D] (every token of the forward) -> this group's tokens' outputs [n, Hq * D], in order."""
        net, cache, nmax = self.net, self.cache, self.nmax
        hq, _, d = q.shape
        nr = len(self.rows_of)
        width = self.widths[cache.sliding[layer]]
        qt = q.transpose(0, 1)  # [N, Hq, D]
        qp = q.new_zeros(nr * nmax, hq, d)
        qp[self.index] = qt if self.tokens_at is None else qt[self.tokens_at]
        qp = qp.view(nr, nmax, hq, d).transpose(1, 2)  # [R, Hq, nmax, D]
        keys = self._rows(cache.k[layer][:, :, :width])
        values = self._rows(cache.v[layer][:, :, :width])
        o = net.attend(qp, keys, values, self.masks[net.mask_index[layer]], scale)  # [R, Hq, nmax, D]
        return o.transpose(1, 2).reshape(nr * nmax, hq * d)[self.index]


def _from_base(m: torch.Tensor, bases: list[int], width: int) -> torch.Tensor:
    """m: bool [R, Q, T] over rows [0, T) of slots lo.. -> [R, Q, width] over each slot's rows from its base."""
    base = torch.tensor(bases, device=m.device)[:, None]  # [R, 1]
    rows = torch.arange(width, device=m.device)[None, :] + base  # [R, width]: the row at each held row
    out = m.gather(2, rows.clamp(max=m.shape[2] - 1)[:, None, :].expand(-1, m.shape[1], -1))
    return out & (rows < m.shape[2])[:, None, :]


def _outputs(net, x: torch.Tensor, steps: list[Step], ns: list[int]) -> list[ForwardOut]:
    """Each step's logits (and hidden states): one output-layer matmul over the rows of every step that uses the full
    layer, one over the steps whose reduced layers share their base rows (reduced_vocab.compact_together). A
    last_only step's logits are its last row's; its hidden states too, unless every_hidden."""
    rows, off = [], 0
    for s, n in zip(steps, ns):
        rows.append(range(off + n - 1, off + n) if s.last_only and not s.every_hidden else range(off, off + n))
        off += n
    flat = [i for r in rows for i in r]
    hidden = net.norm(x if len(flat) == x.shape[0] else x[torch.tensor(flat, device=x.device)])
    sizes = [len(r) for r in rows]
    parts = list(hidden.split(sizes))
    ins = [p[-1:] if s.last_only and s.every_hidden else p for s, p in zip(steps, parts)]  # the output layer's rows
    logits: list = [None] * len(steps)
    full = [j for j, s in enumerate(steps) if s.head is None]
    if full:
        joint = net.logits(torch.cat([ins[j] for j in full]) if len(full) > 1 else ins[full[0]])
        for j, lg in zip(full, joint.split([ins[j].shape[0] for j in full])):
            logits[j] = lg
    reduced = [j for j, s in enumerate(steps) if s.head is not None]  # the base rows they share read once
    for j, compact in zip(reduced, compact_together([steps[j].head for j in reduced], [ins[j] for j in reduced])):
        logits[j] = steps[j].head.widen(net.logits(ins[j], lambda _, compact=compact: compact))
    best = _argmax_rows(steps, logits)
    return [ForwardOut(logits=lg, hidden=parts[j].float() if s.want_hidden else None, argmax=best[j])
            for j, (s, lg) in enumerate(zip(steps, logits))]


def _argmax_rows(steps: list[Step], logits: list) -> list:
    """Each step's row argmaxes (long [n], CPU) where it asked for them, else None: one argmax and one copy to the
    CPU for every asking step together (a GPU then waits once per forward, not once per greedy sequence). A step
    with a NaN row gets None: its own greedy_argmax then refuses it in one line."""
    asking = [j for j, s in enumerate(steps) if s.argmax]
    best: list = [None] * len(steps)
    if not asking:
        return best
    rows = torch.cat([logits[j] for j in asking]) if len(asking) > 1 else logits[asking[0]]
    top = rows.argmax(-1)
    top = torch.where(rows.gather(-1, top[:, None]).squeeze(-1).isnan(), -1, top).cpu()  # -1: a NaN row
    for j, t in zip(asking, top.split([logits[j].shape[0] for j in asking])):
        best[j] = t if bool((t >= 0).all()) else None
    return best


class SlotBackend(VocabSubset):
    """The backend protocol (models/base.py) over one slot of a SlotCache. Its own `forward` runs a batch of one;
    the engine runs a step's requests of many slots as one forward (`forward_all`). name "fast": `auto`'s cost
    calibration of the fast backend applies (batched costs come from the batch's cost table, drafting/costs.py)."""

    name = "fast"

    def __init__(self, cache: SlotCache, slot: int, model):
        self.cache, self.slot, self.model = cache, slot, model
        net = cache.net
        self.vocab_size, self.hidden_size, self.device, self.dtype = net.vocab_size, net.hidden_size, net.device, \
            net.dtype
        self.layout = net.layout
        self.sidecar = cache.sidecar  # the model's: its output layer's rows (a reduced vocabulary)
        self.rows_signature, self.weights_dtype = cache.sidecar.rows_signature, cache.sidecar.weights_dtype  # cost keys
        limit = net.layout.max_positions
        self.max_len = cache.rows
        self.max_positions = min(cache.rows, limit) if limit else cache.rows
        self.argmax = False  # set for a greedy sequence: its forwards also return each row's argmax

    @property
    def cache_len(self) -> int:
        return self.cache.lens[self.slot]

    @property
    def prefill_chunk(self) -> int:
        """A prefill goes in chunks of this many tokens, one per engine step (chunked prefill: a joining prompt adds
        at most this much to the running sequences' steps)."""
        return PREFILL_CHUNK

    def reset(self) -> None:
        self.cache.reset(self.slot)

    def _full_head(self):
        return self.cache.net.head

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
             want_hidden: bool = False, last_only: bool = False, every_hidden: bool = False) -> Step:
        """This slot's part of a batched forward (checked: it fits the slot's rows and the model's positions)."""
        n, start = tokens.shape[0], self.cache_len
        if start + n > self.max_len:
            raise MultispecError(f"sequence of {start + n} tokens exceeds the batch's cache of {self.max_len} rows")
        limit = self.layout.max_positions
        if limit is not None and int(positions.max()) >= limit:
            raise MultispecError(f"position {int(positions.max())} is past the model's limit of {limit} positions "
                                 "(max_position_embeddings)")
        return Step(self.slot, tokens, positions, mask, want_hidden, last_only and n > 1, self.vocab_subset,
                    self.argmax, every_hidden)

    def batch_part(self, r: Forward, every_hidden: bool = False) -> tuple | None:
        """Request r as (this slot's cache, its Step, finish(ForwardOut) -> ForwardOut) for a batched forward
        (`forward_all`), or None where it runs alone: a step longer than PREFILL_CHUNK (its slot runs it in chunks)."""
        if r.tokens.shape[0] > PREFILL_CHUNK:
            return None
        return self.cache, self.step(r.tokens, r.positions, r.mask, r.want_hidden, r.last_only, every_hidden), \
            _same

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False, last_only: bool = False, every_hidden: bool = False) -> ForwardOut:
        if tokens.shape[0] > PREFILL_CHUNK:
            return self._chunked(tokens, positions, mask, want_hidden, last_only, every_hidden)
        return run_batch(self.cache, [self.step(tokens, positions, mask, want_hidden, last_only, every_hidden)])[0]

    def _chunked(self, tokens, positions, mask, want_hidden: bool, last_only: bool, every_hidden: bool) -> ForwardOut:
        """A long step (a prefill) in chunks of PREFILL_CHUNK tokens, each one batched forward with the others'
        steps. Exact for any mask whose rows read no later row (a chain, a tree in order): chunk [a, b) reads the
        cache and rows before b. Outputs: the last row's (last_only; every row's hidden states with every_hidden),
        else every row's. (A prefill through the engine goes one chunk per step instead, decoding/state.chain_steps;
        this serves a long forward that must finish in one step: a draft's catch-up, a forward a method makes
        itself.)"""
        n, start, outs = tokens.shape[0], self.cache_len, []
        for a in range(0, n, PREFILL_CHUNK):
            b = min(n, a + PREFILL_CHUNK)
            rows = None if mask is None else mask[a:b, :start + b]
            outs.append(self.forward(tokens[a:b], positions[a:b], rows, want_hidden, last_only, every_hidden))
        hidden = torch.cat([o.hidden for o in outs]) if want_hidden and (every_hidden or not last_only) else None
        if last_only:  # the earlier chunks' last rows are not asked for
            return outs[-1] if hidden is None else ForwardOut(logits=outs[-1].logits, hidden=hidden)
        return ForwardOut(logits=torch.cat([o.logits for o in outs]), hidden=hidden)

    def keep(self, indices: torch.Tensor) -> None:
        self.cache.keep(self.slot, indices)


def forward_all(requests: list[Forward]) -> list[ForwardOut | BaseException]:
    """Run a step's forward requests (models/base.Forward, one per sequence, each on its own backend): the requests
    whose backend has a part for them in a batched forward (`batch_part`: a SlotBackend, or a wrapper over one such
    as a feature tap, models/eagle_batched.py) as one `run_batch` per SlotCache, any other alone (a backend of its
    own, a step longer than PREFILL_CHUNK, which its slot runs in chunks). Each request's ForwardOut, or the error
    its forward raised (a batched forward's error is every one of its requests')."""
    out: list[ForwardOut | BaseException | None] = [None] * len(requests)
    groups: dict[int, tuple[SlotCache, list]] = {}
    for i, r in enumerate(requests):
        try:
            part = r.backend.batch_part(r) if hasattr(r.backend, "batch_part") else None  # type: ignore[attr-defined]
            if part is None:
                out[i] = r.run()
                continue
        except Exception as e:  # noqa: BLE001 - the requesting sequence gets it
            out[i] = e
            continue
        cache, step, finish = part
        groups.setdefault(id(cache), (cache, []))[1].append((i, step, finish))
    for cache, members in groups.values():
        try:
            outs: list = run_batch(cache, [step for _, step, _ in members])
        except Exception as e:  # noqa: BLE001 - every request of this forward gets the error
            outs = [e] * len(members)
        for (i, _, finish), o in zip(members, outs):
            try:
                out[i] = o if isinstance(o, BaseException) else finish(o)
            except Exception as e:  # noqa: BLE001 - the requesting sequence gets it
                out[i] = e
    return out  # type: ignore[return-value]


def _same(out: ForwardOut) -> ForwardOut:
    return out
