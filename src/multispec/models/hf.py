"""A backend for any attention-only transformers causal LM (AutoModelForCausalLM), through its own forward.

Supported: transformers 5.x (tested with 5.23 and 5.24; the cache argument's two names: models/hf_compat.py). The cache is a plain `DynamicCache()` (every layer a `DynamicLayer`
holding all rows, [B, heads, seq, head_dim]) and the backend records the position of every row. Sliding-window and
chunked layers (Mistral, Gemma 2/3, gpt-oss, Llama 4, ...) keep all rows too; their window is applied in the mask, by
position distance, one 4D additive mask per layer type (a dict when the model mixes types, as transformers 5.x
accepts). So keeping a tree path is the same gather for every layer, and tree rows never confuse a window.

Logits are the model's own output (final soft-cap, logit scaling, whatever its `forward` does); the last hidden
state is the input of its output embedding, caught by a hook only when asked for.

Models whose attention depends on cache rows rather than positions (ALiBi by row, GPT-Neo local layers) run plain
chains only; a tree forward is refused with one line before any token is produced.
"""
from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from multispec.errors import MultispecError
from multispec.models.base import ForwardOut
from multispec.models.hf_compat import cache_argument
from multispec.models.int8 import linear_shape
from multispec.models.layout import AttentionLayout, attention_layout
from multispec.models.reduced_vocab import VocabSubset


class HFBackend(VocabSubset):
    """Wraps a loaded `PreTrainedModel` (causal LM). One instance owns one KV cache; batch size 1."""

    name = "hf"

    def __init__(self, model: torch.nn.Module, layout: AttentionLayout | None = None, sidecar=None):
        """sidecar: the model's models/sidecar.ModelSidecar (its weights' dtype, its output layer's rows for a
        reduced vocabulary); default a fresh one. The model runs as transformers runs it."""
        from multispec.models.sidecar import ModelSidecar

        self.sidecar = sidecar if sidecar is not None else ModelSidecar(model)
        self.weights_dtype, self.rows_signature = self.sidecar.weights_dtype, ""  # cost keys: stock layers
        self.model = model.eval()
        self.config = model.config
        self.layout = layout or attention_layout(model.config)
        self.max_positions = self.layout.max_positions
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._head = model.get_output_embeddings()
        self.vocab_size, self.hidden_size = linear_shape(self._head)  # float or int8 (models/int8.py)
        # transformers' causal LMs take logits_to_keep (output layer on the last rows only); custom code may not
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._cache_arg = cache_argument(model)  # "cache" (transformers >= 5.24) or "past_key_values"
        self.cache: DynamicCache | None = None
        self._pos = torch.zeros(0, dtype=torch.long)  # position of each cache row (CPU: no device sync)
        self._rows_are_positions = True  # row i holds position i (a plain chain): the model's own masks are right
        self.reset()

    def _full_head(self):
        return self._head

    def _check_vocab_subset(self) -> None:
        """The subset takes the base model's last hidden state through the subset's rows of the output layer: refused
        in one line for models that transform their logits after that layer (soft-capping, scaling), whose forward
        this would bypass, and for models without a separate base model."""
        scaled = [a for a in ("final_logit_softcapping", "logits_scaling", "logit_scale", "output_multiplier_scale")
                  if getattr(self.config, a, None) not in (None, 1, 1.0)]
        if scaled:
            raise MultispecError(f"a reduced draft vocabulary on the hf backend needs logits straight from the "
                                 f"output layer; this {self.config.model_type} model applies {scaled[0]}: use "
                                 f"--backend fast or the full vocabulary")
        if getattr(self.model, "base_model", None) is None or self.model.base_model is self.model:
            raise MultispecError(f"{type(self.model).__name__} has no separate base model to take hidden states "
                                 "from, so its draft vocabulary cannot be reduced; use the full vocabulary")

    @property
    def cache_len(self) -> int:
        return int(self._pos.shape[0])

    def reset(self) -> None:
        self.cache = DynamicCache()  # plain layers only, whatever the config says: windows live in the mask
        self._pos = self._pos[:0]
        self._rows_are_positions = True

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False, last_only: bool = False) -> ForwardOut:
        """tokens, positions: long [N]; mask: bool [N, cache_len + N], or None for a plain causal chain after all
        cached rows (the cheap path: the model builds its own mask, none at all for a 1-token decode).
        Returns float32 logits [N, V] and, if asked, the last hidden state float32 [N, H]; last_only: the last
        row's only ([1, V], [1, H]), the output layer skipped for the others (where the model takes
        logits_to_keep; otherwise every row, of which the caller reads the last)."""
        n, start = tokens.shape[0], self.cache_len
        positions = positions.cpu()
        if self.max_positions is not None and int(positions.max()) >= self.max_positions:
            raise MultispecError(f"position {int(positions.max())} is past the model's limit of "
                                 f"{self.max_positions} positions (max_position_embeddings)")
        contiguous = self._continues_rows(positions, n)
        chain = contiguous and (mask is None or (self.layout.tree_refusal is not None and
                                                 bool(torch.equal(mask.cpu(), _chain_mask(start, n, "cpu")))))
        if chain:
            attn = None
        elif self.layout.tree_refusal:
            raise MultispecError(f"tree methods are not supported for this model: {self.layout.tree_refusal}; "
                                 "use method ar or sd")
        else:
            if mask is None:
                mask = _chain_mask(start, n, self.device)
            attn = self._masks(mask.to(self.device), positions.to(self.device))
        if self.vocab_subset is not None:
            return self._forward_subset(tokens, positions, attn, want_hidden, last_only, contiguous)
        captured = []
        hook = self._head.register_forward_pre_hook(lambda _m, args: captured.append(args[0])) if want_hidden \
            else None
        try:
            out = self.model(input_ids=tokens.to(self.device)[None], position_ids=positions.to(self.device)[None],
                             attention_mask=attn, use_cache=True, **{self._cache_arg: self.cache},
                             **({"logits_to_keep": 1} if last_only and self._keeps_logits else {}))
        finally:
            if hook is not None:
                hook.remove()
        self._pos = torch.cat([self._pos, positions])
        self._rows_are_positions = contiguous
        if want_hidden and not captured:
            raise MultispecError(f"{type(self.model).__name__} does not call its output embedding in forward, so "
                                 "its last hidden state is not available (needed by heads); use a method without one")
        hidden = captured[0][0].float() if want_hidden else None
        return ForwardOut(logits=out.logits[0].float(), hidden=hidden)

    def _forward_subset(self, tokens, positions, attn, want_hidden: bool, last_only: bool,
                        contiguous: bool) -> ForwardOut:
        """forward's path with a vocabulary subset: the base model, then the subset's rows of the output layer."""
        out = self.model.base_model(input_ids=tokens.to(self.device)[None],
                                    position_ids=positions.to(self.device)[None], attention_mask=attn,
                                    use_cache=True, **{self._cache_arg: self.cache})
        hidden = out.last_hidden_state[0]  # [N, H]
        if last_only:
            hidden = hidden[-1:]
        logits = self.vocab_subset.widen(self.vocab_subset.compact(hidden))
        self._pos = torch.cat([self._pos, positions])
        self._rows_are_positions = contiguous
        return ForwardOut(logits=logits, hidden=hidden.float() if want_hidden else None)

    def _continues_rows(self, positions: torch.Tensor, n: int) -> bool:
        """Will every row still hold its own index as position (cache rows 0..cache_len-1 do, and these tokens
        take positions cache_len..cache_len+n-1)? Then the model's own row-based masks are right."""
        if not self._rows_are_positions:
            return False
        start = self.cache_len
        if n == 1:
            return int(positions[0]) == start
        return bool(torch.equal(positions, torch.arange(start, start + n)))

    def _masks(self, mask: torch.Tensor, positions: torch.Tensor):
        """Additive [1, 1, N, cache_len + N] mask per layer type: the given mask, narrowed by each type's window
        measured in positions. One tensor when the model has one layer type, else a dict type -> mask."""
        keys = torch.cat([self._pos.to(self.device), positions]) if self.layout.windows else None  # [cache_len+N]
        masks = {}
        for kind in self.layout.distinct_types:
            allowed = mask
            w = self.layout.windows.get(kind)
            if kind == "sliding_attention":
                allowed = allowed & (positions[:, None] - keys[None, :] < w)
            elif kind == "chunked_attention":
                allowed = allowed & (positions[:, None] // w == keys[None, :] // w)
            additive = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
            masks[kind] = additive.masked_fill_(~allowed, torch.finfo(self.dtype).min)[None, None]
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def keep(self, indices: torch.Tensor) -> None:
        """Keep cache rows `indices` (long [K], increasing), dropping the rest: a crop when they are a prefix,
        else the prefix plus a gather of the tail, in every layer alike."""
        idx = indices.tolist()
        first = 0
        while first < len(idx) and idx[first] == first:
            first += 1
        tail_cpu = torch.tensor(idx[first:], dtype=torch.long)
        tail = tail_cpu.to(self.device)
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            if first == len(idx):
                layer.keys, layer.values = layer.keys[..., :first, :], layer.values[..., :first, :]
            else:
                layer.keys = torch.cat([layer.keys[..., :first, :], layer.keys.index_select(-2, tail)], dim=-2)
                layer.values = torch.cat([layer.values[..., :first, :], layer.values.index_select(-2, tail)],
                                         dim=-2)
        self._pos = torch.cat([self._pos[:first], self._pos[tail_cpu]]) if first < len(idx) else self._pos[:first]
        # rows are positions again when the kept rows hold positions 0..K-1 (a tree path kept onto its prefix)
        k = len(idx)
        self._rows_are_positions = k == 0 or (int(self._pos[-1]) == k - 1 and bool(torch.equal(self._pos,
                                                                                             torch.arange(k))))


def _chain_mask(start: int, n: int, device) -> torch.Tensor:
    """bool [n, start + n]: every cached row plus the new tokens causally."""
    return torch.ones(n, start + n, dtype=torch.bool, device=device).tril(diagonal=start)
