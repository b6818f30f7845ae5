"""Ablation of the three P1 ideas (design §6) on pycode-v1: target-initialized trees, the dynamic sliced mask with a
fork tree, and the two decision models.

Rows: ar, sd (k=4), mcsd (4,2,2,1), ti-mcsd (2,4,3,1,1), ti-mcsd W=1 (1,4,3,1,1), dynamic fork (W=4, D=5) without a
decision model, with type 1, with type 2, and the same three with target_init=True (lossy, W=4).
Columns: tau, acceptance rate, tokens/s, speedup over ar, and the distortion measure: the target's own mean
log-likelihood per generated token (teacher-forced, T = 1 log-probs of the target model) minus ar's at the same
temperature (0 for lossless methods up to sampling noise; W >= 2 target-initialized methods move it). Plus the exact
first-token total-variation distance of ti-mcsd W=2 on the tiny pair of tests/test_engine_sampling.py
(`multispec.optimal.ti_distortion`).

Same prompts, token ids and seeds for every method; one untimed warm-up per method; the timed loop interleaves the
methods per prompt. Writes benchmarks/results/ablation/{ablation.json, ablation.md} and, through
`multispec.bench.report`, results.md / speedup.png.

Full run (the lead, quiet CPU):
    .venv/bin/python benchmarks/methods/ablation_mcsd.py --prompts 40 --max-new-tokens 128 --threads 2
Smoke run:
    .venv/bin/python benchmarks/methods/ablation_mcsd.py --prompts 3 --max-new-tokens 32 --out benchmarks/results/ablation/smoke
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
PAIR = SHARED / "models" / "pycode-v1"
HEADS = ROOT / "heads" / "pycode-v1"


def read_json(path):
    """A saved JSON file, plain or gzipped (benchmarks/results keeps large ones as .json.gz)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def rows(with_ti_dynamic: bool, widths: tuple[int, ...] = (4,), static: bool = True) -> list[tuple[str, str, dict]]:
    """(label, method, options) of every row: ar, the static rows (unless static=False), and the dynamic fork with
    depth 5 at each width, without and with each decision model."""
    d1, d2 = str(HEADS / "decision-type1"), str(HEADS / "decision-type2")
    out = [("ar", "ar", {})]
    if static:
        out += [
            ("sd k=4", "sd", {"k": 4}),
            ("mcsd 4,2,2,1", "mcsd", {"tree": (4, 2, 2, 1)}),
            ("ti-mcsd 2,4,3,1,1", "ti-mcsd", {"tree": (2, 4, 3, 1, 1)}),
            ("ti-mcsd 1,4,3,1,1", "ti-mcsd", {"tree": (1, 4, 3, 1, 1)}),
        ]
    for w in widths:
        out += [
            (f"dynamic W{w} D5", "dynamic", {"width": w, "depth": 5}),
            (f"dynamic W{w} D5 +type1", "dynamic", {"width": w, "depth": 5, "decision_model": d1}),
            (f"dynamic W{w} D5 +type2", "dynamic", {"width": w, "depth": 5, "decision_model": d2}),
        ]
    if with_ti_dynamic:
        out += [
            ("dynamic-ti W4 D5", "dynamic", {"width": 4, "depth": 5, "target_init": True}),
            ("dynamic-ti W4 D5 +type1", "dynamic", {"width": 4, "depth": 5, "target_init": True, "decision_model": d1}),
            ("dynamic-ti W4 D5 +type2", "dynamic", {"width": 4, "depth": 5, "target_init": True, "decision_model": d2}),
        ]
    return out


@torch.inference_mode()
def target_loglik(model: torch.nn.Module, prompt: list[int], new: list[int]) -> float:
    """Sum of log p_target(new_t | prompt, new_<t) at T = 1 (teacher-forced, raw target logits)."""
    if not new:
        return 0.0
    ids = torch.tensor([prompt + new])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1:-1].double(), -1)  # [L, V]
    return float(logp.gather(1, torch.tensor(new)[:, None]).sum())


def tiny_tv_table() -> list[dict]:
    from multispec.optimal.ti_distortion import tiny_pair_tv

    out = []
    for width, below, temp in [(2, (1,), 1.0), (2, (1, 1, 1), 1.0), (2, (2, 1), 1.0), (2, (2, 1), 0.7),
                               (2, (4, 3, 1, 1), 1.0), (2, (4, 3, 1, 1), 0.7), (3, (2, 1), 1.0), (1, (4, 3, 1, 1), 1.0),
                               (2, (2, 1), 0.0)]:
        law = tiny_pair_tv(width, below, temp)
        out.append({"tree": [width, *below], "temperature": temp, "first_token_tv": law.tv})
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=40, help="prompts per data set (HumanEval 0.., alpaca_eval 0..)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", default="0.7,0", help="comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-ti-dynamic", action="store_true", help="skip the target-initialized dynamic rows")
    ap.add_argument("--widths", default="4", help="comma-separated widths of the dynamic fork rows")
    ap.add_argument("--no-static", action="store_true", help="only ar and the dynamic rows (a width study)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ablation"))
    ap.add_argument("--target", default=str(PAIR / "target"))
    ap.add_argument("--draft", default=str(PAIR / "draft"))
    ap.add_argument("--data-dir", default=str(SHARED / "data"))
    ap.add_argument("--render", metavar="JSON", help="only rewrite ablation.md beside a saved ablation.json")
    args = ap.parse_args(argv)
    if args.render:
        saved = read_json(args.render)
        Path(args.render).with_name("ablation.md").write_text(markdown(saved))
        return saved
    torch.set_num_threads(args.threads)

    from multispec.api import generate, load_pair
    from multispec.loading import vocab_rows
    from multispec.text import encode_prompt
    from multispec.bench.runner import environment
    from multispec.data import load_prompts, truncate_ids

    pair = load_pair(target=args.target, draft=args.draft, device="cpu", dtype="float32")
    table = rows(not args.no_ti_dynamic, tuple(int(w) for w in args.widths.split(",")), not args.no_static)
    temps = [float(t) for t in args.temperatures.split(",")]
    prompts = []
    for ds in ("humaneval", "alpaca"):
        for p in load_prompts(ds, args.data_dir, limit=args.prompts):
            ids, _ = truncate_ids(encode_prompt(pair.tokenizer, vocab_rows(pair.target), p.text), 512, pair.tokenizer.bos_token_id)
            prompts.append((ds, p.id, ids))
    records = []
    for label, method, opts in table:  # warm-up, untimed
        generate(pair, prompts[0][2], method=method, max_new_tokens=8, temperature=temps[0], seed=0, **opts)
    total = len(temps) * len(prompts) * len(table)
    done, t_start = 0, time.perf_counter()
    for temp in temps:
        for ds, pid, ids in prompts:
            for label, method, opts in table:
                r = generate(pair, ids, method=method, max_new_tokens=args.max_new_tokens, temperature=temp,
                             seed=args.seed, **opts)
                s = r.stats
                records.append({
                    "method": label, "method_name": method, "options": {k: str(v) for k, v in opts.items()},
                    "dataset": ds, "category": ds, "prompt_id": pid, "temperature": temp,
                    "new_tokens": s["new_tokens"], "seconds": s["seconds"], "target_calls": s["target_calls"],
                    "draft_calls": s["draft_calls"], "rounds": s["rounds"], "accepted": s["num_accepted_draft_tokens"],
                    # stats carry the rate, not the depth; a generation that accepted nothing counts depth 0 (rare)
                    "drafted_depth": s["num_draft_tokens"],
                    "prefill_s": s["prefill_s"], "draft_s": s["draft_s"], "verify_s": s["verify_s"],
                    "cache_s": s["cache_s"], "lossless": s["lossless"],
                    "loglik": target_loglik(pair.target, ids, r.token_ids), "token_ids": r.token_ids,
                })
                done += 1
                print(f"\r{done}/{total} {time.perf_counter() - t_start:.0f}s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for rec in records:  # greedy: same tokens as ar?
        if rec["temperature"] == 0:
            ar = next(x for x in records if x["method"] == "ar" and x["prompt_id"] == rec["prompt_id"]
                      and x["dataset"] == rec["dataset"] and x["temperature"] == 0)
            rec["same_as_ar"] = rec["token_ids"] == ar["token_ids"]
    summary = summarize(records, table, temps)
    results = {"meta": environment(pair, sys.argv if argv is None else argv), "settings": vars(args),
               "summary": summary, "tiny_pair_first_token_tv": tiny_tv_table(), "records": records}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "ablation.md").write_text(markdown(results))
    try:
        from multispec.bench.report import render

        render({"meta": results["meta"], "settings": results["settings"],
                "records": [{k: v for k, v in r.items() if k != "token_ids"} for r in records]}, out)
    except Exception as e:  # the shared report is a convenience; the ablation tables above are the result
        print(f"bench.report render skipped: {e}", file=sys.stderr)
    print(markdown(results))
    return results


def summarize(records: list[dict], table, temps) -> list[dict]:
    """One row per (temperature, method) over both data sets. Ratios are of sums."""
    out = []
    for temp in temps:
        ar = [r for r in records if r["temperature"] == temp and r["method"] == "ar"]
        ar_tps = sum(r["new_tokens"] for r in ar) / sum(r["seconds"] for r in ar)
        ar_ll = sum(r["loglik"] for r in ar) / max(1, sum(r["new_tokens"] for r in ar))
        for label, method, _ in table:
            rs = [r for r in records if r["temperature"] == temp and r["method"] == label]
            new = sum(r["new_tokens"] for r in rs)
            secs = sum(r["seconds"] for r in rs)
            calls = sum(r["target_calls"] for r in rs)
            depth = sum(r["drafted_depth"] for r in rs)
            ll = sum(r["loglik"] for r in rs) / max(1, new)
            per_prompt = [r["loglik"] / r["new_tokens"] for r in rs if r["new_tokens"]]
            sd = (sum((x - sum(per_prompt) / len(per_prompt)) ** 2 for x in per_prompt) / max(1, len(per_prompt) - 1)
                  ) ** 0.5 if per_prompt else math.nan
            same = [r["same_as_ar"] for r in rs if "same_as_ar" in r]
            out.append({
                "temperature": temp, "method": label, "lossless": all(r["lossless"] for r in rs),
                "generations": len(rs), "new_tokens": new, "tau": new / calls if calls else None,
                "acceptance_rate": sum(r["accepted"] for r in rs) / depth if depth else None,
                "tokens_per_s": new / secs, "speedup": (new / secs) / ar_tps,
                "loglik_per_token": ll, "loglik_vs_ar": ll - ar_ll,
                "loglik_se": sd / len(per_prompt) ** 0.5 if per_prompt else None,
                "greedy_same_as_ar": sum(same) / len(same) if same else None,
            })
    return out


def markdown(results: dict) -> str:
    s = results["settings"]
    m = results["meta"]
    lines = [f"# MCSD ablation (pycode-v1, {s['prompts']} HumanEval + {s['prompts']} alpaca_eval prompts, "
             f"{s['max_new_tokens']} new tokens)", "",
             f"device {m['device']} ({m['cpu']}, {s['threads']} threads), torch {m['torch']}, "
             f"commit {m['git_commit']}, load average at start {m.get('load_average')}", "",
             "loglik = the target's mean T=1 log-probability per generated token (teacher-forced); "
             "Δ vs ar at the same temperature (± one standard error of the per-prompt means). "
             "Lossless methods differ from ar by sampling noise only.", ""]
    for temp in sorted({r["temperature"] for r in results["summary"]}, reverse=True):
        lines += [f"## T = {temp}", "",
                  "| method | lossless | tau | accept | tok/s | speedup | loglik/token | Δ vs ar | greedy = ar |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in results["summary"]:
            if r["temperature"] != temp:
                continue
            f = lambda v, fmt: "n/a" if v is None else fmt.format(v)  # noqa: E731
            lines.append(f"| {r['method']} | {'yes' if r['lossless'] else 'NO'} | {f(r['tau'], '{:.2f}')} | "
                         f"{f(r['acceptance_rate'], '{:.2f}')} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
                         f"{r['loglik_per_token']:.3f} | {r['loglik_vs_ar']:+.3f} ± {f(r['loglik_se'], '{:.3f}')} | "
                         f"{f(r['greedy_same_as_ar'], '{:.0%}')} |")
        lines.append("")
    lines += ["## Exact first-token TV of ti-mcsd on the tiny pair", "",
              "Tiny random Llama pair of tests/test_engine_sampling.py (V = 8, prompt 1,4,2), exact enumeration "
              "(`multispec.optimal.ti_distortion.first_token_law`).", "",
              "| tree | T | TV(first token) |", "|---|---|---|"]
    for r in results["tiny_pair_first_token_tv"]:
        lines.append(f"| {','.join(map(str, r['tree']))} | {r['temperature']} | {r['first_token_tv']:.3g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
