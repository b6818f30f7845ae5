"""The first command a new user runs, `multispec generate "def fibonacci(n):" --baseline`, N times in fresh processes
(embedded default pair, its own sampling settings, a fresh seed each time, as a user would run it; one thread):
the speedup over plain decoding each run prints, and their median. Writes one JSON.

    python benchmarks/auto/baseline_x10.py --runs 10 --out benchmarks/results/auto_temps/baseline_x10.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

COMMAND = ["generate", "def fibonacci(n):", "--baseline", "--threads", "1", "--json"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        r = subprocess.run([sys.executable, "-m", "multispec", *COMMAND], capture_output=True, text=True, check=True)
        s = json.loads(r.stdout)
        runs.append({k: s.get(k) for k in ("speedup", "tokens_per_s", "baseline_tokens_per_s", "new_tokens", "seed",
                                           "draft_vocab", "draft_dtype", "reproducible", "temperature")})
        print(f"{i + 1}/{args.runs}: {s['speedup']:.2f}x", file=sys.stderr, flush=True)
    from multispec.bench.runner import environment
    from multispec.loading import load_pair

    speedups = [r["speedup"] for r in runs]
    out = {"command": "multispec " + " ".join(COMMAND), "pair": "embedded default pair, its own sampling settings",
           "speedups": speedups, "median": statistics.median(speedups), "runs": runs,
           "meta": environment(load_pair(), sys.argv)}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"median {out['median']:.3f}x over {len(runs)} runs ({min(speedups):.2f}-{max(speedups):.2f})")


if __name__ == "__main__":
    main()
