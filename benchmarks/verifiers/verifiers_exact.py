"""Token-level vs sequence-level verification on IDENTICAL drafted trees, exactly (issue 13 companion to the bench).

Generates with the token-level verifier (sd, or the rrs-wor walk) on pycode-v1; at every round the drafted tree,
its tokens and the target/draft laws at each node are handed to the exact-law twins of BOTH the token-level and
the sequence-level verifier (block resp. traversal: the same draft law, so the same drafted tree is a valid
input to both). Their expected accepted lengths E[accepted | drafted tree] are averaged over rounds: a paired,
coin-free comparison, far less noisy than comparing two sampled runs. Writes JSON and a markdown table.

    PYTHONPATH=src .venv/bin/python benchmarks/verifiers/verifiers_exact.py --prompts 4 --out benchmarks/results/verifiers
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import multispec
import multispec.decoding.state as engine_state  # choose_verifier reads get_sequence_verifier from here
from multispec.bench.runner import environment
from multispec.data import load_prompts
from multispec.verify.sequence import get_sequence_verifier

CONFIGS = [("sd", {"k": 4, "verifier": "sd"}, "block"), ("sd", {"k": 6, "verifier": "sd"}, "block"),
           ("sd", {"k": 8, "verifier": "sd"}, "block"),
           ("mcsd", {"tree": (4, 2, 2, 1), "verifier": "rrs-wor"}, "traversal"),
           ("mcsd", {"tree": (2, 2, 2, 2, 1, 1), "verifier": "rrs-wor"}, "traversal")]


def expected_accepted(law: dict) -> float:
    return sum(mass * (len(path) - 1) for (path, _), mass in law.items())


def run(pair, prompts, method, options, sequence, temperature, max_new, seed) -> dict:
    rounds: list[tuple[float, float]] = []
    real = engine_state.get_sequence_verifier
    seq = get_sequence_verifier(sequence)

    def recording(name):
        base = real(name)
        if name == "greedy":
            return base

        def verify(tree, tokens, p, q, gen):
            if len(tree) > 1:  # a drafted round: both verifiers' exact expectations on this very tree
                p64, q64 = p.double(), q.double()
                rounds.append((expected_accepted(base.law(tree, tokens, p64, q64)),
                               expected_accepted(seq.law(tree, tokens, p64, q64))))
            return base.verify_fn(tree, tokens, p, q, gen)

        return dataclasses.replace(base, verify_fn=verify)

    engine_state.get_sequence_verifier = recording
    try:
        for i, prompt in enumerate(prompts):
            multispec.generate(pair, prompt, method=method, max_new_tokens=max_new, temperature=temperature,
                               seed=seed + i, **options)
    finally:
        engine_state.get_sequence_verifier = real
    x = np.array(rounds)  # [R, 2]
    diff = x[:, 1] - x[:, 0]
    return {"method": method, "options": {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()},
            "sequence": sequence, "temperature": temperature, "rounds": len(x),
            "mal_token": 1 + float(x[:, 0].mean()), "mal_sequence": 1 + float(x[:, 1].mean()),
            "gain": float((1 + x[:, 1].mean()) / (1 + x[:, 0].mean()) - 1),
            "diff_per_round": float(diff.mean()), "diff_stderr": float(diff.std(ddof=1) / np.sqrt(len(diff))),
            "min_diff": float(diff.min())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="/work/shared/models/pycode-v1/target")
    ap.add_argument("--draft", default="/work/shared/models/pycode-v1/draft")
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", default="1,0.7")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = multispec.load_pair(target=args.target, draft=args.draft, dtype="float32")
    prompts = [p.text for p in load_prompts("humaneval", data_dir=args.data_dir, limit=args.prompts)]
    started = time.time()
    rows = [run(pair, prompts, m, o, s, float(t), args.max_new_tokens, args.seed)
            for t in args.temperatures.split(",") for m, o, s in CONFIGS]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = environment(pair, ["python", *sys.argv])
    (args.out / "exact_same_drafts.json").write_text(json.dumps(
        {"meta": meta, "prompts": args.prompts, "dataset": "humaneval", "max_new_tokens": args.max_new_tokens,
         "seconds": time.time() - started, "rows": rows}, indent=1) + "\n")
    lines = [f"Exact E[accepted | drafted tree] on identical drafted trees: HumanEval 0–{args.prompts - 1}, "
             f"{args.max_new_tokens} new tokens, trajectories from the token-level verifier; MAL = 1 + mean over "
             f"rounds. Command: `{' '.join(['python', *sys.argv])}`", "",
             "| configuration | T | rounds | token-level MAL | sequence-level MAL | gain | Δ accepted/round (±2 se) "
             "| min Δ over rounds |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        label = f"{r['method']} " + ",".join(f"{k}={'-'.join(map(str, v)) if isinstance(v, list) else v}"
                                             for k, v in r["options"].items() if r["method"] != "sd" or k == "k")
        lines.append(f"| `{label}` → `{r['sequence']}` | {r['temperature']:g} | {r['rounds']} | "
                     f"{r['mal_token']:.3f} | {r['mal_sequence']:.3f} | {r['gain']:+.1%} | "
                     f"{r['diff_per_round']:+.4f} ± {2 * r['diff_stderr']:.4f} | {r['min_diff']:+.2e} |")
    (args.out / "exact_same_drafts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
