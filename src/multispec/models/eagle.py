"""A feature-level draft head (EAGLE-1/3 style) and the two backends that run it exactly.

    target.forward (FeatureTap) ──► logits [N, V] + the hidden state of every row, kept per cache row
    head row t:  fc(concat(embed(x_t), f_{t-1})) ─► one decoder layer of the target's family ─► target's final norm
                 ─► f_t (the head's feature) ─► target's output layer ─► q_t (the draft law at t)

The feature f is the input of the output layer (after the final norm), for the target and the head alike: it is
what every backend already returns (`ForwardOut.hidden`), the target's logits are exactly `lm_head(f)` (so training
needs no stored logits), and the head's own output lives in the same space, so a drafted node feeds its children
its own f (EAGLE's feature autoregression) with no extra projection. Row t's feature f_{t-1} is the target's when
position t-1 is committed (the FeatureTap has it), else the head's own output at its parent row (a drafted node);
position 0 reads zeros. The embedding, rotary embedding, final norm and output layer are the target's own, frozen and
shared (`TargetParts`); only `fc` and the decoder layer belong to the head.

`HeadBackend` is a draft backend like any other (models/base.py): grow_tree drafts chains and trees with it, its q is
its softmax processed like a draft model's, and every lossless verifier checks it unchanged. The features only shape
q, never the output law: a wrong feature lowers acceptance, it cannot bias the text (tests/test_eagle.py checks both).
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from multispec.errors import MultispecError, check
from multispec.models.base import ForwardOut, causal_mask
from multispec.models.hf_compat import cache_argument
from multispec.models.rows import linear
from multispec.models.reduced_vocab import VocabSubset, half_rows_pay
from multispec.tree import additive_mask

SCALED_LOGITS = ("final_logit_softcapping", "logits_scaling", "logit_scale", "output_multiplier_scale")


@dataclass(frozen=True)
class TargetParts:
    """The target's modules a head shares (frozen, never saved with the head)."""

    embed: nn.Module
    rotary: nn.Module
    norm: nn.Module
    lm_head: nn.Module

    @classmethod
    def of(cls, model: nn.Module) -> "TargetParts":
        base = getattr(model, "model", None)
        ok = base is not None and all(hasattr(base, a) for a in ("embed_tokens", "rotary_emb", "norm", "layers"))
        check(ok, f"{type(model).__name__} is not a decoder of the Llama family (model.embed_tokens, rotary_emb, "
                  "norm, layers): feature heads support Llama-family targets")
        scaled = [a for a in SCALED_LOGITS if getattr(model.config, a, None) not in (None, 1, 1.0)]
        check(not scaled, f"this {model.config.model_type} target applies {scaled[:1]} after its output layer; "
                          "feature heads need logits straight from it")
        return cls(base.embed_tokens, base.rotary_emb, base.norm, model.get_output_embeddings())


def layer_config(target_config):
    """The target's config with one hidden layer: what the head's decoder layer is built from."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:1])
    return cfg


class EagleHead(nn.Module):
    """fc (2H -> H, no bias) and one decoder layer of the target's family (its class `layer_class`, built from
    `config`, the target's config with one layer). forward reads the target's shared parts."""

    def __init__(self, config, layer_class: type):
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.layer_class = layer_class
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.transformer = layer_class(config, layer_idx=0)
        self._cache_kw = cache_argument(self.transformer)

    def forward(self, parts: TargetParts, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None, cache=None, rows_table: list[str] | None = None, packs=None
                ) -> torch.Tensor:
        """tokens: long [B, L]; features: float [B, L, H] (row t: the feature of position t-1); positions: long
        [B, L]; mask: additive float [B, 1, L, K] (K: cached + new rows) or None (causal, no cache). Returns the
        head's features f: float [B, L, H] (after the target's final norm: logits = parts.lm_head(f)). rows_table,
        packs: the form fc's product takes by row count and where packed copies are kept (models/rows.py; None:
        F.linear)."""
        x = linear(self.fc, torch.cat([parts.embed(tokens).to(features.dtype), features], dim=-1), rows_table, packs)
        pe = parts.rotary(x, positions)
        kw = {self._cache_kw: cache, "use_cache": True} if cache is not None else {}
        out = self.transformer(x, attention_mask=mask, position_ids=positions, position_embeddings=pe, **kw)
        return parts.norm(out[0] if isinstance(out, tuple) else out)

    def teacher_forced(self, parts: TargetParts, tokens: torch.Tensor, features: torch.Tensor,
                       before: torch.Tensor | None = None) -> torch.Tensor:
        """The head over all of tokens [B, L] at once, causal, no cache, row t reading row t-1 of features
        [B, L, H] (row 0: `before` [B, H], the feature of the position before tokens[:, 0]; None: zeros, the
        text's start): what drafting one token after committed text computes at every position.
        Returns f: float [B, L, H]. (Training feeds it the target's features, then its own f to unroll.)"""
        b, n = tokens.shape
        first = torch.zeros_like(features[:, :1]) if before is None else before[:, None].to(features.dtype)
        shifted = torch.cat([first, features[:, :-1]], dim=1)  # [B, L, H]
        dev = features.device
        mask = additive_mask(causal_mask(0, n), features.dtype).to(dev)[None, None]  # [1, 1, L, L]
        return self(parts, tokens, shifted, torch.arange(n, device=dev)[None].expand(b, n), mask)


def head_logits(parts: TargetParts, f: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """Logits of the target's output layer over features f [.., H]: [.., V], or [.., V'] on the rows of a reduced
    vocabulary ids (long [V']) when given."""
    w = parts.lm_head.weight if ids is None else parts.lm_head.weight.index_select(0, ids)
    return F.linear(f, w)


def head_loss(head: EagleHead, parts: TargetParts, tokens: torch.Tensor, feats: torch.Tensor,
              ids: torch.Tensor | None, unroll: int, before: torch.Tensor | None = None):
    """The head's training loss (train-head, training/eagle.py; online adaptation, models/eagle_adapt.py):
    distillation, the cross-entropy of the head's law q against the target's p = softmax(lm_head(f_t)) at every
    row (KL up to a constant); unroll > 1 adds steps that read the head's own features of the step before,
    weighted 0.8^(s-1). tokens: long [B, L]; feats: float [B, L, H], the target's features at those positions;
    before: float [B, H], the target's feature of the position before tokens[:, 0] (None: the text's start).
    Returns (loss, p [B, L, V'], log q of step 1 [B, L, V'])."""
    with torch.no_grad():
        p = torch.softmax(head_logits(parts, feats, ids), -1)  # [B, L, V']
    f, loss, first = feats, feats.new_zeros(()), None
    for s in range(unroll):
        f = head.teacher_forced(parts, tokens, f, before)  # step s reads step s-1's features (the target's at s = 0)
        logq = torch.log_softmax(head_logits(parts, f, ids), -1)
        loss = loss + (0.8 ** s) * -(p * logq).sum(-1).mean()
        first = logq if first is None else first
    return loss, p, first


def new_head(target: nn.Module) -> EagleHead:
    """A freshly initialised head for `target` (its decoder layer's class, its config with one layer); the output
    projections start small so that the untrained head's features stay near fc's. (A copy of the target's last
    layer as the start learned slower on SmolLM2: held-out alpha 0.15-0.21 against 0.27 after 100 steps.)"""
    parts = TargetParts.of(target)  # refuses targets a head cannot read
    del parts
    head = EagleHead(layer_config(target.config), type(target.model.layers[0]))
    with torch.no_grad():
        for name, p in head.transformer.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(0.1)
    p = next(target.parameters())
    return head.to(device=p.device, dtype=p.dtype)


class FeatureTap:
    """A target backend that also keeps the hidden state (the feature) of every cache row, gathered by `keep` like
    the cache itself: between rounds its rows are the committed positions 0..cache_len-1, and `features` reads
    them. Every forward asks the inner backend for hidden states of all rows; a prefill (last_only) asks for the
    last row's logits only where the backend can give every row's hidden state with them (FastBackend's
    every_hidden; elsewhere it computes every row's logits, and the caller still reads only what it asked for)."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.vocab_size, self.hidden_size = inner.name, inner.vocab_size, inner.hidden_size
        self.device, self.max_positions = inner.device, inner.max_positions
        self.hidden = torch.zeros(0, inner.hidden_size)  # float32 [cache_len, H]
        self._every = "every_hidden" in inspect.signature(inner.forward).parameters  # FastBackend's

    @property
    def cache_len(self) -> int:
        return self.inner.cache_len

    @property
    def max_len(self):  # a static cache's rows (round_limit reads it), None for a growing one
        return getattr(self.inner, "max_len", None)

    @property
    def model(self):  # what auto's cost cache is keyed by (drafting/costs.model_key): the target's
        return getattr(self.inner, "model", None)

    @property
    def rows_signature(self) -> str:  # part of that key: the few-row table the target's backend follows
        return getattr(self.inner, "rows_signature", "")

    @property
    def weights_dtype(self) -> str | None:  # part of that key
        return getattr(self.inner, "weights_dtype", None)

    def reset(self) -> None:
        self.inner.reset()
        self.hidden = self.hidden[:0]

    @property
    def prefill_chunk(self):  # a batch slot's (models/batched.SlotBackend): the engine feeds a prompt in chunks
        return getattr(self.inner, "prefill_chunk", None)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False, last_only: bool = False) -> ForwardOut:
        every = last_only and self._every
        out = self.inner.forward(tokens, positions, mask, want_hidden=True,  # a prefill: the output layer on its
                                 **({"last_only": True, "every_hidden": True} if every else {}))  # last row only
        return self._record(out, want_hidden, last_only)

    def batch_part(self, r) -> tuple | None:
        """Request r (models/base.Forward) as the inner batch slot's part of a batched forward (models/batched.
        forward_all), every row's hidden state asked for and kept when it is done; None where it runs alone (an
        inner backend of its own, a step its slot runs in chunks)."""
        part_of = getattr(self.inner, "batch_part", None)
        part = None if part_of is None else part_of(replace(r, want_hidden=True), every_hidden=r.last_only)
        if part is None:
            return None
        cache, step, finish = part
        return cache, step, lambda out: self._record(finish(out), r.want_hidden, step.last_only)

    def _record(self, out: ForwardOut, want_hidden: bool, last_only: bool) -> ForwardOut:
        """Keep the hidden state of every row of a forward's output (every row's hidden states, its logits every
        row's or, last_only, the last's); the output as asked for."""
        if out.hidden is None:
            raise MultispecError(f"the {self.name} backend returned no hidden states, which a feature head needs")
        self.hidden = torch.cat([self.hidden, out.hidden.float().cpu()])
        logits, hidden = (out.logits[-1:], out.hidden[-1:]) if last_only else (out.logits, out.hidden)
        argmax = out.argmax if out.argmax is None or not last_only else out.argmax[-1:]
        return ForwardOut(logits=logits, hidden=hidden if want_hidden else None, argmax=argmax)

    def keep(self, indices: torch.Tensor) -> None:
        self.inner.keep(indices)
        self.hidden = self.hidden[indices.cpu()]

    def warm_up(self) -> None:
        self.inner.warm_up()


class HeadBackend(VocabSubset):
    """The head as a draft backend (models/base.py's protocol), reading the target's features from `tap`. Its KV
    cache is a transformers DynamicCache whose rows `keep` gathers; it records each row's position and the head's
    output feature (for the children of drafted nodes). token_ids: the head's reduced vocabulary (its output layer
    on those rows only, q renormalised over them: models/reduced_vocab.py), or None for the full one. half_rows:
    that layer's rows in float16 (None: where a one-row product measures faster so, reduced_vocab.half_rows_pay;
    float32 rows only). q is whatever the head computes, so this moves acceptance, never the output law.
    sidecar, target_sidecar: the head's and the target's models/sidecar.ModelSidecar (the few-row tables its fc and
    the target's output layer follow; the rows of that layer for a reduced vocabulary); default fresh ones. The
    head's decoder layer runs as transformers runs it."""

    name = "eagle"

    def __init__(self, head: EagleHead, parts: TargetParts, tap: FeatureTap, token_ids=None,
                 half_rows: bool | None = None, sidecar=None, target_sidecar=None):
        from multispec.models.sidecar import ModelSidecar

        self.head, self.parts, self.tap = head.eval(), parts, tap
        own = sidecar if sidecar is not None else ModelSidecar(head)
        self.sidecar = target_sidecar  # the target's: its output layer's rows (a reduced vocabulary)
        self.rows_table, self.packs = own.rows_table, own.packs  # fc's product by row count (models/rows.py)
        self.head_table = None if target_sidecar is None else target_sidecar.rows_table  # the target's output layer
        self.head_packs = None if target_sidecar is None else target_sidecar.packs
        self.rows_signature, self.weights_dtype = own.rows_signature, own.weights_dtype  # cost keys
        self.vocab_size, self.hidden_size = tap.vocab_size, head.config.hidden_size
        self.device, self.max_positions = next(head.parameters()).device, tap.max_positions
        self.dtype = next(head.parameters()).dtype
        self.reset()
        if token_ids is not None:
            if half_rows is None:
                half_rows = self.dtype == torch.float32 and half_rows_pay(len(token_ids), self.hidden_size,
                                                                          self.device)
            self.half_rows = half_rows
            self.set_vocab_subset(token_ids)

    def _full_head(self) -> nn.Module:
        return self.parts.lm_head

    @property
    def model(self) -> nn.Module:  # what auto's cost cache is keyed by (drafting/costs.model_key)
        return self.head

    @property
    def calibration_room(self) -> int:
        """Rows a timing forward (drafting/costs.calibrate) may append: a chain fed at once must read committed
        features only, so up to one past the target's cache."""
        return self.tap.cache_len + 1 - self.cache_len

    @property
    def cache_len(self) -> int:
        return int(self._pos.shape[0])

    def reset(self) -> None:
        self.cache = DynamicCache()
        self._pos = torch.zeros(0, dtype=torch.long)  # position of each row
        self._out = torch.zeros(0, self.hidden_size, dtype=self.dtype)  # the head's feature f at each row

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False, last_only: bool = False) -> ForwardOut:
        """tokens, positions: long [N]; mask: bool [N, cache_len + N] (None: a chain after every row). Returns the
        head's logits float32 [N, V] (-inf outside a reduced vocabulary) and, if asked, its features [N, H]."""
        n, start = tokens.shape[0], self.cache_len
        positions = positions.cpu()
        mask = causal_mask(start, n) if mask is None else mask.cpu()
        split = late_row(positions, mask, start, self._pos, self.tap.cache_len)
        if split is not None:
            return in_pieces(self.forward, split, tokens, positions, mask, start, want_hidden, last_only)
        feats = self._features(positions, mask, start)  # [N, H]
        f = self.head(self.parts, tokens.to(self.device)[None], feats.to(self.device)[None],
                      positions.to(self.device)[None], additive_mask(mask, self.dtype).to(self.device)[None, None],
                      self.cache, self.rows_table, self.packs)[0]  # [N, H]
        self._pos = torch.cat([self._pos, positions])
        self._out = torch.cat([self._out, f.cpu()])
        rows = f[-1:] if last_only else f
        if self.vocab_subset is not None:
            logits = self.vocab_subset.widen(self.vocab_subset.compact(rows))
        else:
            logits = linear(self.parts.lm_head, rows, self.head_table, self.head_packs).float()
        return ForwardOut(logits=logits, hidden=rows.float() if want_hidden else None)

    def _features(self, positions: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
        return parent_features(positions, mask, start, self._pos, self._out, self.tap)

    def keep(self, indices: torch.Tensor) -> None:
        """Keep cache rows `indices` (long [K]) in this order."""
        idx = indices.cpu()
        dev = idx.to(self.device)
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys.index_select(-2, dev), layer.values.index_select(-2, dev)
        self._pos, self._out = self._pos[idx], self._out[idx]


def late_row(positions: torch.Tensor, mask: torch.Tensor, start: int, pos: torch.Tensor, known: int) -> int | None:
    """The first of a head call's rows (positions long [N], mask bool [N, start + N], on the host) past the target's
    `known` rows whose parent is not a cached row of the head (pos: long [start], each cached row's position): it
    comes in this same call (tokens a grammar forced, waiting ahead of the root), so the rows from there on go one
    at a time (`in_pieces`). None: every row can go at once."""
    if positions.shape[0] < 2:
        return None
    own = positions - 1 >= known
    cached_parent = (mask[:, :start] & (pos[None, :] == (positions - 1)[:, None])).any(1)
    late = (own & ~cached_parent).nonzero()
    return int(late[0]) if len(late) else None


def in_pieces(forward, split: int, tokens, positions, mask, start: int, want_hidden: bool,
              last_only: bool) -> ForwardOut:
    """A head call as its rows before `split` at once, then each later row alone (late_row), through `forward`.
    last_only: only the call's last row is read, so the rows at once are asked for their last row only too (a
    deferred prompt caught up before a grammar's forced tokens: the output layer on one row, not on hundreds)."""
    n = tokens.shape[0]
    parts = ([forward(tokens[:split], positions[:split], mask[:split, :start + split], want_hidden,
                      last_only=last_only)] if split else []) \
        + [forward(tokens[i:i + 1], positions[i:i + 1], mask[i:i + 1, :start + i + 1], want_hidden)
           for i in range(split, n)]
    if last_only:
        return parts[-1]
    return ForwardOut(logits=torch.cat([p.logits for p in parts]),
                      hidden=torch.cat([p.hidden for p in parts]) if want_hidden else None)


def parent_features(positions: torch.Tensor, mask: torch.Tensor, start: int, pos: torch.Tensor, out: torch.Tensor,
                    tap: FeatureTap) -> torch.Tensor:
    """The feature each new row of a head call reads, [N, H] in out's dtype and on its device. positions: long [N]
    and mask: bool [N, start + N] on the host; pos: long [start], the position of each cached head row; out: [start,
    H], the head's own feature f at each. Position p - 1 committed (p - 1 < the target's cache length): the
    target's (tap.hidden); else the head's own at the parent row (the cached row this one attends to at position
    p - 1: a drafted node); position 0: zeros."""
    known = tap.cache_len
    feats = torch.zeros(positions.shape[0], out.shape[1], dtype=out.dtype, device=out.device)
    committed = (positions >= 1) & (positions - 1 < known)
    if bool(committed.any()):
        feats[committed.to(out.device)] = tap.hidden[positions[committed] - 1].to(out.device, out.dtype)
    own = positions - 1 >= known
    if bool(own.any()):
        parent = mask[own][:, :start] & (pos[None, :] == (positions[own] - 1)[:, None])  # [n_own, start]
        if not bool((parent.sum(1) == 1).all()):
            raise MultispecError("a drafted node's parent is not a single cached row of the head: feed a tree "
                                 "level by level (drafting/grow.py)")
        feats[own.to(out.device)] = out[parent.int().argmax(1).to(out.device)]
    return feats
