"""The target's own continuations of a prompt set (on-policy training text for a feature head, EAGLE-3's advice):
batched `generate` of the target in bfloat16 where the CPU has it, prompts grouped by length, left padded; each
batch greedy or sampled at `temperature` in turn. Yields each prompt's ids followed by its continuation (cut after
the first end-of-sequence token), as soon as its batch ends, so that a caller can stop at a deadline and keep what
it has."""
from __future__ import annotations

import time
from collections.abc import Iterator

import torch


def continuations(model, prompts: list[list[int]], *, max_new: int, batch: int, temperature: float,
                  eos: list[int], pad: int, deadline: float | None = None, seed: int = 0) -> Iterator[list[int]]:
    """prompts: token id lists. Yields prompt + continuation ids (list[int]) per prompt, batch by batch, in
    length order; stops starting new batches after `deadline` (time.monotonic())."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    torch.manual_seed(seed)
    for n, b in enumerate(range(0, len(order), batch)):
        if deadline is not None and time.monotonic() > deadline:
            return
        rows = [prompts[i] for i in order[b:b + batch]]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # [B, W] left padded
        att = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        sample = temperature > 0 and n % 2 == 1
        kw = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if sample else \
            {"do_sample": False}
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new, pad_token_id=pad,
                                 eos_token_id=eos or None, **kw)
        for r, row in zip(rows, out[:, width:].tolist()):
            cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            yield r + row[:cut]
