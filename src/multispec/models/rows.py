"""The linear products of a few rows (float32 on the CPU), and the table of the form each row count takes.

A decode step multiplies one row by every weight matrix, a verification k + 1 rows, a batch's step one or more rows
per sequence. On this project's machines (AMD EPYC, torch 2.13's MKL, one thread) the stock `F.linear(x, W)` over
1-3 rows is slow and grows with every row: over SmolLM2-135M's 211 projections 46 / 77 / 98 ms for 1 / 2 / 3 rows,
as if W were read once per row. Two other forms read W once:

- "m", `few_rows`: the product taken as `W @ x.T` (x padded to two rows, so that the BLAS takes its matrix-matrix
  path): 31 / 29 / 46 ms. One token costs a third less and a two-token verification what one token did; from three
  rows on it grows again by about 40 % of a step per row.
- "p", `packed`: oneDNN's product over a copy of W packed once into its blocked layout
  (`torch.ops.mkldnn._linear_pointwise`, the kernel inductor's CPU freezing uses). Slower than "m" at 1-2 rows, but
  3-6 rows cost what 1-2 rows cost there, 16 rows 0.58 and 64 rows 0.70 of F.linear (a stand-in for most of
  SmolLM2's weights; whole forwards: benchmarks/results/rows/): drafted rows, in a batch or alone, come almost
  free. It costs a second copy of the weights, so it is measured only where the model's float32 products fit
  PACK_SHARE of the memory available; the copies are made on first use and kept beside the model (the sidecar's
  Packs), never on it.

Which form wins depends on the CPU, the BLAS and the thread count, so it is measured, not assumed: `table` times
the forms over the model's own weights at each of COUNTS rows (about two seconds for a 135M model), once per machine,
thread count and set of weight shapes (kept in the machine profile, section "rows": multispec/profile.py), and
returns the form each count takes; a row count between two measured ones takes the next one's form, one past the
last the last's. The fast backend is given that table and takes `linear` for its products (it owns its matmuls);
nothing is patched into a model, so the transformers backend runs the stock layers. All forms compute the same
products in float32; they differ in the order of the sums, so logits differ in the last bits (as a one-row step and
a many-row forward already do), never more. A product that autograd must see (a head that trains online) or that
torch.compile traces takes F.linear instead of the packed form, whose copy is not the weight.
"""
from __future__ import annotations

import platform
import time
import weakref

import torch
import torch.nn.functional as F

from multispec.threads import available_ram

FORMS = ("l", "m", "p")  # F.linear, few_rows, packed
ROWS = 8  # row counts 1 ... ROWS are measured one by one
COUNTS = tuple(range(1, ROWS + 1)) + (16, 64)  # the row counts measured: a table has one form per count
WIN = 0.95  # a form other than F.linear is used where it took at most this fraction of F.linear's time
SAMPLE_BYTES = 160 * 2**20  # the weights timed: about this many bytes of them
PACK_ROWS = 64  # the row count oneDNN is told to pack the weights for (it serves every count)
PACK_SHARE = 0.5  # the packed form is measured only where a copy of the weights fits this share of free memory


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


def pack(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] in oneDNN's blocked layout for `packed` (a copy: w itself is untouched)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)


def packed(x: torch.Tensor, p: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, bias) over p = pack(w): x [..., K]. [..., N]."""
    k = x.shape[-1]
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, k).contiguous(), p, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


class Packs:
    """Packed copies of a model's weights (`pack`), each made the first time the packed form needs it and kept by
    the owner (the model's sidecar, models/sidecar.py); a weight replaced or changed in place (its storage or its
    autograd version moved, as an optimiser's step moves it; a write through `.data` does not) is packed again. A
    copy that would not fit PACK_SHARE of the memory available at that moment is not made (`get` returns None: that
    product runs as F.linear), so a table measured on a freer day cannot run the machine out of memory. A weight
    is held weakly: its copy goes when it goes (an adapting head's per-request copy, a model moved)."""

    def __init__(self):
        self._packed: dict[int, tuple] = {}  # id(weight) -> (weakref to it, (storage, version), packed copy or None)

    def get(self, w: torch.Tensor) -> torch.Tensor | None:
        stamp = (w.data_ptr(), _version(w))
        key = id(w)
        hit = self._packed.get(key)
        if hit is None or hit[0]() is not w or hit[1] != stamp:
            fits = _fits(w.numel() * w.element_size())
            gone = lambda _, packed=self._packed, key=key: packed.pop(key, None)  # noqa: E731
            hit = self._packed[key] = (weakref.ref(w, gone), stamp, pack(w) if fits else None)
        return hit[2]

    @property
    def nbytes(self) -> int:
        """Bytes the packed copies take."""
        return sum(p.numel() * p.element_size() for _, _, p in self._packed.values() if p is not None)


def _version(w: torch.Tensor) -> int:
    try:
        return w._version
    except RuntimeError:  # an inference tensor keeps no version counter (and cannot be changed in place)
        return -1


def form(table: list[str], rows: int) -> str:
    """The form `table` gives `rows` rows (rows >= 1): that of the smallest measured count >= rows, past the last
    count the last's."""
    for i, n in enumerate(COUNTS):  # (a loop, not bisect: torch.compile traces this)
        if rows <= n:
            return table[i]
    return table[-1]


def linear(layer: torch.nn.Module, x: torch.Tensor, table: list[str] | None, packs: Packs | None = None
           ) -> torch.Tensor:
    """layer(x), taken in the form `table` (from `table`) gives a float32 CPU nn.Linear at x's row count; any other
    layer, or table None, runs as it is. packs: where the packed copies are kept (None, or a copy it did not make:
    the packed form runs as F.linear, as it does when autograd must see the product or torch.compile traces it)."""
    if table is not None and type(layer) is torch.nn.Linear:
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        w = layer.weight
        if rows > 0 and w.dtype == torch.float32 and w.device.type == "cpu":
            f = form(table, rows)
            if f == "m":
                return few_rows(x, w, layer.bias)
            if f == "p" and packs is not None and not torch.compiler.is_compiling() and not (
                    torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)):
                p = packs.get(w)
                if p is not None:
                    return packed(x, p, layer.bias)
    return layer(x)


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == torch.float32
            and m.weight.device.type == "cpu" and m.weight.dim() == 2]


def table(model: torch.nn.Module, profile=None) -> tuple[list[str] | None, dict]:
    """The form `model`'s float32 CPU Linear layers take at each of COUNTS rows (FORMS) — the machine profile's
    (keyed per torch version, threads, CPU and weight shapes), else measured now (~2 s for a 135M model) — or None
    when the model has no such layer. Returns it and the new profile entries ({} when the profile had it)."""
    key = profile_key(model)
    if key is None:
        return None, {}
    stored = profile.get("rows", key) if profile is not None else None
    if isinstance(stored, list) and len(stored) == len(COUNTS) and all(v in FORMS for v in stored):
        return stored, {}
    weights = [m.weight for m in _linears(model)]
    measured = measure(weights, with_packed=_packs_fit(weights))
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


def signature(table: list[str] | None) -> str:
    """The forms `table` gives ("" for none): part of the cost cache's key, since a forward's cost by row count
    depends on it."""
    return "" if table is None else "rows:" + "".join(table)


def _packs_fit(weights: list[torch.Tensor]) -> bool:
    """Whether a packed copy of these weights fits PACK_SHARE of the memory available now, and this torch packs."""
    if not _fits(sum(w.numel() * w.element_size() for w in weights)):
        return False
    try:
        w = torch.zeros(4, 4)
        return bool(torch.equal(packed(torch.ones(3, 4), pack(w)), torch.zeros(3, 4)))
    except (RuntimeError, AttributeError, NotImplementedError):  # no oneDNN in this build, or the ops moved
        return False


def _fits(nbytes: int) -> bool:
    """Whether a copy of nbytes fits PACK_SHARE of the RAM available now (True where that cannot be read)."""
    free = available_ram()
    return free is None or nbytes <= PACK_SHARE * free


@torch.inference_mode()
def measure(weights: list[torch.Tensor], reps: int = 3, with_packed: bool = True) -> list[str]:
    """The fastest form at each of COUNTS rows ("m" and "p" only where they took at most WIN of F.linear's time;
    "m" is timed up to ROWS rows, "p" where with_packed): the forms timed over the weights in turn (as a forward
    streams them; every j-th one past SAMPLE_BYTES, which is still far more than any CPU cache holds), interleaved
    rep by rep, the fastest rep of each kept."""
    total = sum(w.numel() * w.element_size() for w in weights)
    weights = weights[::-(-total // SAMPLE_BYTES)]
    packs = [pack(w) for w in weights] if with_packed else []
    xs: dict[int, torch.Tensor] = {}
    for w in weights:
        xs.setdefault(w.shape[1], torch.randn(COUNTS[-1], w.shape[1], generator=torch.Generator().manual_seed(0)))
    forms = {r: ["l"] + (["m"] if r <= ROWS else []) + (["p"] if with_packed else []) for r in COUNTS}
    best = {(r, f): float("inf") for r in COUNTS for f in forms[r]}
    for rep in range(reps + 1):
        for r in COUNTS:
            for f in forms[r]:
                t0 = time.perf_counter()
                for j, w in enumerate(weights):
                    x = xs[w.shape[1]][:r]
                    F.linear(x, w) if f == "l" else few_rows(x, w) if f == "m" else packed(x, packs[j])
                if rep:  # the first pass warms up
                    best[(r, f)] = min(best[(r, f)], time.perf_counter() - t0)
    table = []
    for r in COUNTS:
        f = min(forms[r], key=lambda f: best[(r, f)])
        table.append(f if best[(r, f)] <= WIN * best[(r, "l")] else "l")
    return table
