"""A feature head (models/eagle.py) on batch slots: the head's forwards of many sequences as one batched forward.

    every drafting sequence's head step ─► fc(cat(embed(tokens), parent features)) over all rows at once
        ─► the head's decoder layer, attention over each sequence's own slot of the head's SlotCache (run_batch)
        ─► the target's norm (f, kept per slot row) ─► the target's output layer (or each slot's reduced one)

`HeadNet` is the head as a FastNet of one layer (its decoder layer, the target's embedding, rotary tables, norm and
output layer) whose input stage is the head's fc over [embed(token), feature]; models/batched.run_batch runs it like
any model's. `HeadSlot` is one sequence's head: a SlotBackend over the head's SlotCache that reads the parent
features as HeadBackend does (the tap's for committed positions, its own f at the parent row for drafted nodes) and
keeps its rows' positions and f. The target side is the FeatureTap over the target's SlotBackend (its
`batch_part`), so the engine's one target forward per step keeps every row's feature.

The head's decoder layer runs through FastNet's layer code, not transformers' (HeadBackend's): the same computation
in another order, which may move a draft at a near-tie; the output law never depends on it (drafts shape q only).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from multispec.models.base import ForwardOut, causal_mask
from multispec.models.batched import PREFILL_CHUNK, SlotBackend, SlotCache, run_batch
from multispec.models.eagle import EagleHead, FeatureTap, TargetParts, in_pieces, late_row, parent_features
from multispec.models.fast import FastNet
from multispec.models.rows import linear


class HeadNet(FastNet):
    """The head as a one-layer FastNet over the target's shared parts (module docstring). `feature_input` is its
    input stage, what run_batch calls in place of the embedding."""

    def __init__(self, head: EagleHead, parts: TargetParts, rows_table=None, weights_dtype: str | None = None,
                 packs=None):
        base = SimpleNamespace(embed_tokens=parts.embed, layers=[head.transformer], norm=parts.norm,
                               rotary_emb=parts.rotary)
        stand_in = SimpleNamespace(config=head.config, model=base, get_output_embeddings=lambda: parts.lm_head,
                                   eval=lambda: None)
        super().__init__(stand_in, rows_table=rows_table, weights_dtype=weights_dtype,  # type: ignore[arg-type]
                         packs=packs)
        self.fc = head.fc
        self.name = "EagleHead"

    def feature_input(self, tokens: torch.Tensor, features: list, ns: list[int]) -> torch.Tensor:
        """The residual stream [N, H] of tokens long [N] (every step's, flattened) and each step's parent features
        [n, H] (None: zeros, as a timing forward feeds)."""
        feats = torch.cat([f if f is not None else torch.zeros(n, self.hidden_size, dtype=self.dtype,
                                                                device=self.device) for f, n in zip(features, ns)])
        return linear(self.fc, torch.cat([self.embed(tokens).to(feats.dtype), feats], dim=-1), self.rows_table,
                      self.packs)


class HeadSidecar:
    """The head's ModelSidecar (`own`) as a SlotCache reads it: its fast_net is the HeadNet; the rest (few-row table,
    weights' dtype, an ended batch's buffers, output-layer rows) is the head's sidecar's."""

    def __init__(self, own, head: EagleHead, parts: TargetParts):
        self.own, self.model, self.parts = own, head, parts
        self._net: HeadNet | None = None

    def fast_net(self) -> HeadNet:
        if self._net is None:
            self._net = HeadNet(self.model, self.parts, self.own.rows_table, self.own.weights_dtype, self.own.packs)
        return self._net

    @property
    def spare_slot_buffers(self):
        return self.own.spare_slot_buffers

    @spare_slot_buffers.setter
    def spare_slot_buffers(self, value) -> None:
        self.own.spare_slot_buffers = value

    def __getattr__(self, name: str):  # rows_signature, weights_dtype, head_rows, ...
        return getattr(self.own, name)


class HeadSlot(SlotBackend):
    """One sequence's head (HeadBackend's protocol and behaviour) on a slot of the head's SlotCache, reading the
    target's features from `tap`. subset: the head's reduced output layer (a RestrictedHead the batch made once), or
    None."""

    name = "eagle"

    def __init__(self, cache: SlotCache, slot: int, tap: FeatureTap, subset=None):
        super().__init__(cache, slot, cache.sidecar.model)
        self.tap = tap
        self.max_positions = tap.max_positions
        self.vocab_subset = subset
        self._pos = torch.zeros(0, dtype=torch.long)  # position of each row (host)
        self._out = torch.zeros(0, self.hidden_size, dtype=self.dtype, device=self.device)  # the head's f at each row

    @property
    def calibration_room(self) -> int:
        """As HeadBackend's: a chain fed at once must read committed features only."""
        return self.tap.cache_len + 1 - self.cache_len

    def reset(self) -> None:
        super().reset()
        self._pos, self._out = self._pos[:0], self._out[:0]

    def _part(self, tokens, positions, mask, want_hidden: bool, last_only: bool):
        """(Step, finish) of a call whose rows can go at once, or None (late_row: one at a time)."""
        n, start = tokens.shape[0], self.cache_len
        positions = positions.cpu()
        mask = causal_mask(start, n) if mask is None else mask.cpu()
        if late_row(positions, mask, start, self._pos, self.tap.cache_len) is not None:
            return None
        feats = parent_features(positions, mask, start, self._pos, self._out, self.tap)
        step = self.step(tokens, positions, mask, True, last_only, every_hidden=last_only)
        step.features = feats

        def finish(out: ForwardOut) -> ForwardOut:
            self._pos = torch.cat([self._pos, positions])
            self._out = torch.cat([self._out, out.hidden.to(self.dtype)])
            hidden = out.hidden[-1:] if step.last_only else out.hidden
            return ForwardOut(logits=out.logits, hidden=hidden if want_hidden else None)

        return step, finish

    def batch_part(self, r, every_hidden: bool = False) -> tuple | None:
        if r.tokens.shape[0] > PREFILL_CHUNK:
            return None
        part = self._part(r.tokens, r.positions, r.mask, r.want_hidden, r.last_only)
        return None if part is None else (self.cache, *part)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False, last_only: bool = False, every_hidden: bool = False) -> ForwardOut:
        """As HeadBackend.forward, as a batch of one."""
        n = tokens.shape[0]
        if n > PREFILL_CHUNK:
            return self._chunked(tokens, positions, mask, want_hidden, last_only, False)
        part = self._part(tokens, positions, mask, want_hidden, last_only)
        if part is None:
            start = self.cache_len
            mask = causal_mask(start, n) if mask is None else mask.cpu()
            split = late_row(positions.cpu(), mask, start, self._pos, self.tap.cache_len)
            return in_pieces(self.forward, split, tokens, positions.cpu(), mask, start, want_hidden, last_only)
        step, finish = part
        return finish(run_batch(self.cache, [step])[0])

    def keep(self, indices: torch.Tensor) -> None:
        super().keep(indices)
        idx = indices.cpu()
        self._pos, self._out = self._pos[idx], self._out[idx.to(self._out.device)]


class HeadBatch:
    """A feature head's side of a BatchEngine (decoding/batch.py): one SlotCache of `slots` x `rows` for the head's
    layer, and each slot's backends (`backends`). token_ids: the head's reduced vocabulary (its output layer
    restricted once for every slot; each slot's grows on its own), or None."""

    def __init__(self, head: EagleHead, parts: TargetParts, own_sidecar, token_ids, slots: int, rows: int):
        from multispec.models.batched import Role
        from multispec.models.reduced_vocab import RestrictedHead, half_rows_pay

        self.model = head.eval()
        self.cache = SlotCache(HeadSidecar(own_sidecar, head, parts), slots, rows, Role.DRAFT)
        net = self.cache.net
        self.subset = None
        if token_ids is not None:
            half = net.dtype == torch.float32 and half_rows_pay(len(token_ids), net.hidden_size, net.device)
            self.subset = RestrictedHead(own_sidecar.head_rows(parts.lm_head), token_ids, net.vocab_size, half=half)

    def backends(self, slot: int, target) -> tuple[FeatureTap, HeadSlot]:
        """The target's backend of `slot` (a SlotBackend, or a wrapper over one) wrapped to keep its features, and
        the slot's head reading them."""
        tap = FeatureTap(target)
        return tap, HeadSlot(self.cache, slot, tap, self.subset)
