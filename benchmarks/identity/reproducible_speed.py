"""Reproducible mode (drafter-invariant `gls` verification) against standard verification on the same prompts,
seeds and drafts' settings: tokens/s and mean accepted length per method, interleaved per prompt (one run, one
thread). Writes JSON and a markdown table.

    python benchmarks/identity/reproducible_speed.py --limit humaneval=20,spec-bench=2 --temperatures 0.7,1 \
        --out benchmarks/results/reproducible
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pycode_args.py lives in benchmarks/
from pycode_args import add_pycode_args, load_pycode

METHODS = [("sd", {"k": 4}), ("mcsd", {}), ("auto", {})]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pycode_args(ap)
    ap.add_argument("--limit", default="humaneval=20,spec-bench=2")
    ap.add_argument("--temperatures", default="0.7,1")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from multispec.bench.runner import environment
    from multispec.data import load_prompts
    from multispec.decoding.decoder import Decoder

    pair = load_pycode(args)
    prompts = []
    for part in args.limit.split(","):
        name, n = part.split("=")
        prompts += [(name, p) for p in load_prompts(name, data_dir=args.data_dir, limit=int(n))]
    decoders = {name: Decoder(pair, name, **opts) for name, opts in METHODS}
    for d in decoders.values():  # warm-up, untimed
        for rep in (False, True):
            d.generate("def f(x):", max_new_tokens=8, temperature=1.0, seed=0, reproducible=rep)
    records = []
    temps = [float(t) for t in args.temperatures.split(",")]
    total, started = len(temps) * len(prompts), time.time()
    for t in temps:
        for i, (ds, p) in enumerate(prompts):
            for name, d in decoders.items():
                for rep in (False, True):
                    r = d.generate(p.text, max_new_tokens=args.max_new_tokens, temperature=t, seed=1000 + i,
                                   reproducible=rep)
                    s = r.stats
                    records.append({"dataset": ds, "prompt": p.id, "temperature": t, "method": name,
                                    "reproducible": rep, "new_tokens": s["new_tokens"], "seconds": s["seconds"],
                                    "target_calls": s["target_calls"], "num_spec_steps": s["num_spec_steps"],
                                    "num_accepted_draft_tokens": s["num_accepted_draft_tokens"]})
            done = temps.index(t) * len(prompts) + i + 1
            print(f"{done}/{total} prompts ({time.time() - started:.0f} s)", file=sys.stderr)
    rows = []
    groups = defaultdict(list)
    for r in records:
        groups[(r["dataset"], r["temperature"], r["method"], r["reproducible"])].append(r)
    for (ds, t, m, rep), rs in sorted(groups.items()):
        toks, secs = sum(r["new_tokens"] for r in rs), sum(r["seconds"] for r in rs)
        steps = sum(r["num_spec_steps"] for r in rs)
        rows.append({"dataset": ds, "temperature": t, "method": m, "reproducible": rep, "tokens_per_s": toks / secs,
                     "tokens_per_call": toks / max(1, sum(r["target_calls"] for r in rs)),
                     "mean_acceptance_length": 1 + sum(r["num_accepted_draft_tokens"] for r in rs) / steps
                     if steps else None})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": environment(pair, sys.argv), "rows": rows,
                                                  "records": records}, indent=1))
    lines = ["| data | T | method | standard tok/s | reproducible tok/s | ratio | MAL standard → reproducible |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["reproducible"]:
            continue
        q = next(x for x in rows if x["reproducible"] and all(x[k] == r[k] for k in ("dataset", "temperature",
                                                                                    "method")))
        mal = (f"{r['mean_acceptance_length']:.3f} → {q['mean_acceptance_length']:.3f}"
               if r["mean_acceptance_length"] and q["mean_acceptance_length"] else "–")
        lines.append(f"| {r['dataset']} | {r['temperature']:g} | {r['method']} | {r['tokens_per_s']:.1f} | "
                     f"{q['tokens_per_s']:.1f} | {q['tokens_per_s'] / r['tokens_per_s']:.2f} | {mal} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
