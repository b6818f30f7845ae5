"""Does `auto` back off where a draft of another family cannot pay (issue 36, Build item 7)? Gemma 3 270M drafted by
SmolLM2-135M-Instruct (different tokenizers: token-level intersection), `auto` against `ar` on the same pair, and
`auto` on Gemma alone for reference: HumanEval and Spec-Bench prompts (raw text: Gemma's GGUF file has no chat
template), 64 new tokens, T = 0 and 1, one thread, the systems interleaved per prompt (order rotated) in one process,
after one untimed warm-up each. Records each run's seconds, tokens and `stats["auto"]` (plans chosen, costs).

    python benchmarks/pretrained/real_cross_family_auto.py --prompts 3 --out benchmarks/results/real_cross_family_auto.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # real_models: where the GGUF files are

SYSTEMS = [("ar", "cross", "ar"), ("auto (SmolLM2 draft)", "cross", "auto"), ("auto (no draft)", "own", "auto")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--prompts", type=int, default=3, help="per data set")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--backend", default="hf")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "real_cross_family_auto.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)

    import multispec
    import real_models
    from multispec.bench.runner import environment
    from multispec.data import load_prompts
    from multispec.decoding.decoder import Decoder

    gemma, smollm2 = real_models.find_gemma(), real_models.find_smollm2()
    if gemma is None or smollm2 is None:
        sys.exit("needs both GGUF files: python scripts/fetch_models.py")
    pairs = {"cross": multispec.load_pair(target=str(gemma), draft=str(smollm2), device="cpu"),
             "own": multispec.load_pair(target=str(gemma), device="cpu")}
    prompts = (load_prompts("humaneval", args.data_dir, limit=args.prompts)
               + load_prompts("spec-bench", args.data_dir, limit=1)[:args.prompts])
    temps = [float(t) for t in args.temperatures.split(",")]
    decoders = {label: Decoder(pairs[p], method, args.backend) for label, p, method in SYSTEMS}
    first = prompts[0].text
    for label, dec in decoders.items():  # untimed warm-up (auto measures its costs on its first run)
        for t in temps:
            dec.generate(first, max_new_tokens=8, temperature=t, seed=0)
    records = []
    for t in temps:
        for i, p in enumerate(prompts):
            order = SYSTEMS[i % len(SYSTEMS):] + SYSTEMS[:i % len(SYSTEMS)]
            for label, _, _ in order:
                t0 = time.perf_counter()
                res = decoders[label].generate(p.text, max_new_tokens=args.max_new_tokens, temperature=t, seed=i)
                secs = time.perf_counter() - t0
                st = res.stats
                records.append({"system": label, "temperature": t, "prompt": p.id, "category": p.category,
                                "seconds": secs, "new_tokens": st["new_tokens"], "tokens_per_s": st["new_tokens"] / secs,
                                "tau": st.get("tau"), "draft_calls": st.get("draft_calls"),
                                "target_calls": st.get("target_calls"), "auto": st.get("auto"),
                                "split_s": {k: st.get(k) for k in ("prefill_s", "draft_s", "verify_s", "cache_s")},
                                "token_ids": list(res.token_ids)})
                print(f"T={t:g} {p.id:>14} {label:<22} {st['new_tokens'] / secs:6.2f} tok/s tau {st.get('tau'):.2f} "
                      f"plans {list((st.get('auto') or {}).get('plans', {}))}", flush=True)
    summary = []
    for t in temps:
        ar = {r["prompt"]: r for r in records if r["temperature"] == t and r["system"] == "ar"}
        for label, _, _ in SYSTEMS:
            rows = [r for r in records if r["temperature"] == t and r["system"] == label]
            tokens, secs = sum(r["new_tokens"] for r in rows), sum(r["seconds"] for r in rows)
            ratios = [(r["new_tokens"] / r["seconds"]) / (ar[r["prompt"]]["new_tokens"] / ar[r["prompt"]]["seconds"])
                      for r in rows]
            plans: dict = {}
            for r in rows:
                for key, v in ((r["auto"] or {}).get("plans") or {}).items():
                    plans[key] = plans.get(key, 0) + v["rounds"]
            summary.append({"system": label, "temperature": t, "tokens_per_s": tokens / secs,
                            "vs_ar_median": statistics.median(ratios), "vs_ar_min": min(ratios),
                            "vs_ar_max": max(ratios), "plan_rounds": plans,
                            "greedy_equal_ar": (sum(r["token_ids"] == ar[r["prompt"]]["token_ids"] for r in rows)
                                                if t == 0 else None)})
            print(json.dumps(summary[-1]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": environment(pairs["cross"], sys.argv),
                               "settings": {**vars(args), "gemma": str(gemma), "smollm2": str(smollm2),
                                            "cross_vocab": pairs["cross"].cross_vocab, "threads": 1},
                               "summary": summary, "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
