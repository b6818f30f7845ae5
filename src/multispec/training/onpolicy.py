"""The target's own continuations of a prompt set (on-policy training text for a feature head, EAGLE-3's advice):
batched `generate` of the target in bfloat16 where the CPU has it, prompts grouped by length, left padded; batches
sampled at `temperature` (greedy at 0), or greedy and sampled in turn. Yields each prompt's ids followed by its continuation (cut after
the first end-of-sequence token), as soon as its batch ends, so that a caller can stop at a deadline and keep what
it has."""
from __future__ import annotations

import time
from collections.abc import Iterator

import torch


def bf16_autocast(device: torch.device | str = "cpu"):
    """bfloat16 matmuls on a GPU, or where the CPU has them (a no-op context elsewhere): feature collection and own
    text."""
    kind = torch.device(device).type
    fast = kind == "cuda" or (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=fast)


def continuations(model, prompts: list[list[int]], *, max_new: int, batch: int, temperature: float,
                  eos: list[int], pad: int, deadline: float | None = None, seed: int = 0,
                  alternate: bool = False) -> Iterator[list[int]]:
    """prompts: token id lists. Yields prompt + continuation ids (list[int]) per prompt, batch by batch, in
    length order; stops starting new batches after `deadline` (time.monotonic()), and the batch running at the
    deadline is cut there (transformers' max_time: its continuations end early). alternate: even batches
    greedy, odd ones sampled."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    torch.manual_seed(seed)
    for n, b in enumerate(range(0, len(order), batch)):
        if deadline is not None and time.monotonic() > deadline:
            return
        rows = [prompts[i] for i in order[b:b + batch]]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=model.device)  # [B, W] left padded
        att = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=model.device)
        sample = temperature > 0 and (n % 2 == 1 or not alternate)
        kw = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if sample else \
            {"do_sample": False}
        if deadline is not None:  # (one batch of a 135M model on a CPU takes minutes: it must not overrun)
            kw["max_time"] = max(0.0, deadline - time.monotonic())
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new, pad_token_id=pad,
                                 eos_token_id=eos or None, **kw)
        for r, row in zip(rows, out[:, width:].tolist()):
            cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
            yield r + row[:cut]


def builtin_prompts(tok, vocab: int, n: int, width: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """The built-in prompt set as token ids, each cut to its last `width` tokens: (up to n function openings as
    raw text, up to n instructions as one user message through the chat template when the tokenizer has one)."""
    from multispec.text import encode_chat, encode_prompt
    from multispec.training.prompts import code_prompts, instructions

    chat = bool(getattr(tok, "chat_template", None))
    code = [encode_prompt(tok, vocab, c)[-width:] for c in code_prompts(n, seed)]
    asks = [(encode_chat(tok, vocab, [{"role": "user", "content": m}]) if chat else encode_prompt(tok, vocab, m))
            [-width:] for m in instructions(n, seed)]
    return code, asks


def own_texts(pair, model, deadline: float, seed: int = 0, max_new: int = 160, batch: int = 16,
              temperature: float = 0.7, log=None, prompts: list[list[int]] | None = None,
              done: list[list[int]] | None = None, sink=None) -> list[list[int]]:
    """The target's own continuations of `prompts` (token id lists; default: the built-in prompt set,
    training/prompts.py, code openings and instructions interleaved, instructions through the chat template when
    the tokenizer has one), generated until `deadline` in bfloat16 matmuls where the CPU has them: prompt +
    continuation ids per prompt. `done`: the rows of the first len(done) prompts, generated before (a cache):
    generation goes on from the next prompt; `sink(ids)` is called on each new row as its batch ends."""
    from multispec.loading import eos_ids

    if prompts is None:
        code, asks = builtin_prompts(pair.tokenizer, model.config.vocab_size, 256, prompt_width(model, max_new), seed)
        prompts = [p for pair_ in zip(code, asks) for p in pair_]
    eos = sorted(eos_ids(pair))
    pad = eos[0] if eos else 0
    out: list[list[int]] = list(done or [])
    t0 = time.monotonic()
    for start in range(len(out), len(prompts), batch):  # a batch at a time, each cut at the deadline
        if out and time.monotonic() > deadline:
            break
        until = deadline if out else max(deadline, time.monotonic() + 1.0)  # the first batch: some text at least
        with bf16_autocast(model.device):
            rows = list(continuations(model, prompts[start:start + batch], max_new=max_new, batch=batch,
                                      temperature=temperature if (start // batch) % 2 else 0.0, eos=eos,
                                      pad=pad, seed=seed + start, deadline=until))
        for row in rows:
            if sink is not None:
                sink(row)
        out += rows
        if log is not None:
            n = sum(len(x) for x in out)
            log(f"own data: {len(out)} continuations, {n} tokens, {time.monotonic() - t0:.0f} s")
    return out


def prompt_width(model, max_new: int = 160) -> int:
    """Prompt tokens kept (the last ones) so that a prompt and its continuation fit the model's positions."""
    return min(256, (getattr(model.config, "max_position_embeddings", None) or 4096) - max_new)


def file_prompts(pair, path: str, width: int) -> list[list[int]]:
    """Token ids of a .jsonl prompt file's rows, each cut to its last `width` tokens: `prompt` (raw text, continued
    as it is, as a HumanEval prompt) or `message` (one user message through the chat template when the tokenizer
    has one)."""
    import json
    from pathlib import Path

    from multispec.errors import check
    from multispec.text import encode_chat, encode_prompt

    tok, vocab = pair.tokenizer, pair.target.config.vocab_size
    chat = bool(getattr(tok, "chat_template", None))
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        check(isinstance(row, dict) and ("prompt" in row or "message" in row),
              f"--data own:{path}: line {i + 1} has no prompt or message field")
        if "prompt" in row:
            ids = encode_prompt(tok, vocab, row["prompt"])
        elif chat:
            ids = encode_chat(tok, vocab, [{"role": "user", "content": row["message"]}])
        else:
            ids = encode_prompt(tok, vocab, row["message"])
        out.append(ids[-width:])
    return out
