"""Greedy identity with the shipped head (issue 37, Done means, first bullet): SmolLM2-135M-Instruct's greedy
output through `eagle` and `auto` with `head="shipped"` against transformers' own `generate(do_sample=False)`, token
for token, HumanEval 0-19 (raw text) x 128 new tokens, both backends (hf, fast). A mismatch records its first
differing position and whether it is a near-tie (real_greedy_identity.tie_check). One thread, CPU, float32.

    python benchmarks/eagle/head_greedy_identity.py   # -> benchmarks/results/eagle/smollm2_gpu/greedy_identity.json
    python benchmarks/eagle/head_greedy_identity.py --adapt --max-new-tokens 256 --backends fast \
        --out benchmarks/results/eagle/adapt_identity.json   # issue 67: the head adapting while it drafts
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "pretrained"))  # real_greedy_identity.py
sys.path.insert(0, str(ROOT / "tests"))
from real_greedy_identity import encode, reference, tie_check  # noqa: E402

METHODS = [("eagle", {"head": "shipped", "k": 3}), ("auto", {"head": "shipped"})]


def main() -> None:
    from multispec import generate, load_pair
    from multispec.data import load_prompts
    from real_models import find_smollm2

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--humaneval", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--adapt", action="store_true", help="the head adapting while it drafts (adapt=on)")
    ap.add_argument("--backends", default="hf,fast")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/eagle/smollm2_gpu/greedy_identity.json"))
    a = ap.parse_args()
    methods = [(m, {**o, "adapt": "on"} if a.adapt else o) for m, o in METHODS]
    torch.set_num_threads(1)
    pair = load_pair(target=str(find_smollm2()), device="cpu")
    rows: dict = {}
    t0 = time.monotonic()
    for i, p in enumerate(load_prompts("humaneval", a.data_dir, limit=a.humaneval)):
        ids = encode(pair, p.text, template=False)
        ref = reference(pair, ids, a.max_new_tokens)
        for method, options in methods:
            for backend in a.backends.split(","):
                got = generate(pair, ids, method=method, max_new_tokens=a.max_new_tokens, temperature=0,
                               backend=backend, **options).token_ids
                row = rows.setdefault(f"{method}/{backend}", {"equal": 0, "total": 0, "mismatches": []})
                row["total"] += 1
                if got == ref:
                    row["equal"] += 1
                else:
                    row["mismatches"].append({"prompt": p.id, **tie_check(pair, ids, ref, got)})
        print(f"{i + 1} prompts, {time.monotonic() - t0:.0f} s: "
              + ", ".join(f"{k} {r['equal']}/{r['total']}" for k, r in rows.items()), file=sys.stderr, flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    import transformers

    out = {"meta": {"commit": commit, "torch": torch.__version__, "transformers": transformers.__version__,
                    "threads": 1, "device": "cpu", "dtype": "float32"},
           "config": {"prompts": f"humaneval 0-{a.humaneval - 1}", "max_new_tokens": a.max_new_tokens,
                      "methods": [f"{m}:{','.join(f'{k}={v}' for k, v in o.items())}" for m, o in methods]},
           "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: f"{r['equal']}/{r['total']}" for k, r in rows.items()}))


if __name__ == "__main__":
    main()
