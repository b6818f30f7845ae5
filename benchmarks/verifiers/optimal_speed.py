"""Time one `optimal_acceptance` call at V = 32,000, n = 4, both draft sampling modes.

p, q: softmax of correlated Gaussian + Zipf-like logits (an LLM-like pair). Warm-up call first, then repeats.
Writes benchmarks/results/optimal_speed.json. Run: python benchmarks/verifiers/optimal_speed.py [--repeats 5]
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import scipy
import torch

from multispec.bench.runner import cpu_name, git_commit
from multispec.optimal import optimal_acceptance


def llm_like_pair(v: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """p (target), q (draft): float64 [V]; shared Zipf-shaped base logits, draft logits correlated with target."""
    rng = np.random.default_rng(seed)
    base = -1.1 * np.log(np.arange(1, v + 1)) + rng.normal(0, 1.0, v)
    base = base[rng.permutation(v)]
    target = base + rng.normal(0, 0.5, v)
    draft = target + rng.normal(0, 1.0, v)
    sm = lambda z: np.exp(z - z.max()) / np.exp(z - z.max()).sum()  # noqa: E731
    return sm(target), sm(draft)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/optimal_speed.json")
    args = ap.parse_args()
    p, q = llm_like_pair(args.vocab, 0)
    results = {}
    for replacement in (True, False):
        optimal_acceptance(p, q, args.drafts, replacement)  # warm-up
        times, value = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            value = optimal_acceptance(p, q, args.drafts, replacement)
            times.append(time.perf_counter() - t0)
        results["iid" if replacement else "without_replacement"] = {
            "alpha_star": value, "seconds": times, "median_s": float(np.median(times)), "min_s": min(times)}
        print(f"replacement={replacement}: alpha*={value:.6f} median {np.median(times):.3f} s")
    commit = git_commit()
    record = {
        "benchmark": "optimal_acceptance single call", "vocab": args.vocab, "drafts": args.drafts,
        "repeats": args.repeats, "pair": "softmax of Zipf+Gaussian logits, draft = target + N(0,1) noise, seed 0",
        "results": results, "device": "cpu", "cpu": cpu_name(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
        "numpy": np.__version__, "scipy": scipy.__version__, "torch": torch.__version__, "git_commit": commit,
        "load_average_1m": os.getloadavg()[0],
        "note": "shared 2-core machine; other jobs were running (see load_average_1m)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
