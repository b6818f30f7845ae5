"""Prefill time with the output layer on every prompt token vs on the last one only (what the engine asks for:
`forward_chain(..., last_only=True)`), for the target and draft of a pair on the hf and fast backends. One thread,
a prompt of --tokens random ids, the two ways interleaved, median of --repeats.

    PYTHONPATH=src python benchmarks/steps/prefill_last_logits.py --target DIR --draft DIR \\
        --out benchmarks/results/prefill/last_logits.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from multispec.api import load_pair
    from multispec.bench.runner import environment
    from multispec.models import forward_chain, make_backend

    pair = load_pair(args.target, args.draft, device="cpu", dtype="float32")
    vocab = int(pair.target.get_output_embeddings().weight.shape[0])
    ids = torch.randint(1, vocab, (args.tokens,), generator=torch.Generator().manual_seed(0))
    result = {"meta": environment(pair, sys.argv), "tokens": args.tokens, "repeats": args.repeats, "ms": {}}
    for role, model in (("target", pair.target), ("draft", pair.draft)):
        for kind in ("hf", "fast"):
            backend = make_backend(model, kind)
            times = {"all_rows": [], "last_only": []}
            for r in range(args.repeats + 1):
                for way in (("all_rows", "last_only") if r % 2 else ("last_only", "all_rows")):
                    backend.reset()
                    t0 = time.perf_counter()
                    forward_chain(backend, ids, last_only=way == "last_only")
                    if r:  # the first round is untimed
                        times[way].append(time.perf_counter() - t0)
            result["ms"][f"{role}/{kind}"] = {w: 1e3 * statistics.median(v) for w, v in times.items()}
            print(role, kind, {w: f"{1e3 * statistics.median(v):.0f} ms" for w, v in times.items()}, file=sys.stderr)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
