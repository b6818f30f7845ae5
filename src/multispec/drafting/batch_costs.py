"""Batched forward costs for `auto` in a batch (decoding/batch.py): seconds of one forward of B sequences × n tokens
each, measured once per machine up to the batch's slots (kept in the machine profile beside the single-sequence
costs, drafting/costs.py) and extrapolated linearly beyond."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from multispec.drafting.costs import BUCKETS, CostCurve, CostModel, _curve_ok, model_key
from multispec.models.base import sync
from multispec.models.rows import signature

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
BATCH_TOKENS = (1, 2, 4, 8, 16)  # tokens per sequence measured; BUCKETS beyond are extrapolated
BATCH_BUDGET_S = 4.0
LEARN_RATE = 0.1  # how fast a batch's measured target forwards correct the table (drafting/auto/costs.SCALE_RATE: 0.2
# for a sequence alone; a batch's forwards vary more with who is in it)
LEARN_STEP = 0.05  # a correction that moved this much (relative) remakes the sequences' cached plans
LEARN_LONGEST = 64  # a forward with a longer step (a prefill chunk) is not learned from
TN_DECAY = 0.95  # "tn" is a ratio of decayed sums over the forwards with drafted tokens: about the last 20 carry it
TN_PRIOR = 0.5  # and of a prior, added to both sums: this fraction of the table's one-token forward (ratio 1)


@dataclass
class BatchCosts:
    """seconds[model][i][j]: one batched forward of BATCH_SIZES[i] sequences × BUCKETS[j] tokens each (model
    "target" or "draft"), measured up to the batch's slots and extrapolated linearly beyond."""

    seconds: dict
    key: str = ""
    source: str = "calibrated"
    _memo: dict = field(default_factory=dict, repr=False)  # every sequence of a batch asks the same few questions
    # corrections of the table by the batch's own forwards (learn): "t1" scales the target's forward of one token per
    # sequence, "tn" what more tokens add to it, "d" the draft's forwards; shared by the batch's sequences. version:
    # bumped when one moved by LEARN_STEP (the sequences' cached plans are remade)
    scale: dict = field(default_factory=lambda: {"t1": 1.0, "tn": 1.0, "d": 1.0})
    version: int = 0
    _learned: dict = field(default_factory=dict, repr=False)  # model -> the forward learned from last
    _seen: dict = field(default_factory=lambda: {"t1": 1.0, "tn": 1.0, "d": 1.0}, repr=False)
    _tn: list = field(default_factory=lambda: [0.0, 0.0], repr=False)  # "tn"'s decayed sums [measured, predicted]

    def forward(self, model: str, sequences: int, n: float) -> float:
        """Predicted seconds of a batched forward of `sequences` × n tokens (linear in the batch size between
        measured sizes, CostCurve in n)."""
        hit = self._memo.get((model, sequences, n))
        if hit is None:
            hit = self._memo[(model, sequences, n)] = self._forward(model, sequences, n)
        return hit

    def _forward(self, model: str, sequences: int, n: float) -> float:
        rows = self.seconds[model]
        sizes = BATCH_SIZES[:len(rows)]
        b = max(1, sequences)
        for i in range(1, len(sizes)):
            if b <= sizes[i] or i == len(sizes) - 1:
                lo, hi = CostCurve(rows[i - 1])(n), CostCurve(rows[i])(n)
                return lo + (hi - lo) * (b - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
        return CostCurve(rows[0])(n) * b

    def target(self, sequences: int, n: float) -> float:
        """forward("target", sequences, n) as corrected by `learn`."""
        base = self.forward("target", sequences, 1)
        return self.scale["t1"] * base + self.scale["tn"] * (self.forward("target", sequences, n) - base)

    def learn(self, timed: tuple | None, model: str = "target") -> None:
        """Correct the costs by one batched forward's own time (decoding/engine.Engine.timed: its forwards so
        far, sequences, tokens, longest step, seconds), once per forward whichever sequence asks. A target forward of
        one token per sequence corrects "t1", one with more tokens "tn" (its time past the corrected one-token
        forward, against the table's); a draft forward corrects "d". The table is measured at a 128-row context
        with every sequence drafting alike; long prompts, and a few sequences drafting many tokens in a padded
        attention group, cost more (Spec-Bench prompts on pycode-v1 at batch 32: "t1" learned 2.6-4.5).
        A forward that carries a prefill chunk or a catch-up (a step longer than LEARN_LONGEST) teaches nothing."""
        if timed is None or timed[0] == self._learned.get(model):
            return
        self._learned[model], (_, b, tokens, longest, seconds) = timed[0], timed
        if longest > LEARN_LONGEST or b < 1 or model not in self.seconds:
            return
        if model == "target" and tokens > b:
            self._learn_tn(b, tokens, seconds)
            return
        key = "d" if model != "target" else "t1"
        predicted = self.scale[key] * self.forward(model, b, tokens / b)
        if predicted <= 0 or seconds <= 0:
            return
        ratio = min(3.0, max(1 / 3, seconds / predicted))
        self._set(key, self.scale[key] * (1 + LEARN_RATE * (ratio - 1)))

    def _learn_tn(self, b: int, tokens: int, seconds: float) -> None:
        """"tn" from a forward with drafted tokens: what they added (its time past the corrected one-token forward)
        over what the table says they add, as a ratio of decayed sums. What they add is small beside the forward
        (one lookup token at batch 32: ~1 % of it) and the one-token forward's time moves by more, so a single
        forward's ratio is mostly noise and often negative: averaging ratios, clamped and with the negative ones
        skipped, learned "tn" 4-6 where the sums said 0.4-0.8 (pycode-v1, HumanEval at batch 32), and the batch
        stopped speculating."""
        base = self.forward("target", b, 1)
        predicted, measured = self.forward("target", b, tokens / b) - base, seconds - self.scale["t1"] * base
        if predicted <= 0:
            return
        self._tn = [TN_DECAY * self._tn[0] + measured, TN_DECAY * self._tn[1] + predicted]
        prior = TN_PRIOR * base  # a few drafted tokens per forward (~1 ms each) outweigh it only after many forwards
        self._set("tn", min(3.0, max(1 / 3, (self._tn[0] + prior) / (self._tn[1] + prior))))

    def _set(self, key: str, value: float) -> None:
        self.scale[key] = value
        if abs(value / self._seen[key] - 1) > LEARN_STEP:
            self._seen[key] = value
            self.version += 1

    def cost_model(self) -> CostModel:
        """The batch-1 curves as a CostModel (what `auto` reports and falls back on)."""
        d = self.seconds.get("draft")
        return CostModel(CostCurve(list(self.seconds["target"][0])), CostCurve(list(d[0])) if d else None,
                         key=self.key, source=self.source)


def get_batch_costs(target_cache, target_model, draft_cache=None, draft_model=None, profile=None,
                    budget_s: float = BATCH_BUDGET_S) -> tuple[BatchCosts, dict]:
    """The batched cost table of these models on this machine for up to the caches' slots: the profile's
    (multispec/profile.py, section "batch_costs"), or measured with models/batched.run_batch on the (still empty)
    caches before the batch starts. Returns the table and the new profile entries ({} when none was measured)."""
    slots = target_cache.slots
    sizes = [b for b in BATCH_SIZES if b <= slots] or [1]
    if len(sizes) < len(BATCH_SIZES) and sizes[-1] < slots:
        sizes.append(BATCH_SIZES[len(sizes)])  # the next size up is extrapolated, so `slots` is covered
    def probe(cache):  # what model_key reads of a backend, for run_batch over this cache's net
        net = cache.net
        return type("probe", (), {"name": "batched", "device": net.device, "dtype": net.dtype,
                                  "rows_signature": signature(net.rows_table)})

    key = "batch|" + model_key(probe(target_cache), target_model) + "||" + (
        model_key(probe(draft_cache), draft_model) if draft_cache else "-")
    cached = profile.get("batch_costs", key) if profile is not None else None
    if isinstance(cached, dict) and _batch_entry_ok(cached, draft_cache is not None, len(sizes)):
        return BatchCosts({k: v for k, v in cached.items() if v is not None}, key=key, source="profile"), {}
    caches = {"target": target_cache, **({"draft": draft_cache} if draft_cache is not None else {})}
    seconds = {name: _calibrate_batched(c, sizes, budget_s / len(caches)) for name, c in caches.items()}
    return BatchCosts(seconds, key=key), {key: {"target": seconds["target"], "draft": seconds.get("draft")}}


def _calibrate_batched(cache, sizes: list[int], budget_s: float) -> list[list[float]]:
    """seconds[i][j] for sizes[i] sequences × BUCKETS[j] tokens after a context of up to 128 rows, the fastest of
    two runs (one where the budget runs out); sizes beyond the cache's slots and tokens past BATCH_TOKENS or the
    rows are extrapolated linearly."""
    from multispec.models.batched import Step, run_batch

    ctx = max(0, min(128, cache.rows - BATCH_TOKENS[-1] - 1))
    measurable = [n for n in BATCH_TOKENS if ctx + n <= cache.rows]
    gen = torch.Generator().manual_seed(0)
    start = time.perf_counter()

    def timed(b: int, n: int) -> float:
        steps = [Step(s, torch.randint(0, cache.net.vocab_size, (n,), generator=gen), torch.arange(ctx, ctx + n))
                 for s in range(b)]
        for s in range(b):
            cache.reset(s)
            cache.lens[s] = ctx
        sync(cache.net.device)
        t0 = time.perf_counter()
        run_batch(cache, steps)
        sync(cache.net.device)
        return time.perf_counter() - t0

    timed(1, 1)  # warm-up
    table = []
    for b in sizes:
        row: list[float] = []
        for n in measurable:
            if b > cache.slots or (row and time.perf_counter() - start > budget_s):
                break
            runs = 1 if time.perf_counter() - start > budget_s / 2 else 2
            row.append(min(timed(b, n) for _ in range(runs)))
        table.append(row)
    for s in range(cache.slots):
        cache.reset(s)
    out: list[list[float]] = []
    for i, row in enumerate(table):
        if not row:  # a size past the slots or the budget: linear in the batch from the two sizes below
            a, c = out[i - 1], out[i - 2] if i >= 2 else [x / sizes[i - 1] for x in out[i - 1]]
            size_a, size_c = sizes[i - 1], sizes[i - 2] if i >= 2 else 0
            slopes = [(x - y) / (size_a - size_c) for x, y in zip(a, c)]
            out.append([x + s * (sizes[i] - size_a) for x, s in zip(a, slopes)])
            continue
        while len(row) < len(BUCKETS):
            j = len(row)
            slope = (row[-1] - row[-2]) / (BUCKETS[j - 1] - BUCKETS[j - 2]) if j >= 2 else row[-1]
            row.append(row[-1] + slope * (BUCKETS[j] - BUCKETS[j - 1]))
        for j in range(1, len(row)):
            row[j] = max(row[j], row[j - 1])
        out.append(row)
    for i in range(1, len(out)):  # more sequences never cost less (noise aside)
        out[i] = [max(x, y) for x, y in zip(out[i], out[i - 1])]
    return out


def _batch_entry_ok(entry: dict, with_draft: bool, n_sizes: int) -> bool:
    def table_ok(t) -> bool:
        return isinstance(t, list) and len(t) >= n_sizes and all(_curve_ok(row) for row in t)

    return table_ok(entry.get("target")) and (not with_draft or table_ok(entry.get("draft")))
