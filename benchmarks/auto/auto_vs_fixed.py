"""auto against the best fixed method of the same run and against ar, per (data set, temperature) cell (issue 38).

Reads `multispec bench` results.json files (one run each: every method interleaved prompt by prompt on the same
prompts) and writes one JSON and one markdown table: for each cell the tokens/s of ar, of auto, of every fixed
method, the best fixed one, auto / best fixed (goal >= 0.97) and auto / ar (goal >= 1.00).

    python benchmarks/auto/auto_vs_fixed.py RUN/results.json [...] --out benchmarks/results/auto_vs_fixed/table
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

GOAL_BEST, GOAL_AR = 0.97, 1.00


def read_json(path):
    """A saved JSON file, plain or gzipped (benchmarks/results keeps large ones as .json.gz)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def _without_first(records: list[dict]) -> list[dict]:
    """Pooled rows per (dataset, temperature, method) from the records, leaving out each data set's first prompt
    (for runs made before bench dropped its warm-up's outputs from the suffix stores: the timed run of that prompt
    copied the warm-up's)."""
    first: dict[str, int] = {}
    for rec in records:
        first[rec["dataset"]] = min(first.get(rec["dataset"], rec["prompt_index"]), rec["prompt_index"])
    pooled: dict[tuple, list] = {}
    for rec in records:
        if rec["prompt_index"] != first[rec["dataset"]]:
            row = pooled.setdefault((rec["dataset"], rec["temperature"], rec["method"]), [0, 0.0, 0, set()])
            row[0] += rec["new_tokens"]
            row[1] += rec["seconds"]
            row[2] += rec["target_calls"]
            row[3].add(rec["prompt_index"])
    return [{"dataset": d, "temperature": t, "method": m, "category": None, "tokens_per_s": n / sec,
             "prompts": len(ids), "accepted_per_call": n / calls - 1 if calls else None}
            for (d, t, m), (n, sec, calls, ids) in pooled.items()]


def cells(path: Path, skip_first: bool = False) -> list[dict]:
    r = read_json(path)
    s = r["settings"]
    target = Path(s["target"])
    name = target.parent.name if target.name == "target" else target.name.split(".")[0]
    label = f"{name}, {s['max_new_tokens']} tok" + (" (stopped part-way)" if r.get("partial") else "")
    by_cell: dict[tuple, dict[str, dict]] = {}
    for row in (_without_first(r["records"]) if skip_first else r["summary"]):
        if row.get("category") is not None:
            continue
        by_cell.setdefault((row["dataset"], row["temperature"]), {})[row["method"]] = row
    out = []
    for (dataset, t), rows in by_cell.items():
        if set(rows) != set(s["methods"]) or len({row["prompts"] for row in rows.values()}) > 1:
            continue  # a run stopped part-way: a cell not every method finished on the same prompts
        autos = [m for m in rows if m == "auto" or m.startswith("auto:")]
        fixed = {m: rows[m]["tokens_per_s"] for m in rows if m not in autos and m != "ar"}
        best = max(fixed, key=fixed.get)
        for a in autos:
            tps = rows[a]["tokens_per_s"]
            out.append({"run": label, "offset": s["offset"], "limit": s["limit"], "dataset": dataset,
                        "temperature": t, "prompts": rows[a]["prompts"], "auto": a, "auto_tps": tps,
                        "ar_tps": rows["ar"]["tokens_per_s"], "fixed_tps": fixed, "best_fixed": best,
                        "best_fixed_tps": fixed[best], "auto_vs_best": tps / fixed[best],
                        "auto_vs_ar": tps / rows["ar"]["tokens_per_s"],
                        "auto_accepted_per_call": rows[a].get("accepted_per_call"),
                        "meets": tps / fixed[best] >= GOAL_BEST and tps / rows["ar"]["tokens_per_s"] >= GOAL_AR})
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| run | data set | T | ar tok/s | auto (tok/s) | best fixed (tok/s) | auto / best fixed | auto / ar |",
             "|---|---|---|---|---|---|---|---|"]
    for c in rows:
        flag = lambda ok: "" if ok else " **(miss)**"  # noqa: E731
        lines.append(f"| {c['run']} | {c['dataset']} | {c['temperature']:g} | {c['ar_tps']:.1f} | "
                     f"`{c['auto']}` ({c['auto_tps']:.1f}) | `{c['best_fixed']}` ({c['best_fixed_tps']:.1f}) | "
                     f"{c['auto_vs_best']:.3f}×{flag(c['auto_vs_best'] >= GOAL_BEST)} | "
                     f"{c['auto_vs_ar']:.3f}×{flag(c['auto_vs_ar'] >= GOAL_AR)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", required=True, help="path without extension: writes .json and .md")
    ap.add_argument("--skip-first", action="store_true", help="leave each data set's first prompt out (runs made "
                    "before bench dropped its warm-up's outputs from the suffix stores)")
    args = ap.parse_args()
    rows = [c for p in args.results for c in cells(Path(p), args.skip_first)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"goals": {"auto_vs_best": GOAL_BEST, "auto_vs_ar": GOAL_AR},
                                                    "sources": args.results, "skip_first": args.skip_first,
                                                    "cells": rows}, indent=1))
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
