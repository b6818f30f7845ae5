"""The first run as a new user makes it: wall time of `multispec --help` and of the README's main command
(`multispec generate "def fibonacci(n):" --json`, default pair, 128 tokens, a fixed seed) with the default thread
choice against torch's own default (one thread per core, `--threads <cores>`), with `--load N` extra busy
processes (pure-Python spin loops) running beside it. Runs alternate (default, torch default, default, ...) so
load changes hit both alike. Writes benchmarks/results/first_run/<name>.json.

    python benchmarks/auto/first_run.py --name loaded --load 2 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAIN = ["generate", "def fibonacci(n):", "--json", "--seed", "0"]


def spin() -> None:
    while True:
        pass


def timed(args: list[str]) -> tuple[float, dict | None]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "multispec", *args], capture_output=True, text=True, env=env,
                       timeout=1800)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"multispec {' '.join(args)} failed: {r.stderr.strip()}")
    out = json.loads(r.stdout) if "--json" in args else None
    return seconds, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--load", type=int, default=0, help="extra busy processes beside the runs")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from multispec.bench.runner import cpu_name, git_commit
    from multispec.threads import available_cores, busy_cores, default_threads

    cores = available_cores()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(a.load)]
    for p in spinners:
        p.start()
    time.sleep(2 if a.load else 0)
    try:
        chosen = default_threads()[0]
        help_s = [timed(["--help"])[0] for _ in range(5)]
        runs = {"default": [], "torch_default": []}
        for _ in range(a.repeats):
            for label, extra in (("default", []), ("torch_default", ["--threads", str(cores)])):
                seconds, out = timed(MAIN + extra)
                runs[label].append({"wall_s": seconds, "generate_s": out["seconds"],
                                    "tokens_per_s": out["tokens_per_s"], "new_tokens": out["new_tokens"]})
        busy = busy_cores()
    finally:
        for p in spinners:
            p.terminate()
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    record = {
        "name": a.name, "extra_busy_processes": a.load, "available_cores": cores, "default_threads": chosen,
        "busy_cores_at_end": busy, "load_average": list(os.getloadavg()), "cpu": cpu_name(),
        "git_commit": git_commit(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": ["multispec", *MAIN], "help_s": help_s, "help_s_median": statistics.median(help_s),
        "runs": runs, "wall_s_median": med,
        "torch_default_over_default": med["torch_default"] / med["default"],
    }
    out = ROOT / "benchmarks" / "results" / "first_run" / f"{a.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("default_threads", "help_s_median", "wall_s_median",
                                             "torch_default_over_default", "load_average")}))


if __name__ == "__main__":
    main()
