"""The compatibility matrix's architectures: tiny random-weight models of the transformers families people download,
with the feature variants that used to break decoding (a window shorter than prompt + output, a biting soft-cap,
logit scaling, ALiBi, local attention, rope scaling, tied embeddings, grouped-query attention, chunked attention).

Each entry: name -> (model_type, config overrides). `build(name)` makes the fp32 model in-process (seconds).
Used by tests/test_compat_matrix.py and scripts/write_compat_doc.py.
"""
from __future__ import annotations

import torch

VOCAB = 64
WINDOW = 6  # shorter than the matrix's prompt + output, so every sliding layer's window is crossed

_LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                   tie_word_embeddings=False)
_GPT2_LIKE = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)

ARCHS: dict[str, tuple[str, dict]] = {
    # plain attention
    "llama": ("llama", {}),
    "llama-mha": ("llama", dict(num_key_value_heads=4)),
    "llama-tied": ("llama", dict(tie_word_embeddings=True)),
    "llama-rope-linear": ("llama", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})),
    "llama-rope-llama3": ("llama", dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 32})),
    "mistral": ("mistral", dict(sliding_window=None)),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma": ("gemma", {}),
    "phi3": ("phi3", dict(partial_rotary_factor=0.5)),
    "phi": ("phi", {}),
    "olmo": ("olmo", {}),
    "olmo2": ("olmo2", {}),
    "smollm3": ("smollm3", dict(no_rope_layers=[1, 0])),
    "stablelm": ("stablelm", {}),
    "gpt2": ("gpt2", _GPT2_LIKE),
    "gpt_neox": ("gpt_neox", dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=128)),
    "gptj": ("gptj", dict(_GPT2_LIKE, rotary_dim=4)),
    "falcon": ("falcon", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              new_decoder_architecture=True, num_kv_heads=2)),
    "opt": ("opt", dict(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                        max_position_embeddings=128, word_embed_proj_dim=32)),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=32)),
    # final logit transforms
    "granite": ("granite", dict(logits_scaling=4.0)),
    "cohere": ("cohere", dict(logit_scale=4.0)),
    # sliding-window and hybrid per-layer-type caches
    "mistral-window": ("mistral", dict(sliding_window=WINDOW)),
    "qwen2-window": ("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "starcoder2-window": ("starcoder2", dict(sliding_window=WINDOW)),
    "gemma2": ("gemma2", dict(sliding_window=WINDOW, final_logit_softcapping=2.0, attn_logit_softcapping=5.0)),
    "gemma3": ("gemma3_text", dict(sliding_window=WINDOW, final_logit_softcapping=2.0,
                                   layer_types=["sliding_attention", "full_attention"])),
    "cohere2": ("cohere2", dict(sliding_window=WINDOW, logit_scale=4.0,
                                layer_types=["sliding_attention", "full_attention"])),
    "gpt_oss": ("gpt_oss", dict(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                                layer_types=["sliding_attention", "full_attention"])),
    "olmo3": ("olmo3", dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "exaone4": ("exaone4", dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "llama4_text": ("llama4_text", dict(attention_chunk_size=WINDOW, num_local_experts=2, num_experts_per_tok=1,
                                        intermediate_size_mlp=64, interleave_moe_layer_step=1,
                                        no_rope_layers=[1, 0])),
    "gemma3-multimodal": ("gemma3", dict(
        text_config=dict(_LLAMA_LIKE, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                         bos_token_id=None, eos_token_id=None, pad_token_id=0),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=63, boi_token_index=61, eoi_token_index=62)),
    "llama4": ("llama4", dict(
        text_config=dict(_LLAMA_LIKE, attention_chunk_size=WINDOW, num_local_experts=2, num_experts_per_tok=1,
                         intermediate_size_mlp=64, interleave_moe_layer_step=1, no_rope_layers=[1, 0],
                         bos_token_id=None, eos_token_id=None, pad_token_id=0),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32,
                           projector_output_dim=32),
        image_token_index=63)),
    # attention by cache row: chain methods only
    "bloom": ("bloom", dict(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)),
    "falcon-alibi": ("falcon", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    alibi=True)),
    "mpt": ("mpt", dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=128)),
    "gpt_neo-local": ("gpt_neo", dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                                      attention_types=[[["global", "local"], 1]], window_size=WINDOW,
                                      max_position_embeddings=128)),
    # recurrent / linear-attention state: refused at load
    "mamba": ("mamba", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=4)),
    "jamba": ("jamba", dict(num_experts=2, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1,
                            expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4, mamba_dt_rank=4)),
    "qwen3_next": ("qwen3_next", dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=32, linear_num_value_heads=2,
                                      linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                                      layer_types=["linear_attention", "full_attention"])),
}

# Families expected to decode every method (as opposed to chain-only or refused): the matrix asserts these.
CHAIN_ONLY = {"bloom", "falcon-alibi", "mpt", "gpt_neo-local"}
REFUSED = {"mamba", "jamba", "qwen3_next"}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """The tiny fp32 random model for `name`, with no EOS (so every run is max_new_tokens long)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides = ARCHS[name]
    kwargs = dict(_LLAMA_LIKE) if "vocab_size" not in overrides and "text_config" not in overrides else {}
    kwargs.update(overrides)
    kwargs.update(bos_token_id=None, eos_token_id=None, pad_token_id=0)
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model

# What each entry exercises, for docs/compat.md.
NOTES = {
    "llama": "grouped-query attention", "llama-mha": "multi-head attention", "llama-tied": "tied embeddings",
    "llama-rope-linear": "linear RoPE scaling", "llama-rope-llama3": "Llama 3 RoPE scaling",
    "mistral": "no window", "qwen2": "q/k/v biases", "qwen3": "q/k norms", "gemma": "norm offset, embedding scale",
    "phi3": "fused qkv / gate-up projections, partial rotary", "phi": "partial rotary, parallel block",
    "olmo": "non-parametric norm",
    "olmo2": "post-norms, q/k norms over the projection", "smollm3": "a no-RoPE layer", "stablelm": "partial rotary",
    "gpt2": "learned absolute positions, tied", "gpt_neox": "parallel residual", "gptj": "partial rotary",
    "falcon": "rotary, new decoder architecture", "opt": "learned positions with offset", "mixtral": "MoE",
    "qwen2_moe": "MoE with shared expert", "granite": "logits_scaling, residual/embedding multipliers",
    "cohere": "logit_scale", "mistral-window": f"sliding window {WINDOW} (all layers)",
    "qwen2-window": f"sliding window {WINDOW} on some layers", "starcoder2-window": f"sliding window {WINDOW}",
    "gemma2": f"sliding + full layers (window {WINDOW}), attention and final soft-caps",
    "gemma3": f"sliding + full layers (window {WINDOW}), per-type RoPE, final soft-cap",
    "llama4": "a full Llama 4 config (the released checkpoints): loads Llama4ForCausalLM",
    "gemma3-multimodal": "Gemma3ForConditionalGeneration (the released checkpoints), text prompts",
    "cohere2": f"sliding + full layers (window {WINDOW}), logit_scale",
    "gpt_oss": f"sliding + full layers (window {WINDOW}), attention sinks, MoE",
    "olmo3": f"sliding + full layers (window {WINDOW}), post-norms",
    "exaone4": f"sliding + full layers (window {WINDOW})",
    "llama4_text": f"chunked attention (chunk {WINDOW}), no-RoPE layers, MoE",
    "bloom": "ALiBi by cache row", "falcon-alibi": "ALiBi by cache row", "mpt": "ALiBi by cache row",
    "gpt_neo-local": f"local attention by cache row (window {WINDOW})",
    "mamba": "recurrent state", "jamba": "Mamba + attention hybrid", "qwen3_next": "linear + full attention hybrid",
}
assert set(NOTES) == set(ARCHS)
