"""Overhead parity (issue 15, Build 4): the same algorithm in multispec and in transformers, one interleaved run.

    multispec ar   (backends hf, fast)   vs  transformers' plain target.generate(do_sample=False)
    multispec sd k=4 (backends hf, fast) vs  transformers' assisted generation, num_assistant_tokens=4, constant

pycode-v1, HumanEval [20, 30), 96 new tokens, greedy, fp32, one thread. Every prompt runs every method in turn
(machine-load drift hits them alike); tok/s = tokens / seconds summed over the prompts. The outputs are checked
token-identical across all six (greedy, same target). A second, untimed-for-throughput pass wraps the backends in
timing proxies to split a multispec round into draft forward, other drafting work, target forward, verification,
cache keep and the rest of the loop; a cProfile of one generation per engine method lists the top functions.

    PYTHONPATH=src python benchmarks/steps/overhead_parity.py --out benchmarks/results/overhead/before.json
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch

from multispec.api import load_pair
from multispec.loading import eos_ids, vocab_rows
from multispec.text import encode_prompt
from multispec.bench.hf_assisted import hf_assisted_generate
from multispec.bench.runner import environment
from multispec.data import load_prompts
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_method
from multispec.models import make_backend
from multispec.sampling import SamplingConfig

PAIR = "/work/shared/models/pycode-v1"
GREEDY = SamplingConfig(temperature=0.0)
HF_SD = "hf-assisted:n=4,constant"  # transformers' defaults otherwise: assistant_confidence_threshold 0.4 (ROC-tuned)
HF_SD_NO_THRESHOLD = "hf-assisted:n=4,constant,threshold=0"  # always 4 drafts: the same algorithm as sd k=4
PAIRS = (("ar:backend=hf", "hf-generate"), ("ar:backend=fast", "hf-generate"),
         ("sd:k=4,backend=hf", HF_SD), ("sd:k=4,backend=fast", HF_SD),
         ("sd:k=4,backend=hf", HF_SD_NO_THRESHOLD), ("sd:k=4,backend=fast", HF_SD_NO_THRESHOLD))


class Timed:
    """A backend proxy that adds the seconds spent in forward() and keep() to `clock` (breakdown pass only).
    The first forward after reset() is the prefill: it is not counted (the engine times prefill apart)."""

    def __init__(self, inner, clock: dict, key: str):
        self.inner, self.clock, self.key = inner, clock, key
        self.fresh = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def cache_len(self) -> int:
        return self.inner.cache_len

    def reset(self) -> None:
        self.inner.reset()
        self.fresh = True

    def forward(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.inner.forward(*args, **kwargs)
        if not self.fresh:
            self.clock[self.key + "_forward"] += time.perf_counter() - t0
        self.fresh = False
        return out

    def keep(self, indices) -> None:
        t0 = time.perf_counter()
        self.inner.keep(indices)
        self.clock[self.key + "_keep"] += time.perf_counter() - t0


def make_runners(pair, eos: set[int], max_new: int) -> dict:
    """label -> run(ids) -> (new ids, info dict)."""
    runners = {}
    for backend in ("hf", "fast"):
        for name, cfg in (("ar", build_method("ar")), ("sd:k=4", build_method("sd", k=4))):
            target = make_backend(pair.target, backend)
            draft = make_backend(pair.draft, backend) if cfg.name != "ar" else None

            def run(ids, target=target, draft=draft, cfg=cfg):
                new, c = generate_ids(target, draft, ids, cfg, GREEDY, max_new, 0, eos)
                return new, {"rounds": c.rounds, "target_calls": c.target_calls, "draft_calls": c.draft_calls,
                             "accepted": c.accepted, "prefill_s": c.t_prefill, "draft_s": c.t_draft,
                             "verify_s": c.t_verify, "cache_s": c.t_cache}
            label = f"{name},backend={backend}" if name != "ar" else f"ar:backend={backend}"
            runners[label] = run
    eos_sorted = sorted(eos)

    def hf_generate(ids):
        input_ids = torch.tensor([ids])
        with torch.inference_mode():
            out = pair.target.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                       max_new_tokens=max_new, eos_token_id=eos_sorted or None,
                                       pad_token_id=eos_sorted[0] if eos_sorted else 0)
        return out[0, len(ids):].tolist(), {}

    def hf_assisted(ids, threshold=None):
        saved = pair.draft.generation_config.assistant_confidence_threshold
        if threshold is not None:  # hf_assisted_generate copies the draft's generation_config, this value included
            pair.draft.generation_config.assistant_confidence_threshold = threshold
        try:
            new, c = hf_assisted_generate(pair.target, pair.draft, ids, GREEDY, max_new, 0, eos, 4)
        finally:
            pair.draft.generation_config.assistant_confidence_threshold = saved
        return new, {"target_calls": c.target_calls, "draft_calls": c.draft_calls, "effective": c.effective}
    runners["hf-generate"] = hf_generate
    runners[HF_SD] = hf_assisted
    runners[HF_SD_NO_THRESHOLD] = lambda ids: hf_assisted(ids, threshold=0.0)
    return runners


def breakdown(pair, eos, prompts, max_new) -> dict:
    """Per-round seconds of each part of a multispec round, from timing proxies and the engine's Metrics."""
    rows = {}
    for backend in ("hf", "fast"):
        for name, cfg in (("ar", build_method("ar")), ("sd:k=4", build_method("sd", k=4))):
            clock = {"target_forward": 0.0, "target_keep": 0.0, "draft_forward": 0.0, "draft_keep": 0.0}
            target = Timed(make_backend(pair.target, backend), clock, "target")
            draft = Timed(make_backend(pair.draft, backend), clock, "draft") if cfg.name != "ar" else None
            generate_ids(target, draft, prompts[0], cfg, GREEDY, max_new, 0, eos)  # warm-up
            for k in clock:
                clock[k] = 0.0
            tot = {"wall": 0.0, "prefill": 0.0, "draft": 0.0, "verify": 0.0, "cache": 0.0, "rounds": 0, "tokens": 0}
            for ids in prompts:
                t0 = time.perf_counter()
                new, c = generate_ids(target, draft, ids, cfg, GREEDY, max_new, 0, eos)
                tot["wall"] += time.perf_counter() - t0
                tot["prefill"] += c.t_prefill
                tot["draft"] += c.t_draft
                tot["verify"] += c.t_verify
                tot["cache"] += c.t_cache
                tot["rounds"] += c.rounds
                tot["tokens"] += len(new)
            r = tot["rounds"]
            target_fwd, draft_fwd = clock["target_forward"], clock["draft_forward"]
            parts = {
                "draft_forward": draft_fwd,
                "draft_other": tot["draft"] - draft_fwd,
                "target_forward": target_fwd,
                "verification": tot["verify"] - target_fwd,
                "cache_keep": tot["cache"],
                "loop_other": tot["wall"] - tot["prefill"] - tot["draft"] - tot["verify"] - tot["cache"],
            }
            rows[f"{name},backend={backend}"] = {
                "rounds": r, "tokens": tot["tokens"], "tokens_per_round": tot["tokens"] / r,
                "prefill_s_total": tot["prefill"], "wall_s_total": tot["wall"],
                "per_round_ms": {k: 1000 * v / r for k, v in parts.items()},
                "per_round_ms_total_excl_prefill": 1000 * (tot["wall"] - tot["prefill"]) / r,
            }
    return rows


def profile_one(run, ids, top: int = 25) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    run(ids)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return [line for line in buf.getvalue().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pair", default=PAIR)
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--offset", type=int, default=20)
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved passes over the prompts (timed)")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--source-commit", help="record the commit of the multispec sources on PYTHONPATH when they are "
                                            "an exported copy (meta.git_commit is then None)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(f"{args.pair}/target", f"{args.pair}/draft", device="cpu", dtype="float32")
    eos = eos_ids(pair)
    prompts = [encode_prompt(pair.tokenizer, vocab_rows(pair.target), p.text) for p in load_prompts("humaneval", args.data_dir, limit=args.limit,
                                                           offset=args.offset)]
    runners = make_runners(pair, eos, args.max_new_tokens)
    for run in runners.values():  # warm-up, untimed
        run(prompts[0])
    totals = {k: {"tokens": 0, "seconds": 0.0, "cpu_seconds": 0.0, "per_prompt": []} for k in runners}
    outputs: dict[str, list] = {k: [] for k in runners}
    for rep in range(args.repeats):
        for i, ids in enumerate(prompts):
            for label, run in runners.items():
                c0, t0 = time.process_time(), time.perf_counter()
                new, info = run(ids)
                sec, cpu = time.perf_counter() - t0, time.process_time() - c0
                totals[label]["tokens"] += len(new)
                totals[label]["seconds"] += sec
                totals[label]["cpu_seconds"] += cpu
                totals[label]["per_prompt"].append({"prompt": args.offset + i, "repeat": rep, "tokens": len(new),
                                                    "seconds": sec, "cpu_seconds": cpu, **info})
                if rep == 0:
                    outputs[label].append(new)
    for v in totals.values():
        v["tokens_per_s"] = v["tokens"] / v["seconds"]
        v["tokens_per_cpu_s"] = v["tokens"] / v["cpu_seconds"]
    ref = outputs["hf-generate"]
    identical = {k: all(a == b for a, b in zip(v, ref)) for k, v in outputs.items()}
    ratios = {f"{ms} / {hf}": totals[ms]["tokens_per_s"] / totals[hf]["tokens_per_s"] for ms, hf in PAIRS}
    # On a shared, oversubscribed machine wall time mostly measures the other tenants; with one thread, the CPU
    # time of this process is the cost of the work itself.
    ratios_cpu = {f"{ms} / {hf}": totals[ms]["tokens_per_cpu_s"] / totals[hf]["tokens_per_cpu_s"] for ms, hf in PAIRS}
    result = {
        "meta": environment(pair, None),
        "settings": {"source_commit": args.source_commit, "pair": args.pair, "dataset": "humaneval", "offset": args.offset, "limit": args.limit,
                     "max_new_tokens": args.max_new_tokens, "greedy": True, "dtype": "float32",
                     "threads": torch.get_num_threads(), "repeats": args.repeats},
        "tokens_per_s": {k: v["tokens_per_s"] for k, v in totals.items()},
        "tokens_per_cpu_s": {k: v["tokens_per_cpu_s"] for k, v in totals.items()},
        "ratios": ratios,
        "ratios_cpu_time": ratios_cpu,
        "goal_met": {k: v >= 1.0 for k, v in ratios.items()},
        "goal_met_cpu_time": {k: v >= 1.0 for k, v in ratios_cpu.items()},
        "greedy_identical_to_hf_generate": identical,
        "runs": totals,
        "breakdown": None if args.no_breakdown else breakdown(pair, eos, prompts, args.max_new_tokens),
    }
    if not args.no_profile:
        result["profile_top_tottime"] = {k: profile_one(runners[k], prompts[1])
                                         for k in ("ar:backend=fast", "sd:k=4,backend=fast", "sd:k=4,backend=hf")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for k, v in result["tokens_per_s"].items():
        print(f"{k:<38} {v:7.1f} tok/s  {result['tokens_per_cpu_s'][k]:7.1f} tok/CPU-s")
    for k, v in ratios.items():
        print(f"{k:<60} wall {v:.3f}  CPU time {ratios_cpu[k]:.3f}")
    for k, row in (result["breakdown"] or {}).items():
        print(k, {a: round(b, 3) for a, b in row["per_round_ms"].items()}, f"tok/round {row['tokens_per_round']:.2f}")


if __name__ == "__main__":
    main()
