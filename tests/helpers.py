"""Tiny random-init models built in-process, for tests that must not depend on ../shared."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[2] / "shared"
PYCODE = SHARED / "models" / "pycode-v1"
DATA = SHARED / "data"

needs_pycode = pytest.mark.skipif(not (PYCODE / "target").is_dir(),
                                  reason="needs ../shared/models/pycode-v1 (not present on this machine)")
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/data (not present on this machine)")


def tiny_llama(vocab: int = 16, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               seed: int = 0, scale: float = 1.0) -> torch.nn.Module:
    """A random Llama (grouped-query attention when kv_heads < heads) in fp32. `scale` multiplies the output
    embedding so that distributions are peaked enough to make drafts agree sometimes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def threads_for_tests() -> None:
    torch.set_num_threads(int(os.environ.get("MULTISPEC_TEST_THREADS", "1")))
