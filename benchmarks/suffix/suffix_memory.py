"""Memory of the suffix store under many requests: N generations through one `suffix` Decoder (the embedded
default pair, short outputs, a store capped at --store-tokens), RSS and the store's size sampled as it goes.
Goal: RSS flat within 10 % once the store is full (least-recently-used eviction keeps it at its cap).

    python benchmarks/suffix/suffix_memory.py --requests 10000 --out benchmarks/results/suffix/memory.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--store-tokens", type=int, default=20_000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    import multispec
    from multispec.bench.runner import environment
    from multispec.decoding.decoder import Decoder

    torch.set_num_threads(1)
    pair = multispec.load_pair()
    decoder = Decoder(pair, "suffix", store_tokens=args.store_tokens)
    store = decoder.loaded["store"]
    words = ["def", "return", "for", "in", "range", "if", "else", "print", "x", "y", "n", "self", "import", "os",
             "class", "while", "len", "list", "dict", "None", "True", "(", ")", ":", "=", "+", "1", "0"]
    rng = random.Random(0)
    samples, started = [], time.time()
    for i in range(args.requests):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        decoder.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=i)
        if i % 250 == 0 or i == args.requests - 1:
            samples.append({"request": i + 1, "rss_mb": rss_mb(), "store_tokens": store.n_tokens,
                            "store_nodes": store.n_nodes, "seconds": time.time() - started})
            print(json.dumps(samples[-1]), file=sys.stderr)
    full = [s for s in samples if s["store_tokens"] >= 0.9 * args.store_tokens]
    first = full[0] if full else samples[len(samples) // 2]
    growth = samples[-1]["rss_mb"] / first["rss_mb"] - 1
    record = {"meta": environment(pair, sys.argv), "requests": args.requests, "store_cap_tokens": args.store_tokens,
              "rss_growth_after_store_full": growth, "samples": samples}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"RSS {first['rss_mb']:.0f} MB when the store was full (request {first['request']}) -> "
          f"{samples[-1]['rss_mb']:.0f} MB after {args.requests}: {100 * growth:+.1f} %")


if __name__ == "__main__":
    main()
