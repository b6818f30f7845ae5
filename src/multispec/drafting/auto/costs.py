"""What a plan costs, as auto sees it: one view for a sequence decoding alone, one for a sequence's share of a
batch. Both answer t(n) (seconds of a target forward of n tokens), d(n) (a draft forward of n tokens), `overhead`
(per-round and per-draft-level Python seconds) and `live` (sequences decoding together), so the planner never asks
which one it has.
"""
from __future__ import annotations

from multispec.drafting.batch_costs import BatchCosts
from multispec.models.batched import Role
from multispec.drafting.costs import CostModel
from multispec.drafting.protocol import RoundOutcome
from multispec.tree import Tree

SCALE_RATE = 0.2  # how fast measured forward times correct the calibrated costs within a generation
SCALE_STEP = 0.05  # a cost correction that moved this much (relative) remakes the cached plans
DEFAULT_OVERHEAD = {"round_s": 4e-4, "level_s": 3e-4}
# A draft round whose first forward caught up on more than this many tokens (the deferred prompt, a streak of plain
# steps) corrects no draft cost: one scale serves every size, and such a forward, timed against a curve extrapolated
# far past its buckets, ran 3x its prediction (pycode-v1), which made every later draft plan look 40 % dearer, so
# auto stopped drafting and never timed the draft again.
LEARN_PENDING = 16


class AloneCosts:
    """The calibrated curves (frozen for the generation, read once) times what this generation's own forwards
    measured against them: one factor for single-token steps, one for multi-token verification (their ratio is
    what decides whether speculation pays, and load changes it), one for the draft."""

    live = 1

    def __init__(self, model: CostModel, max_nodes: int):
        self.model = model
        n = range(1, max_nodes + 2)
        self.curves = ([0.0] + [model.target(i) for i in n],
                       [0.0] + [model.draft(i) if model.draft is not None else 0.0 for i in n])
        self.overhead = dict(model.overhead) if model.overhead else dict(DEFAULT_OVERHEAD)
        self.scale = {"t1": 1.0, "tn": 1.0, "d": 1.0}
        self.version = 0  # bumped when a correction moved by SCALE_STEP: cached plans are remade
        self._seen = dict(self.scale)
        self.round_log: list[tuple[int, float]] = []  # (draft levels, overhead seconds) for the overhead fit

    def t(self, n: int) -> float:
        raw = self.curves[0][n] if n < len(self.curves[0]) else self.model.target(n)
        return raw * (self.scale["t1"] if n == 1 else self.scale["tn"])

    def d(self, n: int) -> float:
        if self.model.draft is None:
            return 0.0
        raw = self.curves[1][n] if n < len(self.curves[1]) else self.model.draft(n)
        return raw * self.scale["d"]

    def draft_time(self, tree: Tree, pending: int) -> float:
        """Uncorrected seconds of drafting `tree` (one draft forward per level but the deepest)."""
        if self.model.draft is None:
            return 0.0
        sizes = [len(tree.level(d)) for d in range(1, tree.max_depth)]
        return self.model.draft(pending) + sum(self.model.draft(s) for s in sizes)

    def round_time(self, tree: Tree, pending: int, drafted: bool) -> float:
        """Predicted seconds of a round that drafted `tree`: the draft's forwards (its catch-up over `pending`
        tokens, one per level but the deepest) when the draft ran, the target's forward, the overheads."""
        o = self.overhead
        seconds = self.t(len(tree)) + o["round_s"]
        if drafted:
            seconds += self.draft_time(tree, pending) * self.scale["d"] + tree.max_depth * o["level_s"]
        return seconds

    def observe(self, outcome: RoundOutcome) -> None:
        """Correct the costs by one round's timed forwards, and learn the per-round overhead."""
        tree, times = outcome.tree, outcome.times
        n = len(tree)
        self.model.observe("target", self.model.target(n), times.target_fwd_s)
        self._learn("t1" if n == 1 else "tn", self.t(n), times.target_fwd_s)
        drafted = outcome.draft_calls > 0  # the draft model ran this round
        if drafted and times.pending <= LEARN_PENDING:
            raw = self.draft_time(tree, times.pending)
            self.model.observe("draft", raw, times.draft_s)
            self._learn("d", raw * self.scale["d"], times.draft_s)
        levels = tree.max_depth if drafted else 0
        other = max(0.0, times.round_s - times.target_fwd_s - (times.draft_s if levels else 0.0))
        self.round_log.append((levels, other))
        if levels == 0:  # per-round overhead, learned as it goes
            self.overhead["round_s"] += SCALE_RATE * (other - self.overhead["round_s"])

    def _learn(self, key: str, predicted: float, measured: float) -> None:
        if predicted > 0 and measured > 0:
            ratio = min(3.0, max(1 / 3, measured / predicted))
            self.scale[key] = (1 - SCALE_RATE) * self.scale[key] + SCALE_RATE * self.scale[key] * ratio
            # plans are remade (a draft plan costs ~0.4 ms, 5 % of a small target's step) only when a scale has
            # moved by SCALE_STEP since they were made, not on every round's jitter
            if abs(self.scale[key] / self._seen[key] - 1) > SCALE_STEP:
                self._seen = dict(self.scale)
                self.version += 1

    def fitted_overhead(self) -> dict:
        """The per-round and per-level overheads fitted to this generation's rounds (medians)."""
        out = dict(self.overhead)
        ar = sorted(o for lv, o in self.round_log if lv == 0)
        spec = [(lv, o) for lv, o in self.round_log if lv > 0]
        if ar:
            out["round_s"] = ar[len(ar) // 2]
        if spec:
            per = sorted(max(0.0, o - out["round_s"]) / lv for lv, o in spec)
            out["level_s"] = per[len(per) // 2]
        return out


class BatchShareCosts:
    """One sequence of a batch (decoding/batch.py): a plan of n target tokens is charged its share of the
    one-token-per-sequence forward, C(B, 1) / B, plus what its n - 1 more tokens add to it; a draft forward is
    shared by as many sequences as drafted together last time. The table is corrected by the batch's own forwards
    (BatchCosts.learn: the loop times each batched forward; a lane's round time would include waiting for the
    others, so it is not used). sampling: the lane samples (T > 0)."""

    def __init__(self, batcher, table: BatchCosts, model: CostModel, sampling: bool):
        self.batcher, self.table, self.model, self.sampling = batcher, table, model, sampling
        self.overhead = dict(model.overhead) if model.overhead else dict(DEFAULT_OVERHEAD)

    @property
    def live(self) -> int:
        return max(1, self.batcher.live)

    @property
    def version(self) -> int:
        return self.table.version

    @property
    def scale(self) -> dict:
        return self.table.scale

    def t(self, n: int) -> float:
        b = self.live
        base = self.table.target(b, 1)
        return base / b + (self.table.target(b, 1 + (n - 1) / b) - base if n > 1 else 0.0)

    def d(self, n: int) -> float:
        if self.model.draft is None:
            return 0.0
        last = self.batcher.timed.get(Role.DRAFT)  # the latest draft forward: the sequences that shared it
        k = max(1, last[1] if last else 1)
        return self.table.scale["d"] * self.table.forward("draft", k, n) / k

    def observe(self, outcome: RoundOutcome) -> None:
        self.table.learn(self.batcher.timed.get(Role.TARGET))
        if outcome.draft_calls:
            self.table.learn(self.batcher.timed.get(Role.DRAFT), "draft")
