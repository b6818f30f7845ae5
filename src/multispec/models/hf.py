"""A backend for any transformers causal LM (AutoModelForCausalLM), through the public cache and 4D-mask APIs.

Supported: transformers 5.x (tested with 5.23): `DynamicCache` whose `layers[i].keys/values` are
[B, heads, seq, head_dim] tensors, a custom 4D additive mask passed as `attention_mask` (used as-is), and explicit
`position_ids`. Models whose cache layers are not plain dynamic layers (sliding-window or hybrid caches) are refused.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from multispec.errors import MultispecError
from multispec.models.base import ForwardOut
from multispec.tree import additive_mask


class HFBackend:
    """Wraps a loaded `PreTrainedModel` (causal LM). One instance owns one KV cache; batch size 1."""

    name = "hf"

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval()
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(model.get_output_embeddings().weight.shape[1])
        self._base = model.base_model
        self._head = model.get_output_embeddings()
        self.cache: DynamicCache | None = None
        self._len = 0
        self.reset()

    @property
    def cache_len(self) -> int:
        return self._len

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.config)
        self._len = 0

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, want_hidden: bool = False
    ) -> ForwardOut:
        """tokens, positions: long [N]; mask: bool [N, cache_len + N]. Returns float32 logits [N, V]."""
        n = tokens.shape[0]
        assert mask.shape == (n, self._len + n), (mask.shape, self._len, n)
        attn = additive_mask(mask.to(self.device), self.dtype)[None, None]  # [1, 1, N, cache+N]
        out = self._base(
            input_ids=tokens.to(self.device)[None],
            position_ids=positions.to(self.device)[None],
            attention_mask=attn,
            past_key_values=self.cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state[0]  # [N, H]
        logits = self._head(hidden).float()
        self._len += n
        return ForwardOut(logits=logits, hidden=hidden.float() if want_hidden else None)

    def keep(self, indices: torch.Tensor) -> None:
        """Keep cache rows `indices` (long [K], increasing), dropping the rest: gather the tail, crop the cache."""
        idx = indices.tolist()
        first = 0
        while first < len(idx) and idx[first] == first:
            first += 1
        if first == len(idx):  # pure crop
            drop = self._len - len(idx)
            if drop:
                self.cache.crop(-drop)
        else:
            tail = torch.tensor(idx[first:], device=self.device)
            for layer in self.cache.layers:
                if type(layer) is not DynamicLayer:
                    raise MultispecError(f"unsupported cache layer {type(layer).__name__}: only plain dynamic caches")
                layer.keys = torch.cat([layer.keys[..., :first, :], layer.keys.index_select(-2, tail)], dim=-2)
                layer.values = torch.cat([layer.values[..., :first, :], layer.values.index_select(-2, tail)], dim=-2)
        self._len = len(idx)
