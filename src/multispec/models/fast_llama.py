"""A static-cache backend for Llama-family models (Llama, TinyLlama, Mistral-style grouped-query attention,
Qwen2-style q/k/v biases), written in plain torch in the manner of gpt-fast's model.py.

Why: a transformers forward spends most of a small model's step in per-module Python overhead. Here one step is
a handful of tensor ops per layer over weights borrowed from the loaded transformers model (no copy), and the KV
cache is one preallocated tensor per layer written at explicit rows, so keeping a path is a gather inside the
cache (Medusa-style compaction onto the prefix) and nothing is ever reallocated.

Runs eagerly (CPU or GPU). Not done yet: capturing bucketed shapes in CUDA graphs / torch.compile.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multispec.errors import MultispecError, check
from multispec.models.base import ForwardOut

SUPPORTED = ("llama", "mistral", "qwen2")


class FastLlamaBackend:
    name = "fast"

    def __init__(self, model: torch.nn.Module, max_len: int = 4096):
        cfg = model.config
        check(cfg.model_type in SUPPORTED,
              f"the fast backend supports {', '.join(SUPPORTED)} models, not {cfg.model_type!r}; use --backend hf")
        rope = getattr(cfg, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        check(rope_type == "default", f"the fast backend has no rope scaling of type {rope_type!r}; use --backend hf")
        window = getattr(cfg, "sliding_window", None)
        check(not window or getattr(cfg, "use_sliding_window", True) is False or window >= max_len,
              "the fast backend has no sliding-window attention; use --backend hf")
        self.model = model.eval()
        base = model.base_model
        self.embed = base.embed_tokens.weight
        self.layers = base.layers
        self.norm = base.norm
        self.head = model.get_output_embeddings().weight
        self.vocab_size, self.hidden_size = int(self.head.shape[0]), int(self.head.shape[1])
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        self.device, self.dtype = self.embed.device, self.embed.dtype
        self.max_len = max_len
        theta = getattr(cfg, "rope_theta", None) or (rope.get("rope_theta") if isinstance(rope, dict) else None) \
            or 10000.0
        inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.inv_freq = inv_freq.to(self.device)
        shape = (len(self.layers), self.n_kv, max_len, self.head_dim)  # [L, H_kv, S, D]
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._len = 0

    @property
    def cache_len(self) -> int:
        return self._len

    def reset(self) -> None:
        self._len = 0  # rows past cache_len are never attended to; no zeroing needed

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None]  # [N, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [N, D]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _rms(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                want_hidden: bool = False) -> ForwardOut:
        """tokens, positions: long [N]; mask: bool [N, cache_len + N]. Returns float32 logits [N, V]."""
        n, start = tokens.shape[0], self._len
        total = start + n
        if total > self.max_len:
            raise MultispecError(f"sequence of {total} tokens exceeds the fast backend's cache of {self.max_len}")
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        attn_mask = mask.to(self.device)[None]  # [1, N, total] bool, broadcast over heads
        cos, sin = self._rope(positions)  # [N, D]
        x = F.embedding(tokens, self.embed)  # [N, H]
        group = self.n_heads // self.n_kv
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = self._rms(x, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
            q = attn.q_proj(h).view(n, self.n_heads, self.head_dim).transpose(0, 1)  # [Hq, N, D]
            k = attn.k_proj(h).view(n, self.n_kv, self.head_dim).transpose(0, 1)  # [Hkv, N, D]
            v = attn.v_proj(h).view(n, self.n_kv, self.head_dim).transpose(0, 1)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            self.k_cache[i, :, start:total] = k
            self.v_cache[i, :, start:total] = v
            keys, values = self.k_cache[i, :, :total], self.v_cache[i, :, :total]  # [Hkv, total, D]
            if group > 1:
                keys = keys.repeat_interleave(group, dim=0)
                values = values.repeat_interleave(group, dim=0)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask)  # [Hq, N, D]
            x = x + attn.o_proj(o.transpose(0, 1).reshape(n, self.n_heads * self.head_dim))
            h = self._rms(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
            mlp = layer.mlp
            x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        hidden = self._rms(x, self.norm.weight, self.norm.variance_epsilon)
        self._len = total
        logits = F.linear(hidden, self.head).float()
        return ForwardOut(logits=logits, hidden=hidden.float() if want_hidden else None)

    def keep(self, indices: torch.Tensor) -> None:
        """Keep cache rows `indices` (long [K], increasing): the rows after the common prefix are gathered and
        written down onto it, inside the preallocated cache."""
        idx = indices.tolist()
        first = 0
        while first < len(idx) and idx[first] == first:
            first += 1
        if first < len(idx):
            tail = torch.tensor(idx[first:], device=self.device)
            end = first + len(tail)
            self.k_cache[:, :, first:end] = self.k_cache.index_select(2, tail)
            self.v_cache[:, :, first:end] = self.v_cache.index_select(2, tail)
        self._len = len(idx)
