"""Step costs of the fast backend, eager vs compiled (models/fast_compile.py), for the target and the draft of a
pair: one forward of n tokens after `--context` cached tokens, n over every bucket size and some padded sizes;
plus how long compiling every bucket took (cold: an empty compiled-code cache, given by --inductor-cache; warm: a
second process reusing it). Eager and compiled calls are interleaved, median of --repeats after 2 untimed calls.
Runs on CPU or CUDA (synchronised timing there).

    PYTHONPATH=src python benchmarks/steps/compiled_steps.py --target DIR --draft DIR \\
        --out benchmarks/results/compiled/cpu_steps.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SIZES = (1, 2, 3, 4, 5, 8, 12, 16, 32, 64)


def _timed(backend, ids, context, n, sync) -> float:
    backend.keep(torch.arange(context))
    sync()
    t0 = time.perf_counter()
    backend.forward(ids[context:context + n], torch.arange(context, context + n), None if n == 1 else
                    torch.ones(n, context + n, dtype=torch.bool).tril(diagonal=context))
    sync()
    return time.perf_counter() - t0


def step_curves(model, context: int, repeats: int, sync) -> dict:
    from multispec.models import forward_chain, make_backend

    vocab = int(model.get_output_embeddings().weight.shape[0])
    ids = torch.randint(1, vocab, (context + max(SIZES),), generator=torch.Generator().manual_seed(0))
    backends = {kind: make_backend(model, kind, max_len=context + max(SIZES) + 1) for kind in ("fast", "compiled")}
    t0 = time.perf_counter()
    backends["compiled"].warm_up()
    compile_s = time.perf_counter() - t0
    for b in backends.values():
        forward_chain(b, ids[:context])
    out = {kind: {} for kind in backends}
    for n in SIZES:
        times = {kind: [] for kind in backends}
        for r in range(repeats + 2):
            for kind in (("fast", "compiled") if r % 2 else ("compiled", "fast")):
                dt = _timed(backends[kind], ids, context, n, sync)
                if r >= 2:
                    times[kind].append(dt)
        for kind in backends:
            out[kind][n] = statistics.median(times[kind])
    ratio = {n: out["compiled"][n] / out["fast"][n] for n in SIZES}
    return {"seconds": out, "compiled_over_eager": ratio, "compile_all_buckets_s": compile_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--inductor-cache", help="compiled-code cache folder (default: a fresh one, so the first "
                                            "compile is cold; a second process measures the warm compile)")
    ap.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cache = args.inductor_cache or tempfile.mkdtemp(prefix="inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    torch.set_num_threads(args.threads)
    from multispec.api import load_pair
    from multispec.bench.runner import environment

    pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    on_cuda = pair.device.type == "cuda"
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    if args.warm_only:  # the child process: compile time with the cache the parent filled
        from multispec.models import make_backend

        out = {}
        for role, model in (("target", pair.target), ("draft", pair.draft)):
            t0 = time.perf_counter()
            make_backend(model, "compiled", max_len=128).warm_up()
            out[role] = time.perf_counter() - t0
        print(json.dumps(out))
        return
    result = {"meta": environment(pair, sys.argv), "context": args.context, "repeats": args.repeats,
              "threads": args.threads, "sizes": list(SIZES)}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        result[role] = step_curves(model, args.context, args.repeats, sync)
        print(role, {n: f"{r:.2f}" for n, r in result[role]["compiled_over_eager"].items()},
              f"compile {result[role]['compile_all_buckets_s']:.0f} s", file=sys.stderr, flush=True)
    cmd = [sys.executable, *sys.argv, "--inductor-cache", cache, "--warm-only"]
    warm = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
    result["warm_compile_s"] = json.loads(warm.stdout.strip().splitlines()[-1]) if warm.returncode == 0 else None
    result["cost_ratio_1_token"] = {kind: result["draft"]["seconds"][kind][1] / result["target"]["seconds"][kind][1]
                                    for kind in ("fast", "compiled")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
