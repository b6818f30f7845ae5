"""Time one `ot` node verification at V = 32,000, n = 4 (issue 14's cost goal: median <= 5 ms).

One call = what the tree walk does at a node: VerifierSpec.verify on p, q [1, V] float32 torch tensors and the
n drafted tokens, i.e. the optimal selection law, the key pieces, the selection probabilities of the drafts and
the sampled outcome. Pairs: softmax of Zipf+Gaussian logits (benchmarks/verifiers/optimal_speed.py's LLM-like pair) at
several seeds and temperatures; rrs is timed on the same calls for a ratio. Wall time (perf_counter) and CPU
time (process_time: less sensitive to other jobs on a shared machine) are both recorded.
Writes benchmarks/results/ot/ot_speed.json. Run: PYTHONPATH=src python benchmarks/verifiers/ot_speed.py
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import scipy
import torch

from multispec.bench.runner import cpu_name, git_commit
from multispec.optimal import optimal_acceptance
from multispec.verify import REGISTRY
from multispec.verify.ot import ot_selection

from optimal_speed import llm_like_pair


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of fn()."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=5, help="timed calls per pair (different drafts)")
    ap.add_argument("--temperatures", default="0.5,0.7,1.0")
    ap.add_argument("--out", default="benchmarks/results/ot/ot_speed.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rows, ot_wall, ot_cpu, rrs_wall, rrs_cpu = [], [], [], [], []
    for seed in range(args.seeds):
        p0, q0 = llm_like_pair(args.vocab, seed)
        for t in (float(x) for x in args.temperatures.split(",")):
            p, q = p0 ** (1 / t), q0 ** (1 / t)
            p, q = p / p.sum(), q / q.sum()
            pt, qt = torch.tensor(p, dtype=torch.float32)[None], torch.tensor(q, dtype=torch.float32)[None]
            sel = ot_selection(p, q, args.drafts)
            REGISTRY["ot"].verify(pt, qt, REGISTRY["ot"].draw(qt, args.drafts, gen), gen)  # warm-up
            for _ in range(args.calls):
                drafts = REGISTRY["ot"].draw(qt, args.drafts, gen)
                w, c = timed(lambda: REGISTRY["ot"].verify(pt, qt, drafts, gen))
                ot_wall.append(w)
                ot_cpu.append(c)
                w, c = timed(lambda: REGISTRY["rrs"].verify(pt, qt, drafts, gen))
                rrs_wall.append(w)
                rrs_cpu.append(c)
            rows.append({"seed": seed, "temperature": t, "alpha_star": optimal_acceptance(p, q, args.drafts),
                         "ot_acceptance": sel.acceptance, "tokens_swept": sel.swept,
                         "median_wall_s": float(np.median(ot_wall[-args.calls:])),
                         "median_cpu_s": float(np.median(ot_cpu[-args.calls:]))})
            print(f"seed {seed} T {t}: ot {rows[-1]['median_wall_s'] * 1e3:.1f} ms wall, "
                  f"{rows[-1]['median_cpu_s'] * 1e3:.1f} ms cpu, swept {sel.swept}, "
                  f"gap {sel.acceptance - rows[-1]['alpha_star']:.2e}")
    summary = {"ot_median_wall_s": float(np.median(ot_wall)), "ot_median_cpu_s": float(np.median(ot_cpu)),
               "rrs_median_wall_s": float(np.median(rrs_wall)), "rrs_median_cpu_s": float(np.median(rrs_cpu)),
               "ot_over_rrs_cpu": float(np.median(ot_cpu) / np.median(rrs_cpu)),
               "calls": len(ot_wall), "fraction_pairs_with_sweep": float(np.mean([r["tokens_swept"] > 0 for r in rows])),
               "max_abs_gap_to_alpha_star": float(max(abs(r["ot_acceptance"] - r["alpha_star"]) for r in rows)),
               "ot_wall_p90_s": float(np.quantile(ot_wall, 0.9)), "ot_wall_max_s": float(np.max(ot_wall))}
    print(json.dumps(summary, indent=2))
    record = {
        "benchmark": "ot node verification, one call (VerifierSpec.verify, B = 1)", "vocab": args.vocab,
        "drafts": args.drafts, "pair": "optimal_speed.llm_like_pair(seed), p and q raised to 1/T",
        "summary": summary, "rows": rows, "device": "cpu", "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "numpy": np.__version__,
        "scipy": scipy.__version__, "torch": torch.__version__, "git_commit": git_commit(),
        "load_average_1m": os.getloadavg()[0],
        "note": "shared 2-core machine with other jobs running (see load_average_1m): CPU time is the fairer figure",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
