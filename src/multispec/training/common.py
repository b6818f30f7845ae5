"""Helpers shared by the trained heads (SpecDec++ acceptance head, P1 decision models).

Small and stable on purpose; every function is pure apart from the models it is handed:
- `encode_prompt`: prompt text -> ids exactly as `multispec.generate` encodes it (the tokenizer's own
  special tokens, e.g. a BOS its post-processor adds), left-truncated.
- `sample_responses`: batched target continuations (left-padded, KV-cached) with multispec's logit processing.
- `teacher_forced_probs`: processed next-token distributions of a model over a known continuation.
- `last_hidden`: a draft's final hidden states (after the final norm), the features every head reads.
- `binary_kl`: mean KL(y || p) between soft labels and predictions.
- `reliability_diagram`: predicted vs empirical acceptance in bins, as a table and a PNG.
- `progress`: one progress-bar style (tqdm on stderr).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from multispec.models.hf_compat import cache_argument, output_cache
from multispec.sampling import SamplingConfig, process_logits


def progress(iterable: Iterable | None = None, desc: str = "", total: int | None = None, unit: str = "it"):
    """A tqdm bar on stderr (no output when stderr is not a terminal and `disable` is decided by tqdm)."""
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, dynamic_ncols=True, leave=False)


def encode_prompt(tokenizer, text: str, max_tokens: int) -> list[int]:
    """The tokenizer's encoding (with its special tokens, as generate encodes), keeping the special tokens it puts
    first and the last text tokens, `max_tokens` in all."""
    head = len(tokenizer("")["input_ids"])  # what the tokenizer adds before any text (a BOS, or nothing)
    ids = tokenizer(text)["input_ids"]
    return ids[:head] + ids[head:][-(max_tokens - head):]


@torch.inference_mode()
def sample_responses(model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, sampling: SamplingConfig,
                     generator: torch.Generator, eos_id: int | None, batch_size: int = 16,
                     pad_id: int = 0, desc: str = "sample") -> list[list[int]]:
    """The model's continuation of each prompt (token ids, ending at and including the first EOS, at most
    `max_new_tokens`). Prompts are sorted by length and run `batch_size` at a time, left-padded; the next token
    is drawn from `process_logits(logits, sampling)` (argmax when greedy). Returns one list per prompt, in order."""
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    for b in progress(range(0, len(order), batch_size), desc=desc, unit="batch"):
        idx = order[b:b + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)  # [B, S], left-padded
        att = torch.zeros(len(idx), width, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, width - len(prompts[i]):] = torch.tensor(prompts[i])
            att[r, width - len(prompts[i]):] = 1
        pos = (att.cumsum(-1) - 1).clamp(min=0)  # [B, S]
        step = model(input_ids=ids.to(device), attention_mask=att.to(device), position_ids=pos.to(device),
                     use_cache=True)
        cache, logits = output_cache(step), step.logits[:, -1]  # [B, V]
        cache_arg = cache_argument(model)  # read once, not per decoding step
        done = torch.zeros(len(idx), dtype=torch.bool)
        new = []
        for _ in range(max_new_tokens):
            probs = process_logits(logits, sampling).cpu()  # [B, V]
            nxt = probs.argmax(-1) if sampling.greedy else torch.multinomial(probs, 1, generator=generator)[:, 0]
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)  # [B]
            new.append(nxt)
            if eos_id is not None:
                done |= nxt == eos_id
            if bool(done.all()):
                break
            att = torch.cat([att, torch.ones(len(idx), 1, dtype=torch.long)], 1)
            pos = pos[:, -1:] + 1
            step = model(input_ids=nxt[:, None].to(device), attention_mask=att.to(device),
                         position_ids=pos.to(device), use_cache=True, **{cache_arg: cache})
            cache, logits = output_cache(step), step.logits[:, -1]
        gen = torch.stack(new, 1).tolist()  # [B, T]
        for r, i in enumerate(idx):
            seq = gen[r]
            if eos_id is not None and eos_id in seq:
                seq = seq[:seq.index(eos_id) + 1]
            out[i] = seq
    return out


@torch.inference_mode()
def teacher_forced_probs(model: torch.nn.Module, ids: list[int], start: int, sampling: SamplingConfig) -> torch.Tensor:
    """float32 [len(ids) - start, V] on the CPU: row t is the model's processed distribution of token ids[start + t]
    given ids[:start + t] (one causal forward over `ids`)."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, start - 1:-1]  # [L, V]
    return process_logits(logits, sampling).cpu()


@torch.inference_mode()
def last_hidden(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """float32 [len(ids), H] on the CPU: the model's final hidden states (after the final norm), as the engine's
    backends return them with `want_hidden=True`."""
    device = next(model.parameters()).device
    return model.base_model(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0].float().cpu()


def binary_kl(y: torch.Tensor, p: torch.Tensor, eps: float = 1e-7) -> float:
    """Mean over entries of KL(Bernoulli(y) || Bernoulli(p)), with 0 log 0 = 0. y, p: float [n] in [0, 1]."""
    y, p = y.double(), p.double().clamp(eps, 1 - eps)
    kl = torch.xlogy(y, y) - y * p.log() + torch.xlogy(1 - y, 1 - y) - (1 - y) * (1 - p).log()
    return float(kl.mean())


def reliability_diagram(pred: torch.Tensor, y: torch.Tensor, path: str | Path | None = None, n_bins: int = 10,
                        title: str = "") -> list[dict]:
    """Bin predictions into `n_bins` equal-width bins of [0, 1]; per bin: count, mean prediction, mean label
    (empirical acceptance when y are soft acceptance probabilities). pred, y: float [n]. Writes a PNG (bars of
    counts below, the curve against the diagonal above) when `path` is given. Returns the bins (empty ones left out)."""
    pred, y = pred.double().cpu(), y.double().cpu()
    which = (pred * n_bins).long().clamp(0, n_bins - 1)
    bins = []
    for b in range(n_bins):
        m = which == b
        if m.any():
            bins.append({"lo": b / n_bins, "hi": (b + 1) / n_bins, "count": int(m.sum()),
                         "mean_pred": float(pred[m].mean()), "mean_label": float(y[m].mean())})
    if path is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
        ax.plot([0, 1], [0, 1], ls="--", c="gray", lw=1, label="perfect calibration")
        ax.plot([b["mean_pred"] for b in bins], [b["mean_label"] for b in bins], "o-", label="head")
        ax.set_ylabel("empirical acceptance (mean label)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(loc="upper left")
        ax.set_title(title, fontsize=9)
        ax2.bar([(b["lo"] + b["hi"]) / 2 for b in bins], [b["count"] for b in bins], width=0.9 / n_bins)
        ax2.set_xlabel("predicted acceptance")
        ax2.set_ylabel("positions")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return bins
