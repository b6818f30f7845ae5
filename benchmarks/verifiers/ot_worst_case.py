"""Worst-case cost of one `ot` call (issue 28): V <= 32k, n <= 8, over pairs chosen to be hard as well as LLM-like.

One call = VerifierSpec.verify at one node: p, q [1, V] float32 torch tensors and n drafts drawn from q (the optimal
selection law, the key pieces, the drafts' selection probabilities, the sampled outcome). Families: `llm` (softmax
of Gaussian logits, the draft a noisy copy), `dirichlet` (independent Dirichlet(a) pairs, a in 0.01..1: no relation
between p and q, which defeats the closed form of the key pieces most often), `flat` (independent uniform weights)
and `peaked` (one token holds most of p, q spread out). The per-family worst, median and the tokens placed by the
sequential sweep are recorded with the machine; one torch thread.
Writes benchmarks/results/ot/ot_worst_case.json. Run: PYTHONPATH=src python benchmarks/verifiers/ot_worst_case.py [--quick]
[--vocabs 262144 --out benchmarks/results/ot/ot_worst_case_262k.json]
"""
import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from multispec.verify import REGISTRY
from multispec.verify.ot import ot_selection

FAMILIES = ("llm", "dirichlet", "flat", "peaked")


def pair(family: str, v: int, rng) -> tuple[np.ndarray, np.ndarray]:
    if family == "llm":
        z = rng.normal(size=v) * rng.uniform(1, 4)
        zq = z + rng.normal(size=v) * rng.uniform(0.3, 2)
        p, q = np.exp(z - z.max()), np.exp(zq - zq.max())
    elif family == "dirichlet":
        a = float(rng.choice([0.01, 0.03, 0.1, 0.3, 1.0]))
        p, q = rng.dirichlet([a] * v), rng.dirichlet([a] * v)
    elif family == "flat":
        p, q = rng.uniform(size=v), rng.uniform(size=v)
    else:
        p, q = rng.uniform(size=v) * 1e-3, rng.uniform(size=v)
        p[rng.integers(v)] = 1.0
    p, q = p.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)
    return p / p.sum(), q / q.sum()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer pairs per cell (a smoke run)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "ot" / "ot_worst_case.json"))
    ap.add_argument("--vocabs", default="1000,8000,32000", help="comma-separated vocabulary sizes")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = REGISTRY["ot"]
    reps = 2 if args.quick else 6
    rng = np.random.default_rng(28)
    rows = []
    for v in (int(x) for x in args.vocabs.split(",")):
        for n in (2, 3, 4, 6, 8):
            for family in FAMILIES:
                times, swept = [], []
                for _ in range(reps):
                    p, q = pair(family, v, rng)
                    pt, qt = torch.from_numpy(p).float()[None], torch.from_numpy(q).float()[None]
                    drafts = torch.multinomial(qt, n, replacement=True)
                    t0 = time.perf_counter()
                    spec.verify(pt, qt, drafts, torch.Generator().manual_seed(0))
                    times.append(time.perf_counter() - t0)
                    swept.append(ot_selection(p, q, n).swept)
                rows.append({"V": v, "n": n, "family": family, "pairs": reps, "worst_ms": 1e3 * max(times),
                             "median_ms": 1e3 * float(np.median(times)), "max_swept_tokens": max(swept)})
                print(f"V={v:>6} n={n} {family:<9} worst {rows[-1]['worst_ms']:8.1f} ms  median "
                      f"{rows[-1]['median_ms']:7.1f} ms  swept {max(swept)}", flush=True)
    worst = max(rows, key=lambda r: r["worst_ms"])
    out = {"what": "one ot VerifierSpec.verify call (selection law, key pieces, selection probabilities, sample)",
           "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                       "torch": torch.__version__, "threads": 1},
           "worst": worst, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"worst: {worst['worst_ms']:.1f} ms at V={worst['V']} n={worst['n']} ({worst['family']}); wrote {args.out}")


if __name__ == "__main__":
    main()
