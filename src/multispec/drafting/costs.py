"""The hardware cost model of `auto`: what a forward of n tokens costs the target and the draft on this machine.

Calibration runs a few forwards of n ∈ BUCKETS tokens after a short context (dropped again with `keep`), takes the
fastest of the runs per size, and stops at a time budget (2 s), extrapolating the sizes it did not reach. Costs
between buckets are interpolated linearly in n.

Calibrations live in the machine profile (multispec/profile.py, section "costs"), keyed per (backend, model,
device, dtype, threads, CPU). A Decoder measures what its profile lacks when it is built, never inside a generation.
A generation records its timed forwards against the predictions (`CostModel.observe`) without changing its plans;
`updated_entry` folds that drift and the fitted overheads into a new profile entry, which only an explicit save
keeps (decoding/profiles.py).
"""
from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field

import torch

from multispec.models.base import sync
from multispec.paths import warn_once

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
CALIBRATION_BUDGET_S = 2.0
DRIFT = 0.1  # relative error of the predictions over one generation that triggers an update of the cache
BLEND = 0.5  # how far an update moves the cached costs towards the measured ones
# A model's drift counts in proportion to the forwards it was measured over, in full from this many: a generation
# of one round timed one draft forward (its catch-up over a whole prompt, on a machine busy for that moment), and
# its drift of 3 moved the cached draft costs up 70 %, so the next generation (pycode-v1, T = 1) took plain steps
# where draft chains paid 1.2x.
DRIFT_FULL_AT = 16


@dataclass
class CostCurve:
    """seconds[i]: the cost of one forward of BUCKETS[i] tokens."""

    seconds: list[float]

    def __call__(self, n: float) -> float:
        """Predicted seconds of a forward of n >= 1 tokens (linear between buckets, linear beyond the last)."""
        b = BUCKETS
        if n <= b[0]:
            return self.seconds[0]
        for i in range(1, len(b)):
            if n <= b[i]:
                w = (n - b[i - 1]) / (b[i] - b[i - 1])
                return (1 - w) * self.seconds[i - 1] + w * self.seconds[i]
        slope = (self.seconds[-1] - self.seconds[-2]) / (b[-1] - b[-2])
        return self.seconds[-1] + slope * (n - b[-1])


@dataclass
class CostModel:
    """Forward costs of the target and (optionally) the draft, with what was observed during a generation."""

    target: CostCurve
    draft: CostCurve | None
    key: str = ""
    source: str = "calibrated"  # "calibrated" | "profile"
    calibration_s: float = 0.0
    overhead: dict | None = None  # per-round and per-draft-level Python overheads learned by `auto`
    # timed forwards against the curves: "target" one token, "target_n" more (a verification), "draft"
    observed: dict = field(default_factory=lambda: {"target": [], "target_n": [], "draft": []})

    def fresh(self) -> CostModel:
        """The same costs with no observations yet (one per generation)."""
        return CostModel(self.target, self.draft, self.key, self.source, self.calibration_s,
                         None if self.overhead is None else dict(self.overhead))

    def observe(self, which: str, predicted: float, seconds: float) -> None:
        """Record one timed forward (which: "target" or "draft") against its prediction."""
        self.observed[which].append((predicted, seconds))

    def drift(self) -> dict:
        """Median ratio measured / predicted per model over the observed forwards (1.0 = on target), shrunk
        geometrically towards 1.0 when fewer than DRIFT_FULL_AT forwards were observed (a few timings are noise)."""
        return combined_drift([self.timed()])

    def timed(self) -> dict:
        """{model: [median ratio measured / predicted, forwards]} over the observed forwards: what a run reports,
        so that the runs of one profile combine (`combined_drift`) instead of compounding."""
        out = {}
        for which, obs in self.observed.items():
            if obs:
                ratios = sorted(s / max(p, 1e-9) for p, s in obs)
                out[which] = [ratios[len(ratios) // 2], len(obs)]
        return out

    def summary(self) -> dict:
        return {"target_s": {str(b): s for b, s in zip(BUCKETS, self.target.seconds)},
                "draft_s": None if self.draft is None else {str(b): s for b, s in zip(BUCKETS, self.draft.seconds)},
                "cost_ratio": None if self.draft is None else self.draft(1) / self.target(1),
                "source": self.source, "calibration_s": self.calibration_s, "drift": self.drift()}


def model_key(backend, role_model) -> str:
    """What a cost depends on: backend kind, the few-row table its products follow (models/rows.py; the backend's
    `rows_signature`), model identity and size, weights' dtype (the backend's, from the model's sidecar), device,
    dtype, threads, CPU."""
    cfg = getattr(role_model, "config", None)
    name = getattr(cfg, "_name_or_path", "") or type(role_model).__name__
    n_params = sum(p.numel() for p in role_model.parameters()) if hasattr(role_model, "parameters") else 0
    from multispec.models.int8 import weights_dtype

    quant = getattr(backend, "weights_dtype", None) or (weights_dtype(role_model) if hasattr(role_model, "parameters")
                                                        else "")
    return "|".join(str(x) for x in (backend.name, getattr(backend, "cost_key", ""),
                                      getattr(backend, "rows_signature", ""), name, n_params, quant,
                                      backend.device, getattr(backend, "dtype", ""),
                                      torch.get_num_threads(), platform.processor() or platform.machine()))


def calibrate(backends: list, budget_s: float, reps: int = 3) -> list[list[float]]:
    """Time forwards of BUCKETS tokens appended after each backend's cached rows (dropped again with keep).
    Sizes and models are interleaved, rep by rep, so that a change in machine load hits all of them alike; each
    size keeps its fastest run. One untimed warm-up forward per backend first. Sizes not reached within the budget
    are extrapolated linearly. Returns seconds per bucket, one list per backend."""
    from multispec.models.base import causal_mask

    def run(b, n):
        ctx = b.cache_len
        tokens = torch.randint(0, int(b.vocab_size), (n,), generator=torch.Generator().manual_seed(n))
        draftable = getattr(b, "draftable", None)  # a draft of another vocabulary: tokens it drafts, one row each
        if draftable is not None:
            tokens = draftable[tokens % len(draftable)]
        device = getattr(b, "device", "cpu")
        sync(device)
        t0 = time.perf_counter()
        b.forward(tokens, torch.arange(ctx, ctx + n), causal_mask(ctx, n))
        sync(device)
        dt = time.perf_counter() - t0
        b.keep(torch.arange(ctx))
        return dt

    def room(b) -> int:  # tokens that still fit after the cached rows (positions, static cache rows, a head's)
        limits = [x - b.cache_len for x in (b.max_positions, getattr(b, "max_len", None)) if x]
        limits += [b.calibration_room] if hasattr(b, "calibration_room") else []
        return min(limits) if limits else 1 << 30

    fits = min(room(b) for b in backends)
    if fits < 1:  # nothing more fits: the generation cannot go on anyway; any positive costs will do
        return [[1.0] * len(BUCKETS) for _ in backends]
    for b in backends:
        run(b, 1)
    best = [[float("inf")] * len(BUCKETS) for _ in backends]
    start = time.perf_counter()
    reached = sum(1 for n in BUCKETS if n <= fits)  # sizes past the context are extrapolated
    for rep in range(reps):
        for i, n in enumerate(BUCKETS[:reached]):
            if rep > 0 and time.perf_counter() - start > budget_s:
                break
            if rep == 0 and i > 1 and time.perf_counter() - start > budget_s / reps:
                reached = i
                break
            if i >= reached:
                break
            for j, b in enumerate(backends):
                best[j][i] = min(best[j][i], run(b, n))
    out = []
    for seconds in best:
        seconds = [s for s in seconds if s != float("inf")]
        while len(seconds) < len(BUCKETS):
            i = len(seconds)
            slope = (seconds[-1] - seconds[-2]) / (BUCKETS[i - 1] - BUCKETS[i - 2]) if i >= 2 else seconds[-1]
            seconds.append(seconds[-1] + slope * (BUCKETS[i] - BUCKETS[i - 1]))
        for i in range(1, len(seconds)):  # a larger forward never costs less than a smaller one (noise aside)
            seconds[i] = max(seconds[i], seconds[i - 1])
        out.append(seconds)
    return out


def cost_entry_key(target, target_model, draft=None, draft_model=None) -> str:
    """The profile key of this pair's costs on these backends, here."""
    return model_key(target, target_model) + "||" + (model_key(draft, draft_model) if draft is not None else "-")


def cost_model_from(profile, key: str, with_draft: bool) -> CostModel | None:
    """The profile's costs for key as a CostModel, or None when it has none (or a damaged entry: one warning)."""
    entry = profile.get("costs", key)
    if entry is None:
        return None
    if not valid_entry(entry, with_draft):
        warn_once(f"ignoring the costs entry for this model in the machine profile ({profile.source}): it is not "
                  "a valid calibration (wrong shape or implausible numbers); measuring again")
        return None
    return CostModel(CostCurve(list(entry["target"])), CostCurve(list(entry["draft"])) if entry.get("draft") else None,
                     key=key, source="profile", overhead=entry.get("overhead"))


def measure_costs(target, target_model, draft=None, draft_model=None,
                  budget_s: float = CALIBRATION_BUDGET_S) -> tuple[CostModel, dict]:
    """Calibrate this pair's forward costs on these backends (their caches as found; left as found): the model and
    the profile entry to keep."""
    key = cost_entry_key(target, target_model, draft, draft_model)
    t0 = time.perf_counter()
    curves = calibrate([target] + ([draft] if draft is not None else []), budget_s)
    t_curve, d_curve = curves[0], (curves[1] if draft is not None else None)
    entry = {"target": t_curve, "draft": d_curve}
    return CostModel(CostCurve(t_curve), CostCurve(d_curve) if d_curve else None, key=key, source="calibrated",
                     calibration_s=time.perf_counter() - t0), entry


def combined_drift(timed: list[dict]) -> dict:
    """One drift per model from runs timed against the same costs (each `CostModel.timed()`): the forward-weighted
    geometric mean of their median ratios, shrunk geometrically towards 1.0 when fewer than DRIFT_FULL_AT forwards
    were observed in all."""
    out = {}
    for which in ("target", "target_n", "draft"):
        parts = [t[which] for t in timed if which in t and t[which][1] > 0 and t[which][0] > 0]
        n = sum(count for _, count in parts)
        if n:
            log_mean = sum(math.log(ratio) * count for ratio, count in parts) / n
            out[which] = math.exp(log_mean * min(1.0, n / DRIFT_FULL_AT))
    return out


def updated_entry(entry: dict, drift: dict, overhead: dict | None) -> dict:
    """A costs entry after runs' observations: the learned overheads stored (blended geometrically with the stored
    ones), the forward costs moved part of the way (BLEND, geometrically) towards the measured ones when they
    drifted by more than DRIFT — one-token target forwards by their drift, multi-token ones (verifications) by
    theirs (their ratio decides whether speculation pays, and a calibration in isolation misses it). Pure."""
    moved = bool(drift) and any(abs(r - 1.0) > DRIFT for r in drift.values())
    old = entry.get("overhead")
    if old is not None and overhead:
        overhead = {k: (old[k] * v) ** 0.5 for k, v in overhead.items() if k in old}
    scale = {k: (v ** BLEND if moved else 1.0) for k, v in drift.items()}
    one = scale.get("target", 1.0)  # one-token forwards; more tokens (a verification) by their own drift, if timed
    more = scale.get("target_n", one)
    target = [s * (one if i == 0 else more) for i, s in enumerate(entry["target"])]
    for i in range(1, len(target)):  # a larger forward never costs less than a smaller one
        target[i] = max(target[i], target[i - 1])
    return {"target": target,
            "draft": None if entry.get("draft") is None else [s * scale.get("draft", 1.0) for s in entry["draft"]],
            "overhead": overhead or old}


def _curve_ok(x) -> bool:
    """A cost curve as calibrate writes it: len(BUCKETS) finite positive seconds (below an hour each)."""
    return (isinstance(x, list) and len(x) == len(BUCKETS)
            and all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and 0 < s < 3600
                    for s in x))


def valid_entry(entry, with_draft: bool) -> bool:
    """Whether a cached entry can be used: a dict with a valid target curve, a valid draft curve when there is a
    draft (None or absent otherwise), and an optional overhead dict of finite non-negative numbers."""
    if not isinstance(entry, dict) or not _curve_ok(entry.get("target")):
        return False
    if with_draft and not _curve_ok(entry.get("draft")):
        return False
    overhead = entry.get("overhead")
    return overhead is None or (isinstance(overhead, dict) and {"round_s", "level_s"} <= set(overhead) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for v in overhead.values()))
