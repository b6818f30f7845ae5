"""The fast backend against the transformers (hf) backend on real pretrained models loaded from GGUF files
(SmolLM2-135M-Instruct, Gemma 3 270M; issue 36 item 5): method `ar`, greedy, one thread, at several prompt
lengths. Prompts are real text (Spec-Bench questions and HumanEval prompts, joined) cut to each length in tokens.

Per model × length: the two backends run interleaved (hf first on even repeats, fast first on odd ones) after one
untimed warm-up run each; reported are the medians over repeats of decode tok/s (new tokens / (wall time - prefill
time)), prefill seconds and end-to-end tok/s, and the median of the per-repeat fast/hf decode ratios. Every run's
tokens are compared across backends, and once per length with transformers' own greedy `generate`.

    PYTHONPATH=src python benchmarks/pretrained/fast_vs_hf_real.py \\
        --model smollm2=/path/SmolLM2-135M-Instruct.Q4_1.gguf --model gemma3=/path/gemma-3-270m-q4_k_m.gguf \\
        --lengths 16 512 2000 --new-tokens 64 --repeats 5 --out benchmarks/results/fast_vs_hf_real.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

DATA = Path("/work/shared/data")


def prompt_text(data: Path) -> str:
    """Real text, long enough for the longest prompt: Spec-Bench questions, then HumanEval prompts."""
    parts = []
    with open(data / "spec_bench_question.jsonl", encoding="utf-8") as f:
        for line in f:
            parts.extend(json.loads(line)["turns"])
    with gzip.open(data / "humaneval.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            parts.append(json.loads(line)["prompt"])
    return "\n\n".join(parts)


def load(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    return model, tok, time.perf_counter() - t0


def timed(decoder, ids: list[int], new: int) -> dict:
    r = decoder.generate(ids, max_new_tokens=new, temperature=0, ignore_eos=True)
    s = r.stats
    decode_s = s["seconds"] - s["prefill_s"]
    return {"tokens": list(r.token_ids), "decode_tok_s": s["new_tokens"] / decode_s, "prefill_s": s["prefill_s"],
            "tok_s": s["tokens_per_s"], "seconds": s["seconds"]}


def reference(model, ids: list[int], new: int) -> list[int]:
    """transformers' own greedy generate (its default cache), the new tokens: up to `new`, or fewer when it ends at
    an EOS token (the backends run with ignore_eos, so theirs are compared up to its length)."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=new, do_sample=False, top_p=None, top_k=None, temperature=None)
    return out[0, len(ids):].tolist()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def bench_model(name: str, path: str, text: str, args) -> dict:
    import multispec.loading
    from multispec.decoding.decoder import Decoder

    model, tok, load_s = load(path)
    print(f"[{name}] loaded {path} in {load_s:.1f} s", flush=True)
    pair = multispec.loading.Pair(target=model, draft=None, tokenizer=tok, target_path=str(Path(path).parent),
                                  draft_path=None)
    decoders = {kind: Decoder(pair, "ar", backend=kind) for kind in ("hf", "fast")}
    all_ids = tok(text)["input_ids"]
    out = {"path": path, "model_type": model.config.model_type, "load_s": load_s,
           "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
           "layer_types": sorted(set(getattr(model.config, "layer_types", None) or ["full_attention"])),
           "lengths": {}}
    for length in args.lengths:
        if length > len(all_ids):
            raise SystemExit(f"the prompt text has only {len(all_ids)} tokens, fewer than {length}")
        ids = all_ids[:length]
        for kind in ("hf", "fast"):  # warm-up: backends built, caches sized, first-call costs paid
            timed(decoders[kind], ids, 4)
        runs: dict = {"hf": [], "fast": []}
        for r in range(args.repeats):
            for kind in (("hf", "fast") if r % 2 == 0 else ("fast", "hf")):
                runs[kind].append(timed(decoders[kind], ids, args.new_tokens))
            print(f"[{name}] length {length} repeat {r + 1}/{args.repeats}: hf {runs['hf'][-1]['decode_tok_s']:.2f} "
                  f"fast {runs['fast'][-1]['decode_tok_s']:.2f} decode tok/s", flush=True)
        hf_tokens = runs["hf"][0]["tokens"]
        same_runs = all(x["tokens"] == hf_tokens for kind in runs for x in runs[kind])
        ref = reference(model, ids, args.new_tokens) if args.reference else None
        row = {"prompt_tokens": length, "new_tokens": args.new_tokens, "repeats": args.repeats,
               "same_tokens_hf_fast": same_runs,
               "first_difference_hf_fast": first_difference(hf_tokens, runs["fast"][0]["tokens"]),
               "same_as_transformers_generate": None if ref is None else all(
                   x["tokens"][:len(ref)] == ref for kind in runs for x in runs[kind]),
               "transformers_tokens": None if ref is None else len(ref),  # fewer than new_tokens: it ended at EOS
               "first_difference_vs_transformers": None if ref is None else {
                   kind: first_difference(ref, runs[kind][0]["tokens"][:len(ref)]) for kind in runs}}
        for kind, rs in runs.items():
            row[kind] = {key: statistics.median(x[key] for x in rs) for key in ("decode_tok_s", "prefill_s", "tok_s")}
            row[kind]["decode_tok_s_all"] = [x["decode_tok_s"] for x in rs]
            row[kind]["prefill_s_all"] = [x["prefill_s"] for x in rs]
        row["fast_over_hf_decode"] = statistics.median(f["decode_tok_s"] / h["decode_tok_s"]
                                                       for f, h in zip(runs["fast"], runs["hf"]))
        row["fast_over_hf_end_to_end"] = statistics.median(f["tok_s"] / h["tok_s"]
                                                           for f, h in zip(runs["fast"], runs["hf"]))
        row["fast_over_hf_prefill_time"] = statistics.median(f["prefill_s"] / h["prefill_s"]
                                                             for f, h in zip(runs["fast"], runs["hf"]))
        out["lengths"][str(length)] = row
        print(f"[{name}] length {length}: hf {row['hf']['decode_tok_s']:.2f} fast {row['fast']['decode_tok_s']:.2f} "
              f"decode tok/s (x{row['fast_over_hf_decode']:.3f}), prefill hf {row['hf']['prefill_s']:.3f} s fast "
              f"{row['fast']['prefill_s']:.3f} s, identical {same_runs}, = transformers "
              f"{row['same_as_transformers_generate']}", flush=True)
    return out


def environment(args) -> dict:
    import transformers

    from multispec.bench.runner import cpu_name, git_commit

    return {"device": "cpu", "cpu": cpu_name(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "dtype": "float32", "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "git_commit": git_commit(), "command": sys.argv,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average_1_5_15": list(os.getloadavg()),  # a shared machine: ratios are the figure, not tok/s
            "config": {k: v for k, v in vars(args).items() if k != "out"}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                    help="a GGUF file to load (repeatable)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 512, 2000])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", type=Path, default=DATA, help="folder with spec_bench_question.jsonl, humaneval.jsonl.gz")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="skip the comparison with transformers' generate")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/fast_vs_hf_real.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = prompt_text(args.data)
    result = {"environment": environment(args), "models": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for spec in args.model:
            name, _, path = spec.partition("=")
            result["models"][name] = bench_model(name, path, text, args)
            result["warnings"] = sorted({f"{w.category.__name__}: {w.message} ({Path(w.filename).name}:{w.lineno})"
                                         for w in caught})  # Python warnings of the whole run, loading included
            args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")  # after each model
    for w in result["warnings"]:
        print(f"warning: {w}", flush=True)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
