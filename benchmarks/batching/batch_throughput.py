"""Offline throughput of batched decoding: total tokens/s of multispec's batched `ar` and `auto` at several batch
sizes, against transformers' own batched `generate` (left-padded, same prompts, same batch) and a loop of
batch-1 `auto`, in one run per thread count and temperature.

pycode-v1, HumanEval prompts 0..P-1, 128 new tokens (each sequence stops at EOS in every system; tokens/s counts
the tokens produced), fp32 CPU (--embedded --device cuda: the embedded pair on a GPU). multispec runs on its fast
backend; a batch size B decodes the P prompts B at a time (continuous batching: a slot takes the next prompt when
its sequence ends; transformers runs chunks of B prompts).

    PYTHONPATH=src python benchmarks/batching/batch_throughput.py --out benchmarks/results/batch/throughput
    PYTHONPATH=src python benchmarks/batching/batch_throughput.py --target SmolLM2-135M-Instruct.Q4_1.gguf --prompts 8 \
        --batch-sizes 1,4,8 --out benchmarks/results/batch/throughput_smollm2   # a model of its own, no draft
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pycode_args.py lives in benchmarks/
from pycode_args import add_pycode_args, device_name, load_pycode, pair_name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pycode_args(ap, placement=True)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--dataset", default="humaneval", help="humaneval, or spec-bench (prompts spread over its categories)")
    ap.add_argument("--offset", type=int, default=0, help="first prompt (spec-bench: within each category)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-sizes", default="1,4,16,32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--no-hf", dest="hf", action="store_false", help="skip transformers' batched generate (slow on "
                    "long prompts); its columns show -")
    ap.add_argument("--target", help="another target (a GGUF file or a folder), alone: auto plans lookup and suffix "
                    "drafts (with --auto-options head=shipped, its feature head too); default: the pycode-v1 pair")
    ap.add_argument("--reproducible", action="store_true", help="auto in the reproducible mode a seed turns on "
                    "(position-keyed noise, ~80 us a token at V = 8k); default: as an unseeded request runs, with the "
                    "same seeds as ar, so that plain steps draw ar's tokens")
    ap.add_argument("--repeats", type=int, default=1, help="measure each (system, batch size) this many times, "
                    "the systems alternating, and the auto loop again after the batch sizes; every figure is the "
                    "best of its runs (on a shared machine, a slow moment then hits no system alone); transformers' generate "
                    "runs once")
    ap.add_argument("--auto-options", default="", help="options of the auto systems (loop and batched), comma-"
                    "separated key=value, e.g. head=shipped: auto drafts with the target's shipped feature head too")
    ap.add_argument("--profile", default="fresh", help="the machine profile auto plans from: fresh (default: none, so "
                    "the costs, batched cost table and few-row tables are measured in the warm-up, on this core, as "
                    "on a first run), default (the cache folder's) or a profile file")
    ap.add_argument("--out", required=True, help="path without extension: writes .json and .md")
    args = ap.parse_args()
    import multispec.decoding.batch, multispec.drafting.auto, multispec.drafting.costs  # noqa: F401,E401 - all code read now

    from multispec.bench.batched import hf_generate_batched
    from multispec.bench.runner import environment
    from multispec.data import load_prompts
    from multispec.decoding.batch_offline import generate_batch
    from multispec.decoding.decoder import Decoder

    if args.target:
        import multispec

        torch.set_num_threads(1)
        pair = multispec.load_pair(target=args.target, dtype="float32", device="cpu")
    else:
        pair = load_pycode(args)
    model = Path(args.target).name if args.target else pair_name(args)
    per = -(-args.prompts // 6) + 1 if args.dataset == "spec-bench" else args.prompts
    prompts = [p.text for p in load_prompts(args.dataset, data_dir=args.data_dir, limit=per,
                                            offset=args.offset)]
    fits = [p for p in prompts if len(pair.tokenizer(p)["input_ids"]) + args.max_new_tokens < 2000]
    prompts = fits[:args.prompts]  # a prompt that leaves no room for the new tokens in the context is skipped
    args.label = f"{args.dataset} from {args.offset}"
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    options = {"ar": {}, "auto": dict(kv.split("=", 1) for kv in args.auto_options.split(",") if kv)}
    from multispec.profile import MachineProfile

    profile = {"fresh": MachineProfile(), "default": None}.get(args.profile, args.profile)
    for m in ("ar", "auto"):  # untimed warm-up: cost calibrations, first-call allocations. As many prompts as the
        # largest batch: auto's batched cost table is measured once per machine for up to the batch's slots (cached
        # on disk); a warm-up of 4 prompts left it to the first timed run of each larger size (~4 s inside it)
        warm = Decoder(pair, m, "fast", profile=profile, **options[m])
        generate_batch(warm, (prompts * max(sizes))[:max(sizes)], batch_size=max(sizes), max_new_tokens=8,
                       temperature=0)
        if args.profile == "fresh":  # what the warm-up measured, kept for every later Decoder
            profile = warm.profile
        Decoder(pair, m, "fast", profile=profile, **options[m]).generate(prompts[0], max_new_tokens=8,
                                                                          temperature=0, seed=0)
    prompt_ids = [pair.tokenizer(p)["input_ids"] for p in prompts]  # transformers' generate takes token ids
    hf_generate_batched(pair, prompt_ids[:2], 2, 4, 0.0, 0)
    # a fresh Decoder per measurement: auto's suffix store would otherwise copy the earlier runs' outputs
    fresh = {m: (lambda m=m: Decoder(pair, m, "fast", profile=profile, **options[m])) for m in ("ar", "auto")}
    rows, started = [], time.time()

    def record(threads, temperature, system, batch, tokens, seconds, repeat=0):
        rows.append({"threads": threads, "temperature": temperature, "system": system, "batch_size": batch,
                     "repeat": repeat, "new_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds})
        print(f"threads {threads} T={temperature:g} {system:>10} batch {batch:>2}: {tokens / seconds:7.1f} tok/s "
              f"({time.time() - started:.0f} s)", file=sys.stderr)

    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for temperature in [float(t) for t in args.temperatures.split(",")]:
            def auto_loop():
                loop = fresh["auto"]()
                t0 = time.perf_counter()
                tokens = sum(len(loop.generate(p, max_new_tokens=args.max_new_tokens, temperature=temperature,
                                               seed=i, reproducible=args.reproducible).token_ids)
                             for i, p in enumerate(prompts))
                record(threads, temperature, "auto loop", 1, tokens, time.perf_counter() - t0)
            auto_loop()
            for b, k in ((b, k) for b in sizes for k in range(args.repeats)):
                for m in ("ar", "auto"):
                    decoder = fresh[m]()
                    t0 = time.perf_counter()
                    out = generate_batch(decoder, prompts, batch_size=b, max_new_tokens=args.max_new_tokens,
                                         temperature=temperature, seed=0,
                                         reproducible=args.reproducible if m == "auto" else None)
                    record(threads, temperature, m, b, sum(len(r.token_ids) for r in out), time.perf_counter() - t0, k)
                if args.hf and k == 0:  # (once: it is the slowest system, and its figure is no close call)
                    t0 = time.perf_counter()
                    tokens = hf_generate_batched(pair, prompt_ids, b, args.max_new_tokens, temperature, 0)
                    record(threads, temperature, "hf generate", b, tokens, time.perf_counter() - t0, k)
            if args.repeats > 1:
                auto_loop()
    torch.set_num_threads(1)
    record_json = {"meta": environment(pair, sys.argv), "model": model, "auto_options": options["auto"],
                   "profile": args.profile,
                   "prompts": len(prompts), "data": args.label,
                   "auto_reproducible": args.reproducible, "repeats": args.repeats,
                   "max_new_tokens": args.max_new_tokens,
                   "rows": rows, "ratios": ratios(rows, sizes)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record_json, indent=1))
    text = table(rows, sizes, len(prompts), args.max_new_tokens, args.label, model, device_name(pair))
    out.with_suffix(".md").write_text(text)
    plot(record_json, out.with_suffix(".png"))
    print(text)


def plot(record: dict, path: Path) -> None:
    """Total tokens/s against the batch size, one panel per temperature (one thread's rows): batched auto, batched ar,
    transformers' batched generate, and the batch-1 auto loop as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in record["rows"] if r["threads"] == record["rows"][0]["threads"]]
    temps = list(dict.fromkeys(r["temperature"] for r in rows))
    fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 3.6), squeeze=False)
    for ax, t in zip(axes[0], temps):
        for system, style in (("auto", "o-"), ("ar", "s--"), ("hf generate", "^:")):
            pts = sorted({r["batch_size"]: _rate(rows, r["threads"], t, system, r["batch_size"]) for r in rows
                          if r["temperature"] == t and r["system"] == system}.items())
            if pts:
                ax.plot(*zip(*pts), style, label=f"batched {system}" if system != "hf generate" else
                        "transformers generate")
        loop = [r["tokens_per_s"] for r in rows if r["temperature"] == t and r["system"] == "auto loop"]
        if loop:
            ax.axhline(max(loop), color="gray", lw=0.8, label="batch-1 auto loop")
        ax.set_xscale("log", base=2)
        sizes = sorted({r["batch_size"] for r in rows})
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel("total tokens/s")
        ax.set_title(f"{record['model']}, T = {t:g}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _rate(rows, threads, temperature, system, b):
    """The best of a (system, batch size)'s runs (--repeats), None where it has none."""
    return max((r["tokens_per_s"] for r in rows if (r["threads"], r["temperature"], r["system"], r["batch_size"])
                == (threads, temperature, system, b)), default=None)


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def ratios(rows, sizes) -> list[dict]:
    out = []
    for threads, temperature in dict.fromkeys((r["threads"], r["temperature"]) for r in rows):
        loop = _rate(rows, threads, temperature, "auto loop", 1)
        for b in sizes:
            auto = _rate(rows, threads, temperature, "auto", b)
            out.append({"threads": threads, "temperature": temperature, "batch_size": b,
                        "auto_vs_batch1_loop": auto / loop,
                        "auto_vs_hf_generate": auto / hf if (hf := _rate(rows, threads, temperature, "hf generate", b))
                        else None,
                        "auto_vs_batched_ar": auto / _rate(rows, threads, temperature, "ar", b),
                        "auto_vs_batched_ar_paired": _paired(rows, threads, temperature, b)})
    return out


def _paired(rows, threads, temperature, b) -> list[float]:
    """auto / ar of each repeat: the two systems' runs next to each other in time (they alternate), so a slow
    stretch of the machine weighs on both."""
    def runs(system):
        return {r.get("repeat", 0): r["tokens_per_s"] for r in rows
                if (r["threads"], r["temperature"], r["system"], r["batch_size"]) == (threads, temperature, system, b)}
    auto, ar = runs("auto"), runs("ar")
    return [auto[k] / ar[k] for k in sorted(auto) if k in ar]


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def table(rows, sizes, n_prompts, max_new, label="humaneval from 0", model="pycode-v1", where="CPU") -> str:
    lines = [f"Total tokens/s, {model}, {n_prompts} prompts of {label}, {max_new} new tokens, fp32 {where} (one run; the "
             "best of a figure's runs with --repeats). "
             "auto / x: the batched auto's ratio to x at the same batch size. auto / ar paired: the median of each "
             "repeat's ratio (the two systems run next to each other) and its range.", "",
             "| threads | T | batch | ar | auto | hf generate | auto loop (b=1) | auto / loop | auto / hf | auto / ar "
             "| auto / ar paired |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ratios(rows, sizes):
        th, t, b = r["threads"], r["temperature"], r["batch_size"]
        lines.append(f"| {th} | {t:g} | {b} | {_rate(rows, th, t, 'ar', b):.1f} | {_rate(rows, th, t, 'auto', b):.1f} "
                     f"| {_f(_rate(rows, th, t, 'hf generate', b), '.1f')} | {_rate(rows, th, t, 'auto loop', 1):.1f} | "
                     f"{r['auto_vs_batch1_loop']:.2f}x | {_f(r['auto_vs_hf_generate'], '.2f')}{'x' if r['auto_vs_hf_generate'] else ''} | "
                     f"{r['auto_vs_batched_ar']:.2f}x | {_paired_text(r['auto_vs_batched_ar_paired'])} |")
    return "\n".join(lines) + "\n"


def _paired_text(xs: list[float]) -> str:
    if not xs:
        return "–"
    return f"{_median(xs):.2f}x" + (f" ({min(xs):.2f}–{max(xs):.2f})" if len(xs) > 1 else "")


if __name__ == "__main__":
    main()
