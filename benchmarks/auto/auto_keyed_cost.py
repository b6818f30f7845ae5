"""What `auto`'s reproducible mode costs at T > 0 (issue 38): a seeded `auto` verifies with position-keyed noise
(drafter-invariant, so its text does not depend on which plans it chose), while a fixed method's seeded run
verifies with the usual coins. One process, pycode-v1, the same prompts, methods interleaved prompt by prompt:
`ar`, `auto` seeded (its default: reproducible), `auto` with reproducible=False, `sd` k = 1, and `sd` k = 1 in the
reproducible mode. Writes one JSON.

    python benchmarks/auto/auto_keyed_cost.py --pair /path/to/pycode-v1 --data-dir DATA --first 80 --last 99 \
        --temperature 1 --max-new-tokens 64 --out benchmarks/results/auto_vs_fixed/keyed_cost_t1.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import multispec
from multispec.data import load_prompts

RUNS = [("ar", "ar", None), ("auto (seeded: reproducible)", "auto", None), ("auto reproducible=False", "auto", False),
        ("sd:k=1", "sd", None), ("sd:k=1 reproducible", "sd", True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", required=True, help="a folder with target/ and draft/")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--first", type=int, default=80)
    ap.add_argument("--last", type=int, default=99)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = multispec.load_pair(target=f"{args.pair}/target", draft=f"{args.pair}/draft")
    prompts = load_prompts("humaneval", args.data_dir, limit=args.last - args.first + 1, offset=args.first)
    decoders = {"ar": multispec.Decoder(pair, "ar"), "auto": multispec.Decoder(pair, "auto"),
                "sd": multispec.Decoder(pair, "sd", k=1)}
    totals = {name: [0, 0.0] for name, _, _ in RUNS}
    for i, p in enumerate(prompts):
        for name, method, reproducible in RUNS:
            params = multispec.SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                              seed=args.first + i, reproducible=reproducible)
            r = decoders[method].generate(p.text, params)
            totals[name][0] += r.stats["new_tokens"]
            totals[name][1] += r.stats["seconds"]
        print(f"{i + 1}/{len(prompts)}", flush=True)
    tps = {name: n / s for name, (n, s) in totals.items()}
    for name, v in tps.items():
        print(f"{name:30s} {v:7.1f} tok/s  {v / tps['ar']:.3f}x ar")
    from multispec.bench.runner import environment

    out = {"prompts": f"humaneval {args.first}-{args.last}", "temperature": args.temperature,
           "max_new_tokens": args.max_new_tokens, "tokens_per_s": tps,
           "vs_ar": {k: v / tps["ar"] for k, v in tps.items()}, "meta": environment(pair, None)}
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
