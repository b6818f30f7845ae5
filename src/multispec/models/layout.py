"""What a model's attention looks like, read from its config: which layers see every earlier token, which see a
sliding window or a chunk (by position distance), and whether its attention depends on cache-row order rather than
on positions (so token trees cannot be verified in one forward).

Backends build their masks from this; `load_pair` refuses, in one line, what no backend can decode exactly.
The per-layer types come from transformers' own reading of the config (`get_layer_types_and_kwargs`, the function
its `DynamicCache(config=...)` uses), so a new sliding/hybrid family needs no change here.
"""
from __future__ import annotations

from dataclasses import dataclass

from multispec.errors import MultispecError

ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention")

# Families whose state is not (only) a per-token key/value cache: keeping a tree path would need their recurrent
# state at every node. transformers reads most of them as "full_attention" when the config has no layer_types.
RECURRENT = {"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm", "recurrent_gemma", "jamba", "zamba", "zamba2",
             "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2", "lfm2_moe", "qwen3_next", "minimax",
             "plamo2", "olmo_hybrid", "kimi_linear", "qwen3_5", "qwen3_5_moe"}


@dataclass(frozen=True)
class AttentionLayout:
    """layer_types: one of ATTENTION_TYPES per decoder layer. windows: type -> window (sliding: a query at position
    q sees keys at positions k with q - k < window) or chunk size (chunked: q // chunk == k // chunk).
    tree_refusal: why tree forwards are refused (attention by cache row, not position), or None.
    max_positions: the config's max_position_embeddings, or None."""

    layer_types: tuple[str, ...]
    windows: dict
    tree_refusal: str | None
    max_positions: int | None

    @property
    def distinct_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.layer_types))


def attention_layout(config) -> AttentionLayout:
    """Read the layout from a transformers config; MultispecError (one line) for what cannot be decoded exactly."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    kind = getattr(text, "model_type", "") or getattr(config, "model_type", "")
    if kind in RECURRENT or getattr(config, "model_type", "") in RECURRENT:
        raise MultispecError(f"unsupported model type {kind!r}: its recurrent / linear-attention state cannot be "
                             "rolled back to a tree path (attention-only models are supported)")
    if getattr(text, "kv_sharing_modes", None) is not None or getattr(text, "num_kv_shared_layers", 0):
        raise MultispecError(f"unsupported model type {kind!r}: layers that share another layer's key/value cache")
    types, kwargs = get_layer_types_and_kwargs(text)
    types = [t for t in types if t != "dummy"]  # moe / mlp-only layers keep no cache
    other = sorted(set(types) - set(ATTENTION_TYPES))
    if other:
        raise MultispecError(f"unsupported model type {kind!r}: it has {', '.join(other)} layers (only attention "
                             "layers, full / sliding-window / chunked, can be rolled back to a tree path)")
    windows = {}
    for t, kw in zip(types, kwargs):
        if t != "full_attention":
            w = kw.get("sliding_window")
            if w is None:
                raise MultispecError(f"unsupported model type {kind!r}: a {t} layer without a window size")
            if windows.get(t, w) != w:
                raise MultispecError(f"unsupported model type {kind!r}: {t} layers with different window sizes")
            windows[t] = int(w)
    max_pos = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return AttentionLayout(layer_types=tuple(types), windows=windows, tree_refusal=_row_order(text, kind),
                           max_positions=int(max_pos) if max_pos else None)


def _row_order(text, kind: str) -> str | None:
    """Why this family's attention depends on cache rows rather than positions (None when it does not)."""
    if kind in ("bloom", "mpt") or getattr(text, "alibi", False) or \
            getattr(text, "position_embedding_type", None) == "alibi":
        return f"{kind} applies ALiBi biases by cache row, not by token position"
    if kind == "gpt_neo" and "local" in (getattr(text, "attention_layers", None) or []):
        return "gpt_neo's local attention layers window by cache row, not by token position"
    return None
