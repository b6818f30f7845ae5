"""Loading a real GGUF pair as int4 / int8: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) with its 0.5B sibling as the draft
(`scripts/fetch_models.py --only qwen-coder`), `load_pair(target=..., draft=..., dtype=...)`, one torch thread.

For each dtype: a first load (a cache folder of its own, emptied first: as a new user's first load, the files'
SHA-256 included) and a second load (the quantized cache written by the first), each in a fresh subprocess.
Reported per load: the subprocess's wall seconds (Python and torch imports included), load_pair's own seconds,
its CPU seconds (user + system: what other jobs on a shared machine do not inflate), the load average, and the
subprocess's peak resident memory (getrusage ru_maxrss: target and draft together). A second load maps the cached
float and int4 tensors (read when first used), so its peak is below what decoding then holds.

    PYTHONPATH=src python benchmarks/pretrained/load_quantized.py --out benchmarks/results/pretrained/load_quantized.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REAL = Path.home() / ".cache" / "multispec" / "real_models"
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct.gguf"
GOALS = {"first_s": 180, "second_s": 20, "peak_rss_mb": {"int4": 4096, "int8": 5120, "w4a8": 4096}}


def child(args) -> None:
    """One load in this process; prints one JSON line."""
    import resource

    import torch

    torch.set_num_threads(args.threads)
    import multispec
    from multispec.models.int8 import weights_dtype

    t0 = time.perf_counter()
    pair = multispec.load_pair(target=str(args.target), draft=str(args.draft), dtype=args.dtype)
    seconds = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"load_pair_s": round(seconds, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                      "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
                      "weights": [weights_dtype(pair.target), weights_dtype(pair.draft)],
                      "load_average_1_5_15": list(os.getloadavg())}), flush=True)


def run_once(args, dtype: str, cache: Path) -> dict:
    env = {**os.environ, "MULTISPEC_CACHE_DIR": str(cache), "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--child", "--dtype", dtype, "--target", str(args.target), "--draft",
           str(args.draft), "--threads", str(args.threads)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the load failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 2), **row, "stderr": proc.stderr.strip().splitlines()[-4:]}


def environment(args) -> dict:
    import gguf  # noqa: F401  (its version below)
    import torch
    import transformers
    from importlib.metadata import version

    from multispec.bench.runner import cpu_name, git_commit

    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "threads": args.threads, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "transformers": transformers.__version__,
            "gguf": version("gguf"), "python": platform.python_version(), "git_commit": git_commit(),
            "command": " ".join(["python", *sys.argv]), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average_1_5_15": list(os.getloadavg()),
            "files": {p.name: p.stat().st_size for p in (args.target, args.draft)}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path, default=REAL / TARGET)
    ap.add_argument("--draft", type=Path, default=REAL / DRAFT)
    ap.add_argument("--dtypes", nargs="+", default=["int4", "int8"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/multispec-load-quantized"),
                    help="the cache folder the loads use (emptied before each first load)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/pretrained/load_quantized.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    for p in (args.target, args.draft):
        if not p.is_file():
            raise SystemExit(f"{p} is not here; get it with `python scripts/fetch_models.py --only qwen-coder`")
    result: dict = {"environment": environment(args), "goals": GOALS, "loads": {}}
    for dtype in args.dtypes:
        shutil.rmtree(args.cache, ignore_errors=True)
        first = run_once(args, dtype, args.cache)
        print(dtype, "first", first, flush=True)
        second = run_once(args, dtype, args.cache)
        print(dtype, "second", second, flush=True)
        peak = max(first["peak_rss_mb"], second["peak_rss_mb"])
        result["loads"][dtype] = {
            "first": first, "second": second,
            "meets": {"first": first["wall_s"] <= GOALS["first_s"], "second": second["wall_s"] <= GOALS["second_s"],
                      "peak_rss": peak <= GOALS["peak_rss_mb"][dtype]}}
    shutil.rmtree(args.cache, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
