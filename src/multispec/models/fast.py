"""A static-cache backend for the common decoder families (fast_families.FAMILIES), in plain torch in the manner of
gpt-fast's model.py.

Why: a transformers forward spends most of a small model's step in per-module Python overhead and cache/mask
bookkeeping. Here one step is a handful of tensor ops per layer through the loaded model's own modules (embedding,
norms, projections, MLP, rotary tables: no weight copy, every family detail they carry comes for free), and the KV
cache is one preallocated tensor per layer written at explicit rows, so keeping a path is a gather inside the cache
(Medusa-style compaction onto the prefix) and nothing is ever reallocated. Sliding / chunked layers keep every row;
their window is applied in the mask by position distance, as in the transformers backend.

Runs eagerly (CPU or GPU). Not done yet: capturing bucketed shapes in CUDA graphs / torch.compile.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from multispec.errors import MultispecError, check
from multispec.models.base import ForwardOut
from multispec.models.fast_families import FAMILIES
from multispec.models.layout import attention_layout

SUPPORTED = tuple(FAMILIES)
DEFAULT_ROWS = 4096
TREE_SLACK = 256  # default rows past the position limit: a round's tree rows sit after the committed chain


class FastBackend:
    name = "fast"

    def __init__(self, model: torch.nn.Module, max_len: int | None = None):
        """max_len: cache rows; size it to prompt + max_new_tokens + one round's tree. Default: the model's position
        limit (at most 4096) plus TREE_SLACK rows. max_positions: the most positions a chain can reach here, the
        smaller of the config's limit and the cache rows."""
        cfg = model.config
        check(cfg.model_type in FAMILIES,
              f"the fast backend supports {', '.join(SUPPORTED)} models, not {cfg.model_type!r}; use --backend hf")
        self.family = FAMILIES[cfg.model_type]
        self.layout = attention_layout(cfg)
        check(self.layout.tree_refusal is None, f"the fast backend cannot run this model: {self.layout.tree_refusal}")
        self.model, self.cfg = model.eval(), cfg
        base = getattr(model, "model", None)
        check(all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")),
              f"the fast backend cannot read this {cfg.model_type} model's modules; use --backend hf")
        self.embed, self.layers, self.norm, self.rotary = base.embed_tokens, base.layers, base.norm, base.rotary_emb
        self._head = model.get_output_embeddings()
        check(self._head is not None and len(self.layers) == len(self.layout.layer_types),
              f"the fast backend cannot read this {cfg.model_type} model's layers; use --backend hf")
        self.vocab_size, self.hidden_size = int(self._head.weight.shape[0]), int(self._head.weight.shape[1])
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden_size // self.n_heads
        self.device, self.dtype = self.embed.weight.device, self.embed.weight.dtype
        self._rope_by_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        self.embed_mult = getattr(cfg, "embedding_multiplier", None)
        self.residual_mult = getattr(cfg, "residual_multiplier", None)
        self.attn_softcap = getattr(cfg, "attn_logit_softcapping", None)
        self.final_softcap = getattr(cfg, "final_logit_softcapping", None)
        self.logits_div = getattr(cfg, "logits_scaling", None)
        limit = self.layout.max_positions
        self.max_len = int(max_len or min(DEFAULT_ROWS, limit or DEFAULT_ROWS) + TREE_SLACK)
        self.max_positions = min(self.max_len, limit) if limit else self.max_len
        shape = (len(self.layers), self.n_kv, self.max_len, self.head_dim)  # [L, H_kv, S, D]
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.pos = torch.zeros(self.max_len, dtype=torch.long, device=self.device)  # position of each row
        self._len = 0

    @property
    def cache_len(self) -> int:
        return self._len

    def reset(self) -> None:
        self._len = 0  # rows past cache_len are never attended to; no zeroing needed

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [H, N, D]; cos, sin: [N, R] with R <= D (partial rotary leaves the last D - R dims unrotated)."""
        r = cos.shape[-1]
        xr, rest = x[..., :r], x[..., r:]
        half = r // 2
        rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
        return torch.cat([xr * cos + rotated * sin, rest], dim=-1) if rest.shape[-1] else xr * cos + rotated * sin

    def _masks(self, mask: torch.Tensor | None, positions: torch.Tensor, start: int, n: int) -> dict:
        """bool [1, N, total] per layer type, or None (attend to every cached row: a 1-token chain, no window)."""
        total = start + n
        if mask is None:
            if n == 1 and self.layout.windows == {}:
                return {t: None for t in self.layout.distinct_types}
            mask = torch.ones(n, total, dtype=torch.bool, device=self.device).tril(diagonal=start)
        else:
            mask = mask.to(self.device)
        keys = self.pos[:total]
        out = {}
        for kind in self.layout.distinct_types:
            allowed, w = mask, self.layout.windows.get(kind)
            if kind == "sliding_attention":
                allowed = allowed & (positions[:, None] - keys[None, :] < w)
            elif kind == "chunked_attention":
                allowed = allowed & (positions[:, None] // w == keys[None, :] // w)
            out[kind] = allowed[None]
        return out

    def _attend(self, q, keys, values, mask, scale) -> torch.Tensor:
        """q: [Hq, N, D]; keys, values: [Hq, total, D]; mask: bool [1, N, total] or None. Returns [Hq, N, D]."""
        if self.attn_softcap is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * scale
        scores = torch.tanh(scores / self.attn_softcap) * self.attn_softcap
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, values)

    def _qkv(self, attn, h: torch.Tensor, n: int):
        """h: [N, H] -> q [Hq, N, D], k and v [Hkv, N, D], q/k normed as the family does."""
        fam = self.family
        if fam.fused_qkv:
            qkv = attn.qkv_proj(h)
            nq, nk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
            q, k, v = qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:]
        else:
            q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        if fam.qk_norm == "proj":
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q.view(n, self.n_heads, self.head_dim).transpose(0, 1)
        k = k.view(n, self.n_kv, self.head_dim).transpose(0, 1)
        v = v.view(n, self.n_kv, self.head_dim).transpose(0, 1)
        if fam.qk_norm == "head":
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False) -> ForwardOut:
        """tokens, positions: long [N]; mask: bool [N, cache_len + N], or None for a plain causal chain after all
        cached rows. Returns float32 logits [N, V] (the model's own final transforms applied)."""
        n, start = tokens.shape[0], self._len
        total = start + n
        if total > self.max_len:
            raise MultispecError(f"sequence of {total} tokens exceeds the fast backend's cache of {self.max_len} "
                                 "rows; size it with max_len")
        if self.layout.max_positions is not None and int(positions.max()) >= self.layout.max_positions:
            raise MultispecError(f"position {int(positions.max())} is past the model's limit of "
                                 f"{self.layout.max_positions} positions (max_position_embeddings)")
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        self.pos[start:total] = positions
        masks = self._masks(mask, positions, start, n)
        pos2 = positions[None]
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        ropes = {t: self.rotary(probe, pos2, t) if self._rope_by_type else None for t in self.layout.distinct_types}
        shared_rope = None if self._rope_by_type else self.rotary(probe, pos2)
        x = self.embed(tokens)  # [N, H]
        if self.embed_mult is not None:
            x = x * self.embed_mult
        group, block = self.n_heads // self.n_kv, self.family.block
        for i, layer in enumerate(self.layers):
            kind = self.layout.layer_types[i]
            attn = layer.self_attn
            h = x if block == "post" else layer.input_layernorm(x)
            q, k, v = self._qkv(attn, h, n)
            if getattr(attn, "use_rope", True):
                cos, sin = ropes[kind] if self._rope_by_type else shared_rope  # [1, N, R]
                q, k = self._rotate(q, cos[0], sin[0]), self._rotate(k, cos[0], sin[0])
            self.k_cache[i, :, start:total] = k
            self.v_cache[i, :, start:total] = v
            keys, values = self.k_cache[i, :, :total], self.v_cache[i, :, :total]  # [Hkv, total, D]
            if group > 1:
                keys = keys.repeat_interleave(group, dim=0)
                values = values.repeat_interleave(group, dim=0)
            o = self._attend(q, keys, values, masks[kind], attn.scaling)  # [Hq, N, D]
            a = attn.o_proj(o.transpose(0, 1).reshape(n, self.n_heads * self.head_dim))
            if block != "pre":
                a = layer.post_attention_layernorm(a)
            x = x + (a * self.residual_mult if self.residual_mult is not None else a)
            if block == "pre":
                m = layer.mlp(layer.post_attention_layernorm(x))
            elif block == "sandwich":
                m = layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
            else:
                m = layer.post_feedforward_layernorm(layer.mlp(x))
            x = x + (m * self.residual_mult if self.residual_mult is not None else m)
        hidden = self.norm(x)
        self._len = total
        logits = self._head(hidden).float()
        if self.logits_div is not None:
            logits = logits / self.logits_div
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
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
            self.pos[first:end] = self.pos.index_select(0, tail)
        self._len = len(idx)
