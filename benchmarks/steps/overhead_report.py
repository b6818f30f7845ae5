"""Markdown of overhead_parity.py runs side by side: tok/s, the multispec / transformers ratios (goal >= 1) and the
per-round breakdown of each multispec method.

    python benchmarks/steps/overhead_report.py benchmarks/results/overhead/before.json.gz \
        benchmarks/results/overhead/after.json.gz > benchmarks/results/overhead/README.md
"""
from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

OUTLIER = 3.0  # a (prompt, pass) slot is dropped, for every method alike, when one of its times is > 3x that
# method's median: on this shared machine a whole-machine stall once made one generation 25x slower (CPU time too)


def robust_ratios(r: dict, key: str) -> tuple[dict, list[int]]:
    """multispec / transformers tokens per `key` second (seconds or cpu_seconds), over the slots kept."""
    runs = r["runs"]
    n = len(next(iter(runs.values()))["per_prompt"])
    med = {k: statistics.median(p[key] for p in v["per_prompt"]) for k, v in runs.items()}
    bad = sorted({i for k, v in runs.items() for i, p in enumerate(v["per_prompt"]) if p[key] > OUTLIER * med[k]})
    keep = [i for i in range(n) if i not in bad]

    def rate(k):
        pp = runs[k]["per_prompt"]
        return sum(pp[i]["tokens"] for i in keep) / sum(pp[i][key] for i in keep)
    return {pair: rate(pair.split(" / ")[0]) / rate(pair.split(" / ")[1]) for pair in r["ratios"]}, bad


def read_json(path: str):
    """A run's JSON, plain or gzipped (the committed runs are .json.gz)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if path.endswith(".gz") else data)


def render(paths: list[str]) -> str:
    runs = [(Path(p).name.removesuffix(".gz").removesuffix(".json"), read_json(p)) for p in paths]
    names = [n for n, _ in runs]
    lines = ["# Overhead parity: multispec against transformers on the same algorithm", "",
             "pycode-v1, HumanEval 20–29, 96 new tokens, greedy, fp32, one thread; every prompt runs every method "
             "in turn (interleaved), two passes. Commands: before/after: `PYTHONPATH=src python "
             "benchmarks/steps/overhead_parity.py --out benchmarks/results/overhead/after.json`; the CPU-time pair ran "
             "at the same time, the before sources "
             "exported with `git archive e93f0aa src | tar -x -C /tmp/before`: `PYTHONPATH=/tmp/before/src python "
             "benchmarks/steps/overhead_parity.py --no-profile --no-breakdown --source-commit e93f0aa... --out "
             "benchmarks/results/overhead/before_cputime.json` and the same with `PYTHONPATH=src` into "
             "after_cputime.json (committed gzipped). Report: `python benchmarks/steps/overhead_report.py "
             "before.json.gz after.json.gz before_cputime.json.gz after_cputime.json.gz`.", ""]
    for name, r in runs:
        m = r["meta"]
        commit = r["settings"].get("source_commit") or m["git_commit"]
        lines.append(f"- {name}: multispec sources at {commit}, {m['time_utc']}, {m['cpu']}, torch {m['torch']}, "
                     f"transformers {m['transformers']}, load average {[round(x, 1) for x in m['load_average']]}, "
                     f"{r['settings']['repeats']} passes; greedy outputs identical to transformers' generate: "
                     f"{all(r['greedy_identical_to_hf_generate'].values())}")
    lines += ["", "## tokens/s", "", "| method | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for k in runs[0][1]["tokens_per_s"]:
        lines.append(f"| {k} | " + " | ".join(f"{r['tokens_per_s'][k]:.1f}" for _, r in runs) + " |")
    cols = []  # (header, {pair: ratio})
    for name, r in runs:
        cols.append((f"{name} wall", r["ratios"]))
        if "ratios_cpu_time" in r:
            robust, bad = robust_ratios(r, "cpu_seconds")
            cols.append((f"{name} CPU time, {len(bad)} outlier slot(s) dropped", robust))
    lines += ["", "## ratios of tokens/s, multispec / transformers (goal: >= 1.00)", "",
              "| multispec / transformers | " + " | ".join(h for h, _ in cols) + " |", "|---|" + "---:|" * len(cols)]
    for k in runs[0][1]["ratios"]:
        lines.append(f"| {k} | " + " | ".join(f"{c[k]:.3f}" for _, c in cols) + " |")
    lines += ["", "## forward calls per prompt (mean)", "",
              "| run | method | draft forwards | target forwards |", "|---|---|---:|---:|"]
    for name, r in runs:
        for k, v in r["runs"].items():
            pp = [p for p in v["per_prompt"] if p.get("draft_calls") is not None]
            if pp:
                lines.append(f"| {name} | {k} | {sum(p['draft_calls'] for p in pp) / len(pp):.1f} | "
                             f"{sum(p['target_calls'] for p in pp) / len(pp):.1f} |")
    with_breakdown = [(name, r) for name, r in runs if r.get("breakdown")]
    parts = list(next(iter(with_breakdown[0][1]["breakdown"].values()))["per_round_ms"])
    lines += ["", "## multispec per-round breakdown (ms per round, prefill excluded; timing proxies on the backends)",
              "", "| run | method | tokens/round | " + " | ".join(parts) + " | total |",
              "|---|---|---:|" + "---:|" * (len(parts) + 1)]
    for name, r in with_breakdown:
        for k, row in r["breakdown"].items():
            ms = row["per_round_ms"]
            lines.append(f"| {name} | {k} | {row['tokens_per_round']:.2f} | " + " | ".join(f"{ms[p]:.3f}" for p in parts)
                         + f" | {row['per_round_ms_total_excl_prefill']:.2f} |")
    lines += ["", "Wall milliseconds under the run's load (load average 9-16 on 2 cores: about 3x an idle machine's); "
              "compare the parts within a row. "
              "draft_other: drafting work outside the draft's forwards (grow_tree: q buffers, softmax, top-n, masks); "
              "verification: target verification outside its forward; loop_other: the generation loop's own work.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(sys.argv[1:]))
