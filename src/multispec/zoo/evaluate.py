"""Measure zoo models: held-out loss of one model, and draft/target agreement of a pair.

Agreement is measured teacher-forced on a fixed token sequence, at every position that predicts a scored token:
greedy agreement is the fraction of positions where argmax p == argmax q, and alpha_T1 is the mean of
sum_v min(p_v, q_v) at temperature 1 (the expected acceptance of one draft token; p = target, q = draft).
"""
import contextlib
import gzip
import json
import os
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from multispec.errors import MultispecError
from multispec.zoo.data import EOT_ID

HUMANEVAL_FILE = "humaneval.jsonl.gz"


def load_model(path: str | Path):
    """A zoo (or any HF causal LM) directory as (model fp32 eval on CPU, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise MultispecError(f"not a model directory (no config.json): {path}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


def encode_documents(tok, docs: list[str]) -> np.ndarray:
    """int64 [N] ids: EOT, doc, EOT, doc, ... (the layout the zoo trains on)."""
    ids: list[int] = []
    for d in docs:
        ids.append(EOT_ID)
        ids += tok(d, add_special_tokens=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64)


@torch.no_grad()
def heldout_loss(model, ids: np.ndarray, block_size: int = 256, batch_size: int = 8, device=None,
                 autocast=None) -> dict:
    """Cross-entropy in nats/token over ids [N], in non-overlapping windows of block_size (the training loop's
    final held-out loss uses this too). device: where the windows go (default: the model's); autocast: an optional
    autocast context for the forward."""
    n = (len(ids) - 1) // block_size
    if n == 0:
        raise MultispecError(f"held-out text has {len(ids)} tokens, fewer than one window of {block_size}")
    device = device if device is not None else next(model.parameters()).device
    autocast = autocast if autocast is not None else contextlib.nullcontext()
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        starts = range(i * block_size, min(n, i + batch_size) * block_size, block_size)
        xy = torch.stack([torch.from_numpy(ids[s:s + block_size + 1].astype(np.int64)) for s in starts])  # [b, T+1]
        x, y = xy[:, :-1].to(device), xy[:, 1:].to(device)  # [b, T] each
        with autocast:
            logits = model(input_ids=x, use_cache=False).logits.float()  # [b, T, V]
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    return {"loss": total / count, "tokens": count}


@torch.no_grad()
def agreement(target, draft, sequences: list[tuple[torch.Tensor, int]]) -> dict:
    """Teacher-forced agreement over sequences.

    sequences: (ids int64 [L], start) pairs; positions start-1 .. L-2 are scored (they predict ids[start:]).
    Returns greedy agreement, mean sum(min(p, q)) at T=1 (p = target, q = draft), and the number of positions.
    """
    agree, alpha, count = 0.0, 0.0, 0
    for ids, start in sequences:
        if start < 1 or start >= len(ids):
            continue
        x = ids[None]  # [1, L]
        p = torch.softmax(target(input_ids=x, use_cache=False).logits[0, start - 1:-1].float(), dim=-1)  # [S, V] target
        q = torch.softmax(draft(input_ids=x, use_cache=False).logits[0, start - 1:-1].float(), dim=-1)  # [S, V] draft
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
        alpha += torch.minimum(p, q).sum(-1).sum().item()
        count += p.shape[0]
    if count == 0:
        raise MultispecError("agreement: no positions to score")
    return {"greedy_agreement": agree / count, "alpha_T1": alpha / count, "positions": count}


def humaneval_prompts(data_dir: str | Path | None) -> list[str]:
    """The `prompt` fields of humaneval.jsonl.gz in data_dir (or $MULTISPEC_DATA)."""
    data_dir = data_dir or os.environ.get("MULTISPEC_DATA")
    if not data_dir:
        raise MultispecError("humaneval: give --data-dir or set MULTISPEC_DATA "
                             "to the folder holding humaneval.jsonl.gz")
    f = Path(data_dir) / HUMANEVAL_FILE
    if not f.is_file():
        raise MultispecError(f"humaneval: {f} not found")
    with gzip.open(f, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["prompt"] for line in fh if line.strip()]


@torch.no_grad()
def greedy_continuations(target, tok, prompts: list[str], new_tokens: int) -> list[tuple[torch.Tensor, int]]:
    """(ids int64 [L], start) per prompt: EOT + prompt + the target's greedy continuation (scored from start).

    Prompts are left-truncated so that prompt + continuation fits the context the model was trained on
    (config.max_position_embeddings); RoPE positions beyond it are out of distribution.
    """
    ctx = target.config.max_position_embeddings - new_tokens
    if ctx < 1:
        raise MultispecError(f"--new-tokens {new_tokens} does not fit the model context "
                             f"{target.config.max_position_embeddings}")
    out = []
    for prompt in tqdm(prompts, desc="greedy continuations", unit="prompt"):
        ids = torch.tensor([([EOT_ID] + tok(prompt, add_special_tokens=False)["input_ids"])[-ctx:]])  # [1, P]
        gen = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=EOT_ID)
        out.append((gen[0], ids.shape[1]))
    return out


def heldout_windows(ids: np.ndarray, block_size: int, max_windows: int) -> list[tuple[torch.Tensor, int]]:
    """Non-overlapping windows of held-out ids, scored from position 1."""
    n = min(max_windows, (len(ids) - 1) // block_size)
    return [(torch.from_numpy(ids[i * block_size:(i + 1) * block_size]), 1) for i in range(n)]
