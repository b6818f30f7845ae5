"""CPU cost of one forward of n tokens (n = 1..8) at 200 tokens of cached context, for the --shadow-target model and
the pycode-v1 pair, through the fast backend: the cost curve that decides what a verification of k drafted tokens
costs in the shadow regime. Median CPU time (one thread) of 5 calls after 2 untimed.

    PYTHONPATH=src python benchmarks/auto/shadow_cost_curve.py --out benchmarks/results/shadow_demo/cost_curve.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from multispec.api import load_pair
from multispec.bench.runner import environment
from multispec.models import causal_mask, forward_chain
from multispec.models import make_backend
from multispec.models.shadow import make_shadow_backend, shadow_model

CONTEXT, SIZES = 200, (1, 2, 3, 4, 5, 6, 8)


def curve(backend, ids) -> dict:
    forward_chain(backend, ids[:CONTEXT])
    out = {}
    for n in SIZES:
        times = []
        for _ in range(7):
            t0 = time.process_time()
            backend.forward(ids[CONTEXT:CONTEXT + n], torch.arange(CONTEXT, CONTEXT + n), causal_mask(CONTEXT, n))
            times.append(time.process_time() - t0)
            backend.keep(torch.arange(CONTEXT))
        out[n] = statistics.median(times[2:])
    return {"cpu_s": out, "relative_to_1_token": {n: v / out[1] for n, v in out.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="12x768")
    ap.add_argument("--pair", default="/work/shared/models/pycode-v1")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(f"{args.pair}/target", f"{args.pair}/draft", device="cpu", dtype="float32")
    vocab = int(pair.target.get_output_embeddings().weight.shape[0])
    ids = torch.randint(1, vocab, (CONTEXT + max(SIZES),), generator=torch.Generator().manual_seed(0))
    result = {"meta": environment(pair, None), "context": CONTEXT, "shape": args.shape,
              "shadow": curve(make_shadow_backend(shadow_model(args.shape, vocab), 1024), ids),
              "target": curve(make_backend(pair.target, "fast", max_len=1024), ids),
              "draft": curve(make_backend(pair.draft, "fast", max_len=1024), ids)}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for k in ("shadow", "target", "draft"):
        print(k, {n: f"{1000 * v:.1f} ms" for n, v in result[k]["cpu_s"].items()})


if __name__ == "__main__":
    main()
