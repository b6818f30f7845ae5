"""`multispec bench --batch-size N`: total tokens/s of each method decoding a prompt set N sequences at a time.

Per temperature and data set, every method decodes all prompts with `decoding.batch.generate_batch` (a fresh
Decoder each, so `auto`'s suffix store holds no earlier run; continuous batching: a slot takes the next prompt when
its sequence ends), and `hf-assisted` specs are replaced by transformers' own batched `generate` over chunks of N
left-padded prompts (`hf-generate`: transformers cannot speculate at batch > 1). Every sequence stops at EOS;
tokens/s counts the tokens produced. Writes results.json and results.md to --out.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from multispec.bench.specs import HF_ASSISTED, parse_method_specs
from multispec.data import load_prompts
from multispec.errors import check
from multispec.paths import writable_dir


def hf_generate_batched(pair, prompts: list[list[int]], batch: int, max_new: int, temperature: float,
                        seed: int) -> int:
    """transformers' generate over chunks of `batch` left-padded prompts (token ids); the tokens produced, each
    sequence up to and including its EOS."""
    tok = pair.tokenizer
    eos = pair.target.generation_config.eos_token_id
    eos = set(eos) if isinstance(eos, (list, tuple)) else {eos}
    pad = tok.pad_token_id if tok.pad_token_id is not None else next(iter(eos))
    torch.manual_seed(seed)
    total = 0
    for i in range(0, len(prompts), batch):
        rows = prompts[i:i + batch]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=pair.device)  # [B, W] left padded
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=pair.device)
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 \
            else dict(do_sample=False)
        with torch.inference_mode():
            out = pair.target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, pad_token_id=pad,
                                       **kw)
        for row in out[:, width:].tolist():
            total += next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
    return total


def run_batch_bench(pair, datasets: list[str], data_dir, methods: str, temperatures: list[float],
                    batch_size: int, max_new_tokens: int, limit, seed: int, out, command=None,
                    progress=print, chat_template: str = "auto", profile=None) -> dict:
    """See the module docstring. Returns the results dict (rows, settings, meta) and writes it to `out`.
    profile: a MachineProfile every Decoder plans from (None: the cache folder's)."""
    from multispec.bench.runner import encode_datasets
    from multispec.decoding.batch import MAX_BATCH

    check(isinstance(batch_size, int) and 1 <= batch_size <= MAX_BATCH,
          f"--batch-size must be an integer in [1, {MAX_BATCH}], got {batch_size!r}")
    specs = parse_method_specs(methods)
    writable_dir(out)
    encoded, chat = encode_datasets(pair, {d: load_prompts(d, data_dir, limit=limit) for d in datasets},
                                    chat_template, None)  # as the one-sequence bench: chat data sets templated
    prompts = {d: [ids for ids, _ in rows] for d, rows in encoded.items()}
    settings = {"datasets": datasets, "methods": [s.label for s in specs], "temperatures": temperatures,
                "chat_template": chat_template, "chat_template_applied": chat, "batch_size": batch_size,
                "max_new_tokens": max_new_tokens, "limit": limit, "seed": seed, "threads": torch.get_num_threads(),
                "profile": profile.digest if profile is not None else "default"}
    rows: list[dict] = []
    total = len(temperatures) * len(prompts) * len(specs)
    try:
        for t in temperatures:
            for d, texts in prompts.items():  # texts: token ids of each prompt
                for s in specs:
                    row = _measure(pair, s, texts, t, batch_size, max_new_tokens, seed, profile)
                    rows.append({"dataset": d, **row})
                    progress(f"{d:>12} T={t:<4g} {row['method']:<28} batch {batch_size}: "
                             f"{row['tokens_per_s']:8.1f} tok/s")
    except BaseException as e:  # an error or Ctrl-C part-way: the rows so far are written (marked "partial")
        if rows:
            write_results(out, _results(pair, command, settings, rows, batch_size, max_new_tokens,
                                        f"stopped after {len(rows)} of {total} runs ({type(e).__name__}: {e})"))
            print(f"wrote the {len(rows)} runs done so far to {out}/results.json", file=sys.stderr)
        raise
    results = _results(pair, command, settings, rows, batch_size, max_new_tokens)
    write_results(out, results)
    return results


def _measure(pair, s, texts: list[list[int]], t: float, batch_size: int, max_new_tokens: int, seed: int,
             profile) -> dict:
    """One method decoding every prompt of a data set at temperature t, batch_size at a time: its row."""
    from multispec.decoding.batch_offline import generate_batch
    from multispec.decoding.decoder import Decoder

    if s.name == HF_ASSISTED:
        hf_generate_batched(pair, texts[:2], 2, 2, t, seed)  # untimed warm-up
        start = time.perf_counter()
        label = "hf-generate"
        tokens = hf_generate_batched(pair, texts, batch_size, max_new_tokens, t, seed)
        tau = None
    else:
        label = s.label
        # untimed warm-up (the batch's cost table is measured once per process and machine), then a fresh Decoder:
        # auto's suffix store must hold no earlier run of these prompts
        generate_batch(Decoder(pair, s.config, "fast", profile=profile, **s.decoder_options), texts[:batch_size],
                       batch_size=batch_size, max_new_tokens=2, seed=seed, temperature=t)
        decoder = Decoder(pair, s.config, "fast", profile=profile, **s.decoder_options)
        start = time.perf_counter()
        results = generate_batch(decoder, texts, batch_size=batch_size, max_new_tokens=max_new_tokens, seed=seed,
                                 temperature=t)
        tokens = sum(len(r.token_ids) for r in results)
        calls = sum(len(r.token_ids) / r.stats["tau"] for r in results if r.stats.get("tau"))
        tau = tokens / calls if calls else None
    seconds = time.perf_counter() - start
    return {"method": label, "temperature": t, "batch_size": batch_size, "prompts": len(texts), "new_tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds, "tokens_per_target_call": tau}


def _results(pair, command, settings: dict, rows: list[dict], batch_size: int, max_new_tokens: int,
             partial: str | None = None) -> dict:
    """The results dict of `rows`, each with its speedup over batched ar on the same data set and temperature."""
    from multispec.bench.runner import environment

    for r in rows:
        ar = next((x for x in rows if x["method"] == "ar" and (x["dataset"], x["temperature"])
                   == (r["dataset"], r["temperature"])), None)
        r["speedup_vs_batched_ar"] = r["tokens_per_s"] / ar["tokens_per_s"] if ar else None
    results = {"meta": environment(pair, command), "settings": settings, "rows": rows}
    if partial is not None:
        results["partial"] = partial
    return results


def write_results(out, results: dict) -> None:
    """results.json and results.md in `out`."""
    out = Path(out)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    batch_size, max_new_tokens = results["settings"]["batch_size"], results["settings"]["max_new_tokens"]
    lines = [f"Batch size {batch_size}: total tokens/s over each prompt set ({max_new_tokens} new tokens).", "",
             "| data set | T | method | tokens/s | vs batched ar | tokens per target call |", "|---|---|---|---|---|---|"]
    if "partial" in results:
        lines[:0] = [f"**Partial: {results['partial']}**", ""]
    for r in results["rows"]:
        sp = "–" if r["speedup_vs_batched_ar"] is None else f"{r['speedup_vs_batched_ar']:.2f}x"
        tau = "–" if r["tokens_per_target_call"] is None else f"{r['tokens_per_target_call']:.2f}"
        lines.append(f"| {r['dataset']} | {r['temperature']:g} | {r['method']} | {r['tokens_per_s']:.1f} | {sp} | "
                     f"{tau} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
