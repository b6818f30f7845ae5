"""What multispec prepares once for one model and keeps beside it, never on it.

A `ModelSidecar` holds, for one model (a target, a draft, its int8 copy, a feature head), what is worth building
once and reusing across generations: the fast backend's step (FastNet, with its compiled code), the few-row table
its products follow and the packed copies of weights they use (models/rows.py), the output layer's float rows (reduced vocabularies), the int8 copy of a
draft, the weights' dtype, the tree refusal, and an ended batch's cache buffers. The Pair holds one per model
(`Pair.sidecar(model)`); code that has only a bare model builds a fresh one. The model itself is never written to:
its `__dict__`, its modules and their methods are what the caller handed over.
"""
from __future__ import annotations

import torch

_UNSET = object()


class ModelSidecar:
    """model: the model this sidecar prepares for. weights_dtype: what the weights are ("int8" / "int4" for a
    model the pair quantized; default read from the model's layers, models/int8.weights_dtype). rows_table: the
    few-row table the fast backend follows (models/rows.py; None: F.linear at every row count). A Decoder sets it
    from its machine profile; unset, it is measured on first use."""

    def __init__(self, model: torch.nn.Module, weights_dtype: str | None = None, rows_table=_UNSET):
        from multispec.models.int8 import weights_dtype as read_dtype

        self.model = model
        self.weights_dtype = weights_dtype or read_dtype(model)
        self._rows_table = rows_table
        from multispec.models.rows import Packs

        self.packs = Packs()  # packed copies of the model's weights (models/rows.py), made on first use
        self._fast_nets: dict = {}  # rows table (as a tuple, or None) -> FastNet
        self._tree_refusal: tuple | None = None  # (the config it was read from, the refusal)
        self._head_rows = None
        self._int8_copy: torch.nn.Module | None = None
        self.spare_slot_buffers: list | None = None  # an ended SlotCache's [keys, values] (models/batched.py)

    @property
    def rows_table(self) -> list[str] | None:
        """The form the model's float32 CPU Linear layers take at each row count (models/rows.py), or None."""
        if self._rows_table is _UNSET:
            from multispec.models.rows import table

            self._rows_table = table(self.model)[0]
        return self._rows_table

    @rows_table.setter
    def rows_table(self, value: list[str] | None) -> None:
        self._rows_table = value

    @property
    def has_rows_table(self) -> bool:
        return self._rows_table is not _UNSET

    @property
    def rows_signature(self) -> str:
        """The few-row table as part of a cost key ("" when there is none)."""
        from multispec.models.rows import signature

        return signature(self.rows_table)

    def fast_net(self):
        """The model's FastNet (models/fast.py) under the current rows table, made on first use and again after
        model.to(...)."""
        from multispec.models.fast import FastNet

        table = self.rows_table
        key = None if table is None else tuple(table)
        net = self._fast_nets.get(key)
        weight = self.model.get_input_embeddings().weight
        if net is None or (net.device, net.dtype) != (weight.device, weight.dtype):
            if net is not None:
                self._fast_nets.clear()
                self.spare_slot_buffers = None  # buffers of the old device or dtype
            net = self._fast_nets[key] = FastNet(self.model, rows_table=table, weights_dtype=self.weights_dtype,
                                                   packs=self.packs)
        return net

    def tree_refusal(self) -> str | None:
        """Why tree methods cannot run on this model, or None (models.tree_refusal); ~4 ms of config reads, asked
        by every auto sequence of a batch, so read once per config."""
        cached = self._tree_refusal
        if cached is None or cached[0] is not self.model.config:
            from multispec.models.layout import attention_layout

            cached = self._tree_refusal = (self.model.config, attention_layout(self.model.config).tree_refusal)
        return cached[1]

    def head_rows(self, head: torch.nn.Module | None = None):
        """The output layer's reduced_vocab.HeadRows (default layer: the model's), made once: reading an int8
        layer's rows out of its packed form takes ~20 ms, once per model rather than once per request."""
        from multispec.models.int8 import is_int8
        from multispec.models.reduced_vocab import HeadRows

        head = self.model.get_output_embeddings() if head is None else head
        rows = self._head_rows
        device = torch.device("cpu") if is_int8(head) else head.weight.device  # int8 layers run on CPU only
        if rows is None or rows.layer is not head or rows.weight.device != device:
            rows = self._head_rows = HeadRows(head)
        return rows

    def int8_copy(self) -> torch.nn.Module:
        """The draft's int8 copy (models/int8.quantize_draft), made once; refused in one line off the CPU or for a
        draft not in float32."""
        weight = self.model.get_input_embeddings().weight
        if self._int8_copy is None or weight.device.type != "cpu" or weight.dtype != torch.float32:
            from multispec.models.int8 import quantize_draft

            self._int8_copy = quantize_draft(self.model)
        return self._int8_copy
