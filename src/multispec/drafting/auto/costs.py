"""What a plan costs, as auto sees it: a sequence decoding alone (in a batch the engine prices the whole step:
decoding/batch_plan.py). t(n): seconds of a target forward of n tokens, d(n): a draft forward of n tokens,
`overhead`: per-round and per-draft-level Python seconds.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from multispec.drafting.costs import CostModel
from multispec.drafting.protocol import RoundOutcome
from multispec.tree import Tree

DEFAULT_OVERHEAD = {"round_s": 4e-4, "level_s": 3e-4}
# A draft round whose first forward caught up on more than this many tokens (the deferred prompt, a streak of plain
# steps) is not recorded as draft drift: one scale serves every size, and such a forward, timed against a curve
# extrapolated far past its buckets, ran 3x its prediction (pycode-v1), which made every later draft plan look 40 %
# dearer, so auto stopped drafting and never timed the draft again.
LEARN_PENDING = 16


@dataclass(frozen=True)
class AutoView:
    """What auto reads of the machine profile (built by the Decoder): the pair's cost model on these backends
    (None: none measured), the profile's acceptance section, and the identities of the target and the drafter
    (drafting/auto/memory.model_identity) that key it."""

    costs: CostModel | None
    acceptance: Mapping[str, dict] = field(default_factory=dict)
    identities: tuple[str, str] = ("-", "-")


class AloneCosts:
    """The profile's calibrated curves, fixed for the generation: plans never follow its timings (so two identical
    seeded generations plan alike). Each round's timed forwards are recorded against the curves
    (`CostModel.observe`) and its overheads kept for `fitted_overhead`: what a new profile learns from
    (drafting/costs.updated_entry)."""

    version = 0  # the costs never change within a generation (plans cached on it)

    def __init__(self, model: CostModel, max_nodes: int):
        self.model = model
        n = range(1, max_nodes + 2)
        self.curves = ([0.0] + [model.target(i) for i in n],
                       [0.0] + [model.draft(i) if model.draft is not None else 0.0 for i in n])
        self.overhead = dict(model.overhead) if model.overhead else dict(DEFAULT_OVERHEAD)
        self.scale = {"t1": 1.0, "tn": 1.0, "d": 1.0}  # (reported; a batch's view corrects its table)
        self.round_log: list[tuple[int, float]] = []  # (draft levels, overhead seconds) for the overhead fit

    def t(self, n: int) -> float:
        return self.curves[0][n] if n < len(self.curves[0]) else self.model.target(n)

    def d(self, n: int) -> float:
        if self.model.draft is None:
            return 0.0
        return self.curves[1][n] if n < len(self.curves[1]) else self.model.draft(n)

    def draft_time(self, tree: Tree, pending: int) -> float:
        """Seconds of drafting `tree` (one draft forward per level but the deepest)."""
        if self.model.draft is None:
            return 0.0
        sizes = [len(tree.level(d)) for d in range(1, tree.max_depth)]
        return self.model.draft(pending) + sum(self.model.draft(s) for s in sizes)

    def round_time(self, tree: Tree, pending: int, drafted: bool, ahead: int = 0) -> float:
        """Predicted seconds of a round that drafted `tree`: the draft's forwards (its catch-up over `pending`
        tokens, one per level but the deepest) when the draft ran, the target's forward (the tree's rows and the
        `ahead` tokens fed before its root: a grammar's forced tokens), the overheads."""
        o = self.overhead
        seconds = self.t(len(tree) + ahead) + o["round_s"]
        if drafted:
            seconds += self.draft_time(tree, pending) + tree.max_depth * o["level_s"]
        return seconds

    def observe(self, outcome: RoundOutcome) -> None:
        """Record one round's timed forwards against the curves, and its overhead (never changes the plans). The
        target's forward is timed against its rows: the tree's and the tokens fed ahead of its root (a plain step
        after a grammar's forced tokens is a forward of several rows, not a one-token one)."""
        tree, times = outcome.tree, outcome.times
        n = len(tree) + times.ahead
        self.model.observe("target" if n == 1 else "target_n", self.model.target(n), times.target_fwd_s)
        drafted = outcome.draft_calls > 0  # the draft model ran this round
        if drafted and times.pending <= LEARN_PENDING:
            self.model.observe("draft", self.draft_time(tree, times.pending), times.draft_s)
        levels = tree.max_depth if drafted else 0
        other = max(0.0, times.round_s - times.target_fwd_s - (times.draft_s if levels else 0.0))
        self.round_log.append((levels, other))

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
