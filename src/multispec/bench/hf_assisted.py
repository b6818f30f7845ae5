"""transformers' assisted generation as a benchmark baseline: `target.generate(assistant_model=draft)`.

Same models (and dtype) as the multispec methods, same BOS-prefixed prompt ids, same EOS set and logit processing
(top-k is passed explicitly, 0 when unset, because transformers otherwise applies its default top_k=50 when sampling).
The draft's generation_config is replaced by a copy for each call and restored afterwards, so the
values transformers adapts and writes back (num_assistant_tokens, assistant_confidence_threshold) never leak from one
prompt to the next, and the user's objects are left as they were (style §2.12).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers.utils import logging as hf_logging

from multispec.sampling import SamplingConfig


@dataclass
class HFCounts:
    """new_tokens; target_calls: target forwards (the first also consumes the prompt: transformers has no separate
    prefill); draft_calls: draft forwards, one per drafted token; effective: the assistant settings after the call."""

    new_tokens: int
    target_calls: int
    draft_calls: int
    effective: dict


def hf_assisted_generate(target: torch.nn.Module, draft: torch.nn.Module, ids: list[int], sampling: SamplingConfig,
                         max_new_tokens: int, seed: int, eos_ids: set[int],
                         num_assistant_tokens: int | None = None,
                         tokenizers: tuple | None = None) -> tuple[list[int], HFCounts]:
    """One assisted generation. ids: prompt token ids (BOS included). num_assistant_tokens=None keeps transformers'
    defaults; N sets num_assistant_tokens=N with the constant schedule. tokenizers: (target's, draft's) for a draft
    of another tokenizer: transformers' universal assisted generation. Returns (new token ids, counts)."""
    saved = draft.generation_config
    gc = copy.deepcopy(saved)
    if num_assistant_tokens is not None:
        gc.num_assistant_tokens = num_assistant_tokens
        gc.num_assistant_tokens_schedule = "constant"
    calls = {"target": 0, "draft": 0}

    def counter(key):
        def hook(module, args, kwargs):
            calls[key] += 1
        return hook

    hooks = [target.register_forward_pre_hook(counter("target"), with_kwargs=True),
             draft.register_forward_pre_hook(counter("draft"), with_kwargs=True)]
    draft.generation_config = gc
    device = next(target.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # [1, S]
    eos = sorted(eos_ids)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=not sampling.greedy,
                  eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0,
                  attention_mask=torch.ones_like(input_ids))
    if tokenizers is not None:
        kwargs.update(tokenizer=tokenizers[0], assistant_tokenizer=tokenizers[1])
    if not sampling.greedy:
        kwargs.update(temperature=float(sampling.temperature), top_k=sampling.top_k or 0,
                      top_p=1.0 if sampling.top_p is None else float(sampling.top_p))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the assistant's inner generate() warns about its own generation_config
    try:
        torch.manual_seed(seed)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(seed)
        with torch.inference_mode():
            out = target.generate(input_ids, assistant_model=draft, **kwargs)
    finally:
        draft.generation_config = saved
        hf_logging.set_verbosity(verbosity)
        for h in hooks:
            h.remove()
    new = out[0, len(ids):].tolist()
    defaults = gc._get_default_generation_params()  # what transformers fills in for unset (None) values
    effective = {k: getattr(gc, k) if getattr(gc, k) is not None else defaults.get(k)
                 for k in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    return new, HFCounts(new_tokens=len(new), target_calls=calls["target"], draft_calls=calls["draft"],
                         effective=effective)
