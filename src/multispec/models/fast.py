"""A static-cache backend for the common decoder families (fast_families.FAMILIES), in plain torch in the manner of
gpt-fast's model.py.

Why: a transformers forward spends most of a small model's step in per-module Python overhead and cache/mask
bookkeeping. Here one step is a handful of tensor ops per layer through the loaded model's own modules (embedding,
norms, projections, MLP, rotary tables: no weight copy, every family detail they carry comes for free), and the KV
cache is one preallocated tensor per layer written at explicit rows, so keeping a path is a gather inside the cache
(Medusa-style compaction onto the prefix) and nothing is ever reallocated. Sliding / chunked layers keep every row;
their window is applied in the mask by position distance, as in the transformers backend, and the rows before the
window of a step's earliest query are not read at all (FastBackend.window_firsts). Grouped-query heads read their
key/value head's rows in place (never copied per query head), and a long step (a prefill) attends by blocks of
queries, each over the rows it can see (FastBackend.query_blocks): over a long prompt the fast backend does less
attention work than a transformers forward (benchmarks/results/fast_vs_hf_real.json).

Two parts: `FastNet`, the stateless step (one per loaded model, kept in the model's sidecar, models/sidecar.py, so
compiled code outlives a generation), and `FastBackend`, one run's cache. FastNet owns its matmuls: a float32 CPU
projection takes the few-row product at the row counts its table names (models/rows.py), the model's own layers
are never patched. `compile=True` runs steps of up to 64 tokens through
`torch.compile`d code at a few fixed sizes (models/fast_compile.py); eager otherwise.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from multispec.errors import MultispecError, check
from multispec.models.base import ForwardOut
from multispec.models.fast_families import FAMILIES
from multispec.models.int8 import QUANT_DTYPES, fused, linear_shape, weights_dtype as read_dtype
from multispec.models.layout import attention_layout
from multispec.models.reduced_vocab import VocabSubset
from multispec.models.rows import Packs, linear, signature, table as rows_table

SUPPORTED = tuple(FAMILIES)
DEFAULT_ROWS = 4096
TREE_SLACK = 256  # default rows past the position limit: a round's tree rows sit after the committed chain
GATED_MLPS = {f"{f}MLP" for f in ("Llama", "Mistral", "Qwen2", "Qwen3", "Gemma", "Gemma2", "Gemma3", "Olmo2",
                                   "Granite")}  # forward: down_proj(act_fn(gate_proj(x)) * up_proj(x))
GATED_FORWARD = GATED_MLPS | {"SmolLM3MLP", "Olmo3MLP"}  # the same forward (float models: FastNet.mlp's own products)
PREFILL_BLOCK = 256  # queries per attention block of a longer step (FastBackend.query_blocks)


def keep_rows(caches, pos: torch.Tensor | None, indices: torch.Tensor) -> int:
    """Keep rows `indices` (long [K], increasing) of per-layer caches [H, rows, D] and their positions pos [rows]
    (None: no positions): the rows after the common prefix are gathered and written down onto it, in place.
    Returns K, the new length."""
    idx = indices.tolist()
    first = 0
    while first < len(idx) and idx[first] == first:
        first += 1
    if first < len(idx):
        tail = torch.tensor(idx[first:], device=(caches[0] if pos is None else pos).device)
        end = first + len(tail)
        for cache in caches:
            cache[:, first:end] = cache.index_select(1, tail)
        if pos is not None:
            pos[first:end] = pos.index_select(0, tail)
    return len(idx)


class FastNet:
    """The step of one loaded model as plain tensor ops over its own modules, with no state of its own: the cache
    comes in as arguments, so one FastNet (and its compiled code) serves every backend over the model. The model's
    sidecar keeps it (ModelSidecar.fast_net). rows_table: the form a float32 CPU nn.Linear's product takes at
    each row count (models/rows.py; None: F.linear throughout); packs: where the packed form's copies of the
    weights are kept (the sidecar's; default: this net's own). weights_dtype: "int8" / "int4" for a quantized model
    (default read from its layers)."""

    def __init__(self, model: torch.nn.Module, rows_table: list[str] | None = None,
                 weights_dtype: str | None = None, packs: Packs | None = None):
        cfg = model.config
        check(cfg.model_type in FAMILIES,
              f"the fast backend supports {', '.join(SUPPORTED)} models, not {cfg.model_type!r}; use --backend hf")
        self.family = FAMILIES[cfg.model_type]
        self.layout = attention_layout(cfg)
        check(self.layout.tree_refusal is None, f"the fast backend cannot run this model: {self.layout.tree_refusal}")
        model.eval()  # as load_pair does: no dropout (a no-op on a loaded model)
        base = getattr(model, "model", None)
        check(all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")),
              f"the fast backend cannot read this {cfg.model_type} model's modules; use --backend hf")
        self.embed, self.layers, self.norm, self.rotary = base.embed_tokens, base.layers, base.norm, base.rotary_emb
        self.head = model.get_output_embeddings()
        check(self.head is not None and len(self.layers) == len(self.layout.layer_types),
              f"the fast backend cannot read this {cfg.model_type} model's layers; use --backend hf")
        self.vocab_size, self.hidden_size = linear_shape(self.head)  # float or int8 (models/int8.py)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden_size // self.n_heads
        self.device, self.dtype = self.embed.weight.device, self.embed.weight.dtype
        self.attend_64 = (weights_dtype or read_dtype(model)) in QUANT_DTYPES  # an int8 / int4 model: models/int8.py
        self.rows_table, self.packs = rows_table, packs if packs is not None else Packs()
        self.rope_by_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        self.embed_mult = getattr(cfg, "embedding_multiplier", None)
        self.residual_mult = getattr(cfg, "residual_multiplier", None)
        self.attn_softcap = getattr(cfg, "attn_logit_softcapping", None)
        self.final_softcap = getattr(cfg, "final_logit_softcapping", None)
        self.logits_div = getattr(cfg, "logits_scaling", None)
        types = self.layout.distinct_types
        self.mask_index = tuple(types.index(t) for t in self.layout.layer_types)  # layer -> its mask in `masks`
        self.rope_index = self.mask_index if self.rope_by_type else (0,) * len(self.layers)
        self.use_rope = tuple(getattr(layer.self_attn, "use_rope", True) for layer in self.layers)
        self.name = type(model).__name__
        self.model_config = cfg  # its _name_or_path names the model in compile progress lines
        self.compiled = {}  # device type -> fast_compile.CompiledStep

    def new_cache(self, rows: int) -> list[torch.Tensor]:
        """One [H_kv, rows, D] tensor per layer. Separate tensors, not one [L, ...] tensor: a compiled step then writes
        its rows in place (index_put on a whole input) instead of copying a functionalized layer view back."""
        return [torch.zeros(self.n_kv, rows, self.head_dim, dtype=self.dtype, device=self.device)
                for _ in self.layers]

    def masks(self, mask: torch.Tensor | None, positions: torch.Tensor, keys: torch.Tensor, start: int,
              n: int, firsts: tuple | None = None) -> tuple:
        """One bool [1, N, total - first] mask per distinct layer type (layout order), or Nones (attend to every
        cached row: a plain chain with no window). keys: the positions of cache rows [0, total). firsts: per type,
        the first cache row attended (FastBackend.window_firsts; default 0 for every type)."""
        types = self.layout.distinct_types
        if mask is None:
            if n == 1 and self.layout.windows == {}:
                return (None,) * len(types)
            mask = torch.ones(n, start + n, dtype=torch.bool, device=self.device).tril(diagonal=start)
        else:
            mask = mask.to(self.device)
        out = []
        for j, kind in enumerate(types):
            first = firsts[j] if firsts else 0
            allowed, w, ks = mask[:, first:], self.layout.windows.get(kind), keys[first:]
            if kind == "sliding_attention":
                allowed = allowed & (positions[:, None] - ks[None, :] < w)
            elif kind == "chunked_attention":
                allowed = allowed & (positions[:, None] // w == ks[None, :] // w)
            out.append(allowed[None])
        return tuple(out)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [H, N, D]; cos, sin: [N, R] with R <= D (partial rotary leaves the last D - R dims unrotated)."""
        r = cos.shape[-1]
        xr, rest = x[..., :r], x[..., r:]
        half = r // 2
        rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
        return torch.cat([xr * cos + rotated * sin, rest], dim=-1) if rest.shape[-1] else xr * cos + rotated * sin

    def attend(self, q, keys, values, mask, scale) -> torch.Tensor:
        """q: [(B,) Hq, N, D]; keys, values: [(B,) Hkv, T, D], the cache's own heads (Hq a multiple of Hkv: the query
        heads of a group share their key/value head, which is never copied); mask: bool [(B,) 1, N, T] (any shape
        that broadcasts) or None. Returns [(B,) Hq, N, D].

        Attention runs on 4D tensors: on the CPU, scaled_dot_product_attention's flash kernel takes only those (3D
        inputs fall back to the math path, 2-3x slower on a long prefill). The query heads of a group are packed
        over their key/value head ([B, Hkv, group * N, D], the mask's rows repeated per head), as transformers'
        sdpa does for a decode step: the kernel's enable_gqa with a mask falls back to the math path, which copies
        the keys to every query head (SmolLM2, 300 cached rows: a 2-token verification spent 17 ms there against
        3 ms for one token)."""
        if self.attend_64:
            return self._attend(q.double(), keys.double(), values.double(), mask, scale).to(q.dtype)
        return self._attend(q, keys, values, mask, scale)

    def _attend(self, q, keys, values, mask, scale) -> torch.Tensor:
        batched = q.dim() == 4
        if not batched:
            q, keys, values = q[None], keys[None], values[None]
            mask = None if mask is None else mask[None]
        b, hq, n, d = q.shape
        hkv = keys.shape[1]
        group = hq // hkv
        if self.attn_softcap is not None:
            qg = q.reshape(b, hkv, group * n, d)  # row g * N + i: head h * group + g, query i
            scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale  # [B, Hkv, group * N, T]
            scores = torch.tanh(scores / self.attn_softcap) * self.attn_softcap
            if mask is not None:
                scores = scores.masked_fill(~mask.repeat(1, 1, group, 1), torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            out = torch.matmul(probs, values).reshape(b, hq, n, d)
        elif group > 1:  # row g * N + i: head h * group + g, query i; its mask row is query i's
            packed = None if mask is None or mask.shape[-2] == 1 else torch.cat([mask] * group, dim=-2)
            out = F.scaled_dot_product_attention(q.reshape(b, hkv, group * n, d), keys, values,
                                                 attn_mask=mask if packed is None else packed,
                                                 scale=scale).reshape(b, hq, n, d)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
        return out if batched else out[0]

    def qkv(self, attn, h: torch.Tensor, n: int):
        """h: [N, H] -> q [Hq, N, D], k and v [Hkv, N, D], q/k normed as the family does."""
        fam = self.family
        if fam.fused_qkv:
            qkv = self.linear(attn.qkv_proj, h)
            nq, nk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
            q, k, v = qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:]
        elif self.attend_64 and (packed := fused(attn.q_proj, attn.k_proj, attn.v_proj)) is not None:
            qkv = packed.apply(h)  # a quantized model: one product for the three (models/int8.py)
            nq, nk = attn.q_proj.out_features, attn.k_proj.out_features
            q, k, v = qkv[..., :nq], qkv[..., nq:nq + nk], qkv[..., nq + nk:]
        else:
            q, k, v = self.linear(attn.q_proj, h), self.linear(attn.k_proj, h), self.linear(attn.v_proj, h)
        if fam.qk_norm == "proj":
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q.view(n, self.n_heads, self.head_dim).transpose(0, 1)
        k = k.view(n, self.n_kv, self.head_dim).transpose(0, 1)
        v = v.view(n, self.n_kv, self.head_dim).transpose(0, 1)
        if fam.qk_norm == "head":
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v

    def ropes(self, positions: torch.Tensor) -> list:
        """(cos, sin), each [N, R], per distinct layer type (one shared pair when the rotary module has no types)."""
        probe = torch.empty(0, dtype=self.dtype, device=positions.device)
        types = self.layout.distinct_types if self.rope_by_type else (None,)
        out = []
        for t in types:
            cos, sin = self.rotary(probe, positions[None], t) if t is not None else self.rotary(probe, positions[None])
            out.append((cos[0], sin[0]))
        return out

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, masks: tuple,
            k_cache: list, v_cache: list, total: int | None = None, want_hidden: bool = False,
            last_only: bool = False, head=None, firsts: tuple | None = None, blocks: tuple | None = None,
            every_hidden: bool = False):
        """Write the keys/values of `tokens` (long [N], at `positions`) into cache rows `rows` (long [N]) and return
        (float32 logits [N, V], hidden [N, H] or None). k_cache, v_cache: per layer [H_kv, S, D] (new_cache).
        Attention reads cache rows [0, total); total=None reads
        the width of the masks (the compiled path, whose masks are never None). last_only: the output layer on
        the last row only (a prefill). head: the output layer to use instead of the model's (a
        reduced_vocab.RestrictedHead's `compact`: logits [N, K] for a vocabulary subset). firsts: per distinct layer
        type, the first cache row attended (the masks start there too; default 0). blocks: attention by blocks of
        queries (FastBackend.query_blocks), each over the rows it can see, or None (all queries at once).
        every_hidden: with last_only, hidden of every row all the same (a feature head's tap)."""
        n = tokens.shape[0]
        total = masks[0].shape[-1] if total is None else total
        ropes = self.ropes(positions)
        x = self.embed_input(tokens)  # [N, H]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = self.layer_input(layer, x)
            q, k, v = self.qkv(attn, h, n)
            if self.use_rope[i]:
                cos, sin = ropes[self.rope_index[i]]
                q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            k_cache[i][:, rows] = k
            v_cache[i][:, rows] = v
            t = self.mask_index[i]
            first = firsts[t] if firsts else 0
            if blocks is None:
                keys, values = k_cache[i][:, first:total], v_cache[i][:, first:total]  # [Hkv, total - first, D]
                o = self.attend(q, keys, values, masks[t], attn.scaling)  # [Hq, N, D]
            else:
                o = torch.cat([self.attend(q[:, a:b], k_cache[i][:, lows[t]:end], v_cache[i][:, lows[t]:end],
                                           masks[t][:, a:b, lows[t] - first:end - first], attn.scaling)
                               for a, b, lows, end in blocks], dim=1)  # [Hq, N, D]
            x = self.finish_layer(layer, x, o.transpose(0, 1).reshape(n, self.n_heads * self.head_dim))
        hidden = self.norm(x[-1:] if last_only and not every_hidden else x)
        return self.logits(hidden[-1:] if last_only else hidden, head), (hidden.float() if want_hidden else None)

    def embed_input(self, tokens: torch.Tensor) -> torch.Tensor:
        """The residual stream [N, H] of token ids [N]."""
        x = self.embed(tokens)
        return x * self.embed_mult if self.embed_mult is not None else x

    def layer_input(self, layer, x: torch.Tensor) -> torch.Tensor:
        """The attention input of `layer` for the residual stream x [N, H]."""
        return x if self.family.block == "post" else layer.input_layernorm(x)

    def finish_layer(self, layer, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of a layer after attention: x [N, H] the residual stream, o [N, Hq * D] the attention output.
        Returns the layer's output [N, H] (the family's norm placement and residual multiplier)."""
        block, mult = self.family.block, self.residual_mult
        o_proj = layer.self_attn.o_proj
        whole = fused(o_proj) if self.attend_64 else None  # a quantized model: the product called directly
        a = whole.apply(o) if whole is not None else self.linear(o_proj, o)
        if block != "pre":
            a = layer.post_attention_layernorm(a)
        x = x + (a * mult if mult is not None else a)
        if block == "pre":
            m = self.mlp(layer.mlp, layer.post_attention_layernorm(x))
        elif block == "sandwich":
            m = layer.post_feedforward_layernorm(self.mlp(layer.mlp, layer.pre_feedforward_layernorm(x)))
        else:
            m = layer.post_feedforward_layernorm(self.mlp(layer.mlp, x))
        return x + (m * mult if mult is not None else m)

    def linear(self, layer, x: torch.Tensor) -> torch.Tensor:
        """layer(x), in the form the table gives x's row count (models/rows.py)."""
        return linear(layer, x, self.rows_table, self.packs)

    def mlp(self, mlp, x: torch.Tensor) -> torch.Tensor:
        """The layer's MLP on x [N, H]: for a gated MLP its computation with the products taken here (the few-row
        product; an int8 model's gate/up sharing one product, models/int8.py), else its own forward."""
        kind = type(mlp).__name__
        gate_up = fused(mlp.gate_proj, mlp.up_proj) if self.attend_64 and kind in GATED_MLPS else None
        down = fused(mlp.down_proj) if gate_up is not None else None
        if down is None:
            if self.rows_table is None:
                return mlp(x)
            if kind in GATED_FORWARD:
                return self.linear(mlp.down_proj, mlp.act_fn(self.linear(mlp.gate_proj, x))
                                   * self.linear(mlp.up_proj, x))
            if kind == "Phi3MLP":
                gate, up = self.linear(mlp.gate_up_proj, x).chunk(2, dim=-1)
                return self.linear(mlp.down_proj, up * mlp.activation_fn(gate))
            return mlp(x)
        y = gate_up.apply(x)
        n = mlp.gate_proj.out_features
        return down.apply(mlp.act_fn(y[..., :n]) * y[..., n:])

    def logits(self, hidden: torch.Tensor, head=None) -> torch.Tensor:
        """float32 logits [N, V] of final hidden states [N, H], the model's own final transforms applied. head: an
        output layer to use instead of the model's (a RestrictedHead's `compact`)."""
        logits = (self.linear(self.head, hidden) if head is None else head(hidden)).float()
        if self.logits_div is not None:
            logits = logits / self.logits_div
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


class FastBackend(VocabSubset):
    name = "fast"

    def __init__(self, model: torch.nn.Module, max_len: int | None = None, compile: bool = False, sidecar=None):
        """max_len: cache rows; size it to prompt + max_new_tokens + one round's tree. Default: the model's position
        limit (at most 4096) plus TREE_SLACK rows. max_positions: the most positions a chain can reach here, the
        smaller of the config's limit and the cache rows. compile: run steps of up to 64 tokens compiled.
        sidecar: the model's models/sidecar.ModelSidecar (its FastNet and few-row table, made once; default: made
        here for this backend alone)."""
        self.sidecar = sidecar  # also keeps the output layer's rows for a reduced vocabulary
        self.model = model  # auto's cost cache is keyed by the model (drafting/costs.model_key)
        self.weights_dtype = sidecar.weights_dtype if sidecar is not None else read_dtype(model)
        self.net = net = sidecar.fast_net() if sidecar is not None else \
            FastNet(model, rows_table=rows_table(model)[0], weights_dtype=self.weights_dtype)
        self.rows_signature = signature(net.rows_table)  # part of auto's cost key (drafting/costs.model_key)
        check(not (compile and net.attend_64), "the compiled backend does not run int8 or int4 models; use the fast "
                                               "or hf backend")
        self.layout, self.vocab_size, self.hidden_size = net.layout, net.vocab_size, net.hidden_size
        self.device, self.dtype = net.device, net.dtype
        limit = self.layout.max_positions
        self.max_len = int(max_len or min(DEFAULT_ROWS, limit or DEFAULT_ROWS) + TREE_SLACK)
        self.max_positions = min(self.max_len, limit) if limit else self.max_len
        self.name = "compiled" if compile else "fast"  # cost caches and bench labels tell them apart
        self.compiled = None
        pad = 0
        if compile:
            from multispec.models.fast_compile import BUCKETS, compiled_step

            self.compiled, pad = compiled_step(net), BUCKETS[-1]  # room to pad the last step up to a bucket
        self.k_cache, self.v_cache = net.new_cache(self.max_len + pad), net.new_cache(self.max_len + pad)
        if self.compiled is not None:
            self.compiled.prepare_cache(self.k_cache, self.v_cache)
        self.pos = torch.zeros(self.max_len + pad, dtype=torch.long, device=self.device)  # position of each row
        # the same on the host, read by window_firsts without a device sync (the same tensor on the CPU)
        self.host_pos = self.pos if self.device.type == "cpu" else torch.zeros_like(self.pos, device="cpu")
        self._len = 0
        self._chain = 0  # rows [0, _chain) hold positions 0.._chain-1 (a committed chain, in order)

    def _full_head(self):
        return self.net.head  # the compiled path computes every row and masks them

    @property
    def cache_len(self) -> int:
        return self._len

    def reset(self) -> None:
        self._len = self._chain = 0  # rows past cache_len are never attended to; no zeroing needed

    def window_firsts(self, positions: torch.Tensor) -> tuple | None:
        """Per distinct layer type, the first cache row a step whose queries sit at `positions` (long [N], on the
        host) can see, or None when the model has no sliding / chunked layers. Rows [0, _chain) hold positions
        0.._chain-1 (this step's rows included, written before attention), so those before the earliest query's
        window (sliding) or chunk (chunked) are masked for every query and are skipped, not read: a sliding layer
        attends to its window, not to the whole cache."""
        windows = self.layout.windows
        if not windows:
            return None
        q0 = int(positions.min())
        out = []
        for kind in self.layout.distinct_types:
            w = windows.get(kind)
            first = q0 - w + 1 if kind == "sliding_attention" else q0 // w * w if kind == "chunked_attention" else 0
            out.append(max(0, min(first, self._chain)))
        return tuple(out)

    def query_blocks(self, positions: torch.Tensor, mask: torch.Tensor | None, start: int) -> tuple | None:
        """A long step (a prefill) as blocks of PREFILL_BLOCK queries, each attending to the rows it can see:
        (a, b, firsts, end) for queries [a, b), rows [firsts[type], end). end = start + b holds when no query sees
        a later token of the step (a chain, a tree in node order: checked); firsts from window_firsts. So a prefill
        skips the causal mask's upper triangle in every layer and reads only the window in sliding layers, instead
        of computing a [N, N] attention of which up to half (most, past a window) is masked. None: one block."""
        n = positions.shape[0]
        if n <= PREFILL_BLOCK or (mask is not None and bool(mask[:, start:].triu(1).any())):
            return None
        zeros = (0,) * len(self.layout.distinct_types)
        return tuple((a, min(a + PREFILL_BLOCK, n), self.window_firsts(positions[a:a + PREFILL_BLOCK]) or zeros,
                      start + min(a + PREFILL_BLOCK, n)) for a in range(0, n, PREFILL_BLOCK))

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
                want_hidden: bool = False, last_only: bool = False, every_hidden: bool = False) -> ForwardOut:
        """tokens, positions: long [N]; mask: bool [N, cache_len + N], or None for a plain causal chain after all
        cached rows. Returns float32 logits [N, V] (the model's own final transforms applied); last_only: the last
        row's only ([1, V]; hidden [1, H], or [N, H] with every_hidden: a feature head's tap reads every row's)."""
        n, start = tokens.shape[0], self._len
        total = start + n
        if total > self.max_len:
            raise MultispecError(f"sequence of {total} tokens exceeds the fast backend's cache of {self.max_len} "
                                 "rows; size it with max_len")
        if self.layout.max_positions is not None and int(positions.max()) >= self.layout.max_positions:
            raise MultispecError(f"position {int(positions.max())} is past the model's limit of "
                                 f"{self.layout.max_positions} positions (max_position_embeddings)")
        host = positions.cpu()
        if self.host_pos is not self.pos:
            self.host_pos[start:total] = host
        if self._chain == start and int(host[0]) == start and (n == 1 or bool(torch.equal(
                host, torch.arange(start, total)))):
            self._chain = total
        if mask is not None and n == 1 and bool(mask.all()):
            mask = None  # one token that sees every cached row: a plain chain step, no mask built for full layers
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        self.pos[start:total] = positions
        if self.compiled is not None and self.compiled.takes(n):
            logits, hidden = self.compiled(self, tokens, positions, mask, start, want_hidden)
            if last_only:
                logits, hidden = logits[-1:], (None if hidden is None or every_hidden else hidden[-1:])
            if self.vocab_subset is not None:
                logits = self.vocab_subset.mask(logits)
        else:
            rows = torch.arange(start, total, device=self.device)
            firsts = self.window_firsts(host)
            masks = self.net.masks(mask, positions, self.pos[:total], start, n, firsts)
            subset = self.vocab_subset
            logits, hidden = self.net.run(tokens, positions, rows, masks, self.k_cache, self.v_cache, total,
                                          want_hidden, last_only, None if subset is None else subset.compact,
                                          firsts, self.query_blocks(host, mask, start), every_hidden)
            if subset is not None:
                logits = subset.widen(logits)
        self._len = total
        return ForwardOut(logits=logits, hidden=hidden)

    def warm_up(self) -> None:
        """Compile every bucket now (a no-op when eager or already compiled), leaving the cache empty."""
        if self.compiled is None:
            return
        from multispec.models.fast_compile import BUCKETS

        for b in BUCKETS:
            if b not in self.compiled.seen and b + 2 <= self.max_positions:
                # after two (zero) cached rows: a step that attends to a single row would compile a graph
                # specialised to width 1 (dynamo specialises sizes 0 and 1), which real steps never reuse
                self._len = 2
                self.pos[:2] = torch.arange(2)
                self.forward(torch.zeros(b, dtype=torch.long), torch.arange(2, 2 + b))
        self.reset()

    def keep(self, indices: torch.Tensor) -> None:
        """Keep cache rows `indices` (long [K], increasing): the rows after the common prefix are gathered and
        written down onto it, inside the preallocated cache."""
        self._len = keep_rows((*self.k_cache, *self.v_cache), self.pos, indices)
        if self.host_pos is not self.pos:
            keep_rows((), self.host_pos, indices)
        if self.layout.windows:  # the kept rows' positions, on the host: how far the ordered chain now reaches
            wrong = (self.host_pos[:self._len] != torch.arange(self._len)).nonzero()
            self._chain = int(wrong[0]) if len(wrong) else self._len
        else:
            self._chain = min(self._chain, self._len)
