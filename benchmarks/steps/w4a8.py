"""w4a8 products (models/w4a8.py) against torch's int4 and int8 ones, one thread, and what each costs in accuracy.

    python benchmarks/steps/w4a8.py kernels   # ms per product at 1-16 rows, Qwen2.5-Coder-1.5B's shapes
    python benchmarks/steps/w4a8.py quality   # SmolLM2 perplexity: float32 / int8 / int4 / w4a8

kernels: every product of the 1.5B's layers (q/k/v fused, o, gate/up fused, down, output layer) on random weights,
at 1, 2, 4, 8 and 16 rows, as PackedInt4 (torch's _weight_int4pack_mm_for_cpu), PackedInt8 (fbgemm's dynamic
int8 linear, row-exact) and PackedW4A8. Each cell: the thread's CPU time per call, the least of REPS runs of at
least 0.15 s each (the machine is shared: CPU time is not inflated by waiting for a core, wall time is), the kinds
interleaved run by run. "model_ms" adds up one token's products: 28 layers x (qkv + o + gate/up + down) + output.
Results: benchmarks/results/quantized/w4a8_kernels.json, w4a8_quality.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from quantized import OUT, _perplexity, _quality_texts, meta  # noqa: E402

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960),
          "output": (151936, 1536)}
LAYERS = 28  # Qwen2.5-Coder-1.5B
ROWS = (1, 2, 4, 8, 16)
REPS = 5


def cpu_seconds(f, x: torch.Tensor, least: float = 0.15) -> float:
    f(x)
    t, n = time.thread_time(), 0
    while time.thread_time() - t < least or n < 2:
        f(x)
        n += 1
    return (time.thread_time() - t) / n


def kernels() -> None:
    from multispec.models.int8 import PackedInt4, PackedInt8
    from multispec.models.w4a8 import PackedW4A8

    kinds = {"int4": PackedInt4, "int8": PackedInt8, "w4a8": PackedW4A8}
    ms: dict = {k: {} for k in kinds}
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02
        products = {kind: cls([w], [None]) for kind, cls in kinds.items()}
        del w
        xs = {m: torch.randn(m, k, generator=torch.Generator().manual_seed(m)) for m in ROWS}
        best = {kind: {m: float("inf") for m in ROWS} for kind in kinds}
        for _ in range(REPS):
            for m in ROWS:
                for kind, p in products.items():
                    best[kind][m] = min(best[kind][m], cpu_seconds(p.apply, xs[m]))
        for kind in kinds:
            ms[kind][name] = {str(m): round(best[kind][m] * 1e3, 3) for m in ROWS}
        print(name, {kind: ms[kind][name] for kind in kinds}, flush=True)
        del products
    model = {kind: {str(m): round(LAYERS * sum(ms[kind][s][str(m)] for s in ("qkv", "o", "gate_up", "down"))
                                  + ms[kind]["output"][str(m)], 1) for m in ROWS} for kind in kinds}
    weights = sum(n * k for n, k in SHAPES.values() if (n, k) != SHAPES["output"]) * LAYERS + 151936 * 1536
    result = {"meta": meta(), "shapes": {s: list(v) for s, v in SHAPES.items()}, "rows": list(ROWS),
              "what": "thread CPU ms per product call, least of 5 runs; model_ms: 28 layers + output layer",
              "ms": ms, "model_ms": model,
              "w4a8_gb_per_s_at_1_row": {s: round(n * k * 0.625 / (ms["w4a8"][s]["1"] * 1e-3) / 1e9, 1)
                                         for s, (n, k) in SHAPES.items()},
              "linear_weights": weights}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "w4a8_kernels.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(model, indent=1))


def quality() -> None:
    import multispec
    from real_models import find_smollm2

    texts = _quality_texts()
    ppl: dict = {name: {} for name in texts}
    for dtype in ("float32", "int8", "int4", "w4a8"):
        pair = multispec.load_pair(target=str(find_smollm2()), dtype=dtype)
        for name, ts in texts.items():
            ppl[name][dtype] = round(_perplexity(pair, ts), 4)
        print(dtype, {name: v[dtype] for name, v in ppl.items()}, flush=True)
        del pair
    rel = {name: {d: f"{100 * (v / by['float32'] - 1):+.1f} %" for d, v in by.items() if d != "float32"}
           for name, by in ppl.items()}
    result = {"meta": meta(), "model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32, then each dtype)",
              "perplexity": ppl, "against_float32": rel}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "w4a8_quality.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(rel, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("kernels", "quality"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    with torch.inference_mode():
        kernels() if a.what == "kernels" else quality()


if __name__ == "__main__":
    main()
