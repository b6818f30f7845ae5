"""SpecDec++ sweep (design §7.7): target-only `ar`, fixed-k `sd` (k = 1..10) and `specdecpp` over a grid of
thresholds h, in one run, on the same prompts and seeds.

Per configuration and sampling setting: tokens/s, tau (tokens per target call), discard rate (discarded draft
tokens / generated tokens) and verification rate (target calls / generated tokens), summed over prompts.
Prompts run in the outer loop and configurations in the inner one, so that load changes on a shared machine
spread over every configuration; one untimed warm-up generation per configuration comes first.

Writes to --out: results.json (settings, device, versions, commit, rows), results.md, and per sampling setting
pareto_<tag>.png (discard rate vs verification rate: SpecDec++ curve over h vs fixed-k curve over k) and
tps_<tag>.png (tokens/s vs h, with the best fixed k and ar as lines).

Full run (the lead, on a quiet machine):
    .venv/bin/python benchmarks/methods/specdecpp_sweep.py --threads 2
Smoke run:
    .venv/bin/python benchmarks/methods/specdecpp_sweep.py --limit 4 --max-new-tokens 32 --ks 1,4 --hs 0.3,0.7 \
        --out benchmarks/results/specdecpp/smoke --threads 1
"""
from __future__ import annotations

import argparse
import gzip
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"


def read_json(path):
    """A saved JSON file, plain or gzipped (benchmarks/results keeps large ones as .json.gz)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=str(SHARED / "models/pycode-v1/target"))
    ap.add_argument("--draft", default=str(SHARED / "models/pycode-v1/draft"))
    ap.add_argument("--head", default=str(ROOT / "heads/pycode-v1/acceptance"))
    ap.add_argument("--data-dir", default=str(SHARED / "data"), help="folder holding humaneval.jsonl.gz")
    ap.add_argument("--start", type=int, default=100, help="first HumanEval prompt (0-99 trained the head)")
    ap.add_argument("--limit", type=int, default=64, help="number of prompts from --start")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--settings", default="T1-k50,T0", help="comma list of T1-k50 (T=1, top-k 50) and T0 (greedy)")
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8,9,10", help="fixed draft lengths for sd")
    ap.add_argument("--hs", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,0.95,0.98,0.99", help="specdecpp thresholds h")
    ap.add_argument("--k-min", type=int, default=2)
    ap.add_argument("--k-max", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/specdecpp"))
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="pool saved results.json files (disjoint prompts, same "
                    "configurations) into one table and plots in --out instead of running")
    return ap.parse_args(argv)


SETTINGS = {"T1-k50": {"temperature": 1.0, "top_k": 50}, "T0": {"temperature": 0.0, "top_k": None}}


def configs(args) -> list[tuple[str, dict]]:
    out = [("ar", {})]
    out += [("sd", {"k": int(k)}) for k in args.ks.split(",")]
    out += [("specdecpp", {"head": args.head, "threshold": float(h), "k_min": args.k_min, "k_max": args.k_max})
            for h in args.hs.split(",")]
    return out


def label(method: str, opts: dict) -> str:
    return {"ar": "ar", "sd": f"sd k={opts.get('k')}"}.get(method, f"specdecpp h={opts.get('threshold')}")


def humaneval(data_dir: str, start: int, limit: int) -> list[str]:
    with gzip.open(Path(data_dir) / "humaneval.jsonl.gz", "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [r["prompt"] for r in recs[start:start + limit]]


def environment() -> dict:
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": "cpu", "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "commit": commit, "argv": sys.argv}


COUNTS = ("new_tokens", "target_calls", "drafted_tokens", "num_accepted_draft_tokens", "rounds", "seconds")  # summed


def with_rates(row: dict) -> dict:
    """row (its COUNTS summed over prompts) plus the rates derived from them; run() and merge() both use this."""
    n = max(1, row["new_tokens"])
    return {**row, "tokens_per_s": row["new_tokens"] / row["seconds"],
            "tau": row["new_tokens"] / max(1, row["target_calls"]),
            "discard_rate": (row["drafted_tokens"] - row["num_accepted_draft_tokens"]) / n,
            "verification_rate": row["target_calls"] / n,
            "mean_draft_len": row["drafted_tokens"] / max(1, row["rounds"]) if row["method"] != "ar" else 0.0}


def run(args) -> dict:
    from tqdm import tqdm

    from multispec import generate, load_pair

    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(target=args.target, draft=args.draft, device="cpu", dtype="float32")
    prompts = humaneval(args.data_dir, args.start, args.limit)
    cfgs = configs(args)
    settings = args.settings.split(",")
    keys = [(s, m, json.dumps(o, sort_keys=True)) for s in settings for m, o in cfgs]
    totals = {k: dict.fromkeys(COUNTS, 0) for k in keys}
    for s, m, o in keys:  # warm-up, untimed
        generate(pair, prompts[0], method=m, max_new_tokens=8, seed=args.seed, **SETTINGS[s], **json.loads(o))
    bar = tqdm(total=len(prompts) * len(keys), desc="sweep", unit="gen", dynamic_ncols=True)
    for i, prompt in enumerate(prompts):
        for s, m, o in keys:
            r = generate(pair, prompt, method=m, max_new_tokens=args.max_new_tokens, seed=args.seed + i,
                         **SETTINGS[s], **json.loads(o))
            t = totals[(s, m, o)]
            for f in t:
                t[f] += r.stats[f]
            bar.update(1)
    bar.close()
    rows = []
    for s, m, o in keys:
        t, opts = totals[(s, m, o)], json.loads(o)
        rows.append(with_rates({"setting": s, **SETTINGS[s], "method": m, "label": label(m, opts),
                                "k": opts.get("k"), "h": opts.get("threshold"), **t}))
    return {"settings": {k: v for k, v in vars(args).items()}, "prompts": f"HumanEval {args.start}-"
            f"{args.start + len(prompts) - 1}", "environment": environment(), "rows": rows}


def merge(paths: list[str]) -> dict:
    """Pool runs over disjoint prompt ranges: totals are summed per (setting, config) and every rate is recomputed
    from the sums. Each run's own ratios stay in its own results.json; the pooled tokens/s mixes the runs' timings."""
    runs = [read_json(p) for p in paths]
    configs_of: dict[str, set] = {}
    for p, res in zip(paths, runs):
        for s in res["settings"]["settings"].split(","):
            labels = {r["label"] for r in res["rows"] if r["setting"] == s}
            if configs_of.setdefault(s, labels) != labels:
                sys.exit(f"--merge: {p} has other {s} configurations than the runs before it")
    pooled: dict[tuple, dict] = {}
    for res in runs:
        for r in res["rows"]:
            key = (r["setting"], r["label"])
            if key not in pooled:
                pooled[key] = dict(r)
            else:
                for f in COUNTS:
                    pooled[key][f] += r[f]
    rows = [with_rates(t) for t in pooled.values()]
    settings = dict(runs[0]["settings"])
    settings["settings"] = ",".join(dict.fromkeys(s for res in runs for s in res["settings"]["settings"].split(",")))
    env = dict(runs[0]["environment"], argv=["benchmarks/methods/specdecpp_sweep.py", "--merge", *paths],
               commit=", ".join(dict.fromkeys(str(res["environment"]["commit"]) for res in runs)))
    ranges = dict.fromkeys(res["prompts"].removeprefix("HumanEval ") for res in runs)
    return {"settings": settings, "prompts": f"HumanEval {', '.join(ranges)} ({len(runs)} runs)", "environment": env,
            "runs": [{"path": p, "prompts": res["prompts"], "settings": res["settings"]["settings"],
                      "wall_seconds": res.get("wall_seconds")} for p, res in zip(paths, runs)], "rows": rows}


def markdown(res: dict) -> str:
    a = res["settings"]
    lines = [f"# SpecDec++ sweep: {res['prompts']}, {a['max_new_tokens']} new tokens, k_min/k_max "
             f"{a['k_min']}/{a['k_max']}", "",
             f"Command: `{' '.join(res['environment']['argv'])}`; torch {res['environment']['torch']}, "
             f"transformers {res['environment']['transformers']}, commit {res['environment']['commit']}.", ""]
    for s in a["settings"].split(","):
        rows = [r for r in res["rows"] if r["setting"] == s]
        ar = next(r for r in rows if r["method"] == "ar")
        lines += [f"## {s}", "", "| config | tokens/s | speedup | tau | mean draft len | discard rate | "
                  "verification rate |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['label']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / ar['tokens_per_s']:.2f} "
                         f"| {r['tau']:.2f} | {r['mean_draft_len']:.2f} | {r['discard_rate']:.3f} | "
                         f"{r['verification_rate']:.3f} |")
        sd = [r for r in rows if r["method"] == "sd"]
        pp = [r for r in rows if r["method"] == "specdecpp"]
        if sd and pp:
            bsd, bpp = max(sd, key=lambda r: r["tokens_per_s"]), max(pp, key=lambda r: r["tokens_per_s"])
            lines += ["", f"Best fixed k: {bsd['label']} ({bsd['tokens_per_s']:.1f} tok/s); best SpecDec++: "
                      f"{bpp['label']} ({bpp['tokens_per_s']:.1f} tok/s, "
                      f"{100 * (bpp['tokens_per_s'] / bsd['tokens_per_s'] - 1):+.1f}%)."]
        lines.append("")
    return "\n".join(lines)


def plots(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for s in res["settings"]["settings"].split(","):
        rows = [r for r in res["rows"] if r["setting"] == s]
        sd = sorted((r for r in rows if r["method"] == "sd"), key=lambda r: r["k"])
        pp = sorted((r for r in rows if r["method"] == "specdecpp"), key=lambda r: r["h"])
        fig, ax = plt.subplots(figsize=(5.5, 4.5))
        for series, name, mark, key in ((sd, "SpecDec, fixed k", "s-", "k"), (pp, "SpecDec++, threshold h", "o-", "h")):
            if series:
                ax.plot([r["verification_rate"] for r in series], [r["discard_rate"] for r in series], mark, label=name)
                for r in series:
                    ax.annotate(f"{r[key]:g}", (r["verification_rate"], r["discard_rate"]), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("verification rate (target calls / token)")
        ax.set_ylabel("discard rate (discarded drafts / token)")
        ax.set_title(f"pycode-v1, {res['prompts']}, {s}: lower-left is better", fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"pareto_{s}.png", dpi=120)
        plt.close(fig)
        if not pp:
            continue
        fig, ax = plt.subplots(figsize=(5.5, 4))
        ax.plot([r["h"] for r in pp], [r["tokens_per_s"] for r in pp], "o-", label="SpecDec++")
        if sd:
            best = max(sd, key=lambda r: r["tokens_per_s"])
            ax.axhline(best["tokens_per_s"], ls="--", c="C1", label=f"best fixed k ({best['label']})")
        ar = next((r for r in rows if r["method"] == "ar"), None)
        if ar:
            ax.axhline(ar["tokens_per_s"], ls=":", c="gray", label="ar (target only)")
        ax.set_xlabel("threshold h")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"pycode-v1, {res['prompts']}, {s}", fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"tps_{s}.png", dpi=120)
        plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = merge(args.merge) if args.merge else run(args)
    res["wall_seconds"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "results.md").write_text(markdown(res))
    plots(res, out)
    print(markdown(res))
    print(f"wrote {out}/results.json, results.md, pareto_*.png, tps_*.png")


if __name__ == "__main__":
    main()
