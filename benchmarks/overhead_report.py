"""Markdown of overhead_parity.py runs side by side: tok/s, the multispec / transformers ratios (goal >= 1) and the
per-round breakdown of each multispec method.

    python benchmarks/overhead_report.py benchmarks/results/overhead/before.json \
        benchmarks/results/overhead/after.json > benchmarks/results/overhead/README.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def render(paths: list[str]) -> str:
    runs = [(Path(p).stem, json.loads(Path(p).read_text())) for p in paths]
    names = [n for n, _ in runs]
    lines = ["# Overhead parity: multispec against transformers on the same algorithm", "",
             "pycode-v1, HumanEval 20–29, 96 new tokens, greedy, fp32, one thread; every prompt runs every method "
             "in turn (interleaved). Command: `PYTHONPATH=src python benchmarks/overhead_parity.py --out "
             "benchmarks/results/overhead/NAME.json`.", ""]
    for name, r in runs:
        m = r["meta"]
        lines.append(f"- {name}: commit {m['git_commit']}, {m['time_utc']}, {m['cpu']}, torch {m['torch']}, "
                     f"transformers {m['transformers']}, load average {[round(x, 1) for x in m['load_average']]}, "
                     f"{r['settings']['repeats']} passes; greedy outputs identical to transformers' generate: "
                     f"{all(r['greedy_identical_to_hf_generate'].values())}")
    lines += ["", "## tokens/s", "", "| method | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for k in runs[0][1]["tokens_per_s"]:
        lines.append(f"| {k} | " + " | ".join(f"{r['tokens_per_s'][k]:.1f}" for _, r in runs) + " |")
    lines += ["", "## ratios (goal: >= 1.00)", "", "| multispec / transformers | " + " | ".join(names) + " |",
              "|---|" + "---:|" * len(names)]
    for k in runs[0][1]["ratios"]:
        lines.append(f"| {k} | " + " | ".join(f"{r['ratios'][k]:.3f}" for _, r in runs) + " |")
    lines += ["", "## transformers' assisted generation: calls per prompt (mean)", "",
              "| run | method | draft forwards | target forwards |", "|---|---|---:|---:|"]
    for name, r in runs:
        for k, v in r["runs"].items():
            pp = [p for p in v["per_prompt"] if p.get("draft_calls") is not None]
            if pp:
                lines.append(f"| {name} | {k} | {sum(p['draft_calls'] for p in pp) / len(pp):.1f} | "
                             f"{sum(p['target_calls'] for p in pp) / len(pp):.1f} |")
    parts = list(next(iter(runs[0][1]["breakdown"].values()))["per_round_ms"])
    lines += ["", "## multispec per-round breakdown (ms per round, prefill excluded; timing proxies on the backends)",
              "", "| run | method | tokens/round | " + " | ".join(parts) + " | total |",
              "|---|---|---:|" + "---:|" * (len(parts) + 1)]
    for name, r in runs:
        for k, row in r["breakdown"].items():
            ms = row["per_round_ms"]
            lines.append(f"| {name} | {k} | {row['tokens_per_round']:.2f} | " + " | ".join(f"{ms[p]:.3f}" for p in parts)
                         + f" | {row['per_round_ms_total_excl_prefill']:.2f} |")
    lines += ["", "draft_other: drafting work outside the draft's forwards (grow_tree: q buffers, softmax, top-n, masks); "
              "verification: target verification outside its forward; loop_other: the generation loop's own work.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(sys.argv[1:]))
