"""What differs between the decoder families the fast backend runs: a small spec per transformers `model_type`,
the rest read from the config. Everything else (embedding module, norms, MLP, rotary tables with their scaling,
projections) is the loaded model's own modules, so a family here costs a line, not a copied file.

Block layouts (x: the residual stream, a: attention, m: MLP):
- "pre"      x += a(n1(x)); x += m(n2(x))                              Llama, Mistral, Qwen2/3, Phi-3, SmolLM3, Granite
- "sandwich" x += n2(a(n1(x))); x += n4(m(n3(x)))                      Gemma 2, Gemma 3 (pre- and post-norms)
- "post"     x += n2(a(x)); x += n4(m(x))                              OLMo 2, OLMo 3
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """block: "pre" | "sandwich" | "post" (see the module docstring).
    qk_norm: None, "head" (q_norm / k_norm over each head's vector: Qwen3, Gemma 3) or "proj" (over the whole
    projection, before splitting into heads: OLMo 2/3). fused_qkv: one `qkv_proj` (Phi-3)."""

    block: str = "pre"
    qk_norm: str | None = None
    fused_qkv: bool = False


FAMILIES = {
    "llama": Family(),
    "mistral": Family(),
    "qwen2": Family(),
    "qwen3": Family(qk_norm="head"),
    "gemma": Family(),
    "gemma2": Family(block="sandwich"),
    "gemma3_text": Family(block="sandwich", qk_norm="head"),
    "phi3": Family(fused_qkv=True),
    "granite": Family(),
    "smollm3": Family(),
    "olmo2": Family(block="post", qk_norm="proj"),
    "olmo3": Family(block="post", qk_norm="proj"),
}

# Read from the config by the backend, whatever the family (absent or None means off):
# embedding_multiplier, residual_multiplier, logits_scaling (Granite); attn_logit_softcapping,
# final_logit_softcapping (Gemma 2/3); each attention module's `scaling` (Gemma's query_pre_attn_scalar,
# Granite's attention_multiplier) and `use_rope` (SmolLM3's no-RoPE layers); sliding / chunked windows per layer
# type (multispec.models.layout).
