"""Real pretrained models, loaded from their GGUF files through `load_pair` (issue 36, item 4): every lossless
draft-free method gives transformers' own greedy `generate` output exactly, on both backends, with and without the
chat template. The models come from scripts/fetch_models.py (tests/real_models.py finds them); each test skips,
saying why and how to get them, when they are absent. The first load of a file dequantizes it into multispec's
cache (about 30 s for SmolLM2); later ones read the cache."""
from __future__ import annotations

import pytest
import torch

import multispec
import real_models

pytestmark = pytest.mark.slow
MAX_NEW = 16
PROMPTS = ["Write a Python function that returns the square of a number.",
           "What is the capital of France? Answer in one sentence."]
METHODS = ["ar", "lookup", "suffix", "auto"]


def prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    """The prompt as the model's users send it: through its chat template with the generation prompt (as vLLM's
    LLM.chat and transformers' pipelines do), or as plain text."""
    if chat:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                  return_dict=False))
    return list(tokenizer(prompt).input_ids)


def reference(pair, ids: list[int]) -> list[int]:
    """transformers' greedy generate on the same weights: the new tokens (an end token it ends on included), ending
    at the tokens multispec ends at (loading.eos_ids: for a GGUF file, the generation config's and llama.cpp's
    end-of-generation tokens), given as transformers takes several."""
    from multispec.loading import eos_ids

    with torch.inference_mode():
        out = pair.target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=pair.tokenizer.eos_token_id,
                                   eos_token_id=sorted(eos_ids(pair)))
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct from its GGUF file, and transformers' greedy output for each prompt (with and without
    the chat template), computed once."""
    pair = multispec.load_pair(target=str(real_models.smollm2()), device="cpu")
    cases = [prompt_ids(pair.tokenizer, p, chat) for p in PROMPTS for chat in (True, False)]
    return pair, [(ids, reference(pair, ids)) for ids in cases]


def test_smollm2_comes_with_its_tokenizer_chat_template_and_generation_config(smollm2):
    pair, _ = smollm2
    assert pair.tokenizer.chat_template and len(pair.tokenizer) == 49152
    assert pair.target.generation_config.eos_token_id == 2 and pair.target.dtype == torch.float32
    assert pair.target_path.endswith(".gguf")


@pytest.mark.parametrize("backend", ["hf", "fast"])
@pytest.mark.parametrize("method", METHODS)
def test_smollm2_greedy_output_is_transformers_own(smollm2, method, backend):
    pair, cases = smollm2
    for ids, expected in cases:
        got = multispec.generate(pair, ids, method=method, backend=backend, max_new_tokens=MAX_NEW, temperature=0)
        assert got.token_ids == expected, (method, backend, pair.tokenizer.decode(ids))


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_gemma_greedy_output_is_transformers_own(backend):
    """Gemma 3 270M (sliding-window layers, a 262k vocabulary): ar and auto, one prompt (its GGUF file, a base
    model's, has no chat template)."""
    pair = multispec.load_pair(target=str(real_models.gemma()), device="cpu")
    for chat in (True, False) if pair.tokenizer.chat_template else (False,):
        ids = prompt_ids(pair.tokenizer, PROMPTS[1], chat)
        expected = reference(pair, ids)
        for method in ("ar", "auto"):
            got = multispec.generate(pair, ids, method=method, backend=backend, max_new_tokens=MAX_NEW, temperature=0)
            assert got.token_ids == expected, (method, backend, chat)


@pytest.mark.parametrize("options", [{"method": "eagle", "k": 4, "confidence": 0.2},
                                     {"method": "eagle", "tree": (2, 2, 1)},
                                     {"method": "auto", "proposers": "draft"}])
def test_smollm2_with_its_shipped_head_is_transformers_own(smollm2, options):
    """The head that ships for SmolLM2 (found by the GGUF target's fingerprint) drafts, and greedy output stays
    transformers' own; it accepts some of its drafts on these prompts."""
    pair, cases = smollm2
    accepted = 0
    for ids, expected in cases:
        got = multispec.generate(pair, ids, head="shipped", backend="fast", max_new_tokens=MAX_NEW, temperature=0,
                                 **options)
        assert got.token_ids == expected, (options, pair.tokenizer.decode(ids))
        accepted += got.stats["num_accepted_draft_tokens"]
    assert accepted > 0, options
