"""The few-row linear product (float32 on the CPU), and the table of row counts where it measures faster.

A decode step multiplies one row by every weight matrix, a verification k + 1 rows. On this project's machines
(AMD EPYC, torch 2.13's MKL, one thread) `F.linear(x, W)` over 1-3 rows is slow and grows with every row: over
SmolLM2-135M's 211 projections 46 / 77 / 98 ms for 1 / 2 / 3 rows, as if W were read once per row. The same product
taken as `W @ x.T` (x padded to two rows, so that the BLAS takes its matrix-matrix path) reads W once: 31 / 29 /
46 ms. So one token costs a third less and a two-token verification costs what one token did, which is what makes
speculation pay on a CPU (benchmarks/results/rows/).

Which form wins depends on the CPU, the BLAS and the thread count, so it is measured, not assumed: `table` times
both forms over the model's own weights for 1 ... ROWS rows (about a second for a 135M model), once per machine,
thread count and set of weight shapes (kept in the machine profile, section "rows": multispec/profile.py), and
returns the row counts where `W @ x.T` was faster. The fast backend is given that table and takes `linear` for its products (it owns its
matmuls); nothing is patched into a model, so the transformers backend runs the stock layers. Both forms compute
the same products in float32; they differ in the order of the sums, so logits differ in the last bits (as a
one-row step and a many-row forward already do), never more.
"""
from __future__ import annotations

import platform
import time

import torch
import torch.nn.functional as F

ROWS = 8  # row counts measured; more rows always take F.linear
WIN = 0.95  # the few-row form is used where it took at most this fraction of F.linear's time
SAMPLE_BYTES = 160 * 2**20  # the weights timed: about this many bytes of them


def few_rows(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, bias) as w @ x.T: x [..., K] of R rows (one row is padded to two), w [N, K]. [..., N]."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    rows = x2.shape[0]
    if rows == 1:
        x2 = torch.cat([x2, x2.new_zeros(1, k)])
    out = torch.mm(w, x2.t()).t()[:rows].contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], w.shape[0])


def linear(layer: torch.nn.Module, x: torch.Tensor, table: list[bool] | None) -> torch.Tensor:
    """layer(x), taken as `few_rows` where `table` (index: rows; from `table`) says so for a float32 CPU
    nn.Linear at x's row count; any other layer, or table None, runs as it is."""
    if table is not None and type(layer) is torch.nn.Linear:
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        w = layer.weight
        if 0 < rows < len(table) and table[rows] and w.dtype == torch.float32 and w.device.type == "cpu":
            return few_rows(x, w, layer.bias)
    return layer(x)


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
            and m.weight.device.type == "cpu" and m.weight.dim() == 2]


def table(model: torch.nn.Module, profile=None) -> tuple[list[bool] | None, dict]:
    """Where `model`'s float32 CPU Linear layers take the few-row product: [False, at 1 row, ..., at ROWS rows] —
    the machine profile's (keyed per torch version, threads, CPU and weight shapes), else measured now (~1 s for a
    135M model) — or None when the model has no such layer. Returns it and the new profile entries ({} when the
    profile had it)."""
    key = profile_key(model)
    if key is None:
        return None, {}
    stored = profile.get("rows", key) if profile is not None else None
    if isinstance(stored, list) and len(stored) == ROWS + 1 and all(isinstance(v, bool) for v in stored):
        return stored, {}
    measured = measure([m.weight for m in _linears(model)])
    return measured, {key: measured}


def profile_key(model: torch.nn.Module) -> str | None:
    """What a table depends on (torch version, threads, CPU, the float32 CPU Linear layers' shapes), or None for a
    model without such layers."""
    linears = _linears(model)
    if not linears:
        return None
    shapes = sorted({tuple(m.weight.shape) for m in linears})
    return "|".join(str(x) for x in (torch.__version__, torch.get_num_threads(), platform.processor()
                                     or platform.machine(), len(linears), shapes))


def signature(table: list[bool] | None) -> str:
    """Which row counts take the few-row product under `table` ("" for none): part of the cost cache's key, since
    a forward's cost by row count depends on it."""
    return "" if table is None else "rows:" + "".join("1" if v else "0" for v in table[1:])


@torch.inference_mode()
def measure(weights: list[torch.Tensor], reps: int = 3) -> list[bool]:
    """[False, use few_rows at 1 row, ..., at ROWS rows]: both forms timed over the weights in turn (as a forward
    streams them; every j-th one past SAMPLE_BYTES, which is still far more than any CPU cache holds), interleaved
    rep by rep, the fastest rep of each kept."""
    total = sum(w.numel() * w.element_size() for w in weights)
    weights = weights[::-(-total // SAMPLE_BYTES)]
    xs = {}
    best = {(r, f): float("inf") for r in range(1, ROWS + 1) for f in (0, 1)}
    for w in weights:
        xs.setdefault(w.shape[1], torch.randn(ROWS, w.shape[1], generator=torch.Generator().manual_seed(0)))
    for rep in range(reps + 1):
        for r in range(1, ROWS + 1):
            for form in (0, 1):
                t0 = time.perf_counter()
                for w in weights:
                    x = xs[w.shape[1]][:r]
                    few_rows(x, w) if form else F.linear(x, w)
                if rep:  # the first pass warms up
                    best[(r, form)] = min(best[(r, form)], time.perf_counter() - t0)
    return [False] + [best[(r, 1)] <= WIN * best[(r, 0)] for r in range(1, ROWS + 1)]
