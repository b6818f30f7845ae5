"""A batch's plan: which sequences speculate in this step, priced as one step.

Each sequence's policy plans as if it decoded alone. A plan that says what it expects (`RoundPlan.expected` and
`size`: auto's) reaches the engine as a PlanAsk before anything is drafted, and the engine answers with the plan to
run: that one, or PLAIN. With every asking sequence's plan in hand it prices the step whole, from the batched cost
table (drafting/batch_costs.py, corrected by the batch's own forwards):

    T(S) = C_target(B, (base + Σ_{i∈S} (size_i - 1)) / B)         one target forward over the round batch
         + Σ_ℓ C_draft(#{i ∈ S : depth_i ≥ ℓ}, fed at level ℓ)    one draft forward per level across sequences
         + B · round_s + Σ_{i∈S} depth_i · level_s                 each sequence's Python, in turn
    tokens(S) = B + Σ_{i∈S} (expected_i - 1)

where base counts every sequence's one token (more for a prefill chunk), and the first draft level feeds each
drafting sequence's pending tokens (its catch-up, paid in full: every sequence waits on that forward). S is the set
of speculating sequences with the most tokens per second among the prefixes of the asks ordered by their own gain
per cost (the empty prefix, all plain, among them); it must beat all-plain by MARGIN. With many sequences, where a
wider forward costs nearly in proportion, the best S is empty and the batch decodes plainly. The engine keeps the
answer per sequence, and what its kept plans delivered: its expected extra tokens are scaled by the decayed ratio
of delivered to expected per proposer (Realised), which starts from what the batch's other sequences' plans of that
proposer delivered at that kind of sampling (Pool), so that a newcomer does not repeat its policy's optimism. One left out takes plain steps for 1, 2, 4 ... OFF_MAX rounds without asking its policy (the
per-request off switch, which also spares its planning); one kept is asked again next round. Plans depend on the
policies' estimates and measured costs, never on a round's coins, so every lossless verifier stays lossless.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from multispec.drafting.auto.costs import DEFAULT_OVERHEAD
from multispec.drafting.protocol import RoundPlan
from multispec.tree import Tree

__all__ = ["MARGIN", "OFF_MAX", "PLAIN", "PlanAsk", "Pool", "Realised", "choose"]

MARGIN = 0.03  # speculation must beat all-plain by this much (the planner's margin alone)
OFF_MAX = 16  # the longest run of plain steps a left-out sequence takes before it is asked again
PLAIN = RoundPlan(Tree.chain(0), "none", label="ar (batch)", expected=1.0, size=1)
NO_DRAFT = ("none", "lookup", "suffix")  # proposers whose tokens cost no draft forward
# A sequence's expected extra tokens are scaled by what its kept plans delivered (Realised): decayed sums per
# proposer, from a prior of REALISED_PRIOR expected tokens delivered at the batch's ratio for that proposer and
# sampling (Pool, itself from a prior of one). Measured (pycode-v1, T = 1, batch 4): lookup and suffix plans priced
# at their policy's estimates delivered 1.04 tokens a round and the batch ran 0.89-0.96x batched ar; at batch 8,
# suffix plans delivered 0.23 of the extra tokens they promised (each sequence's policy learning it anew).
REALISED_PRIOR = 1.0
REALISED_DECAY = 0.9
POOL_DECAY = 0.98  # the batch's sums: every sequence's rounds feed them


@dataclass(frozen=True)
class PlanAsk:
    """A sequence's plan before anything is drafted (decoding/rounds._round yields it; the engine sends back the
    plan to run). pending: tokens the draft has yet to consume (the first draft forward feeds them)."""

    plan: RoundPlan
    pending: int = 1


Key = tuple  # (proposer, greedy): what a delivered-to-expected ratio is kept for


@dataclass
class Pool:
    """The batch's delivered and expected extra tokens per Key, decayed sums from a prior of one each."""

    sums: dict = field(default_factory=dict)  # key -> [delivered, expected]

    def add(self, key: Key, done: float, promised: float) -> None:
        row = self.sums.setdefault(key, [1.0, 1.0])
        row[0] = POOL_DECAY * row[0] + done
        row[1] = POOL_DECAY * row[1] + promised

    def ratio(self, key: Key) -> float:
        done, promised = self.sums.get(key, (1.0, 1.0))
        return done / promised


@dataclass
class Realised:
    """What one sequence's kept plans delivered, per Key: decayed sums of the extra tokens (committed - 1) they
    were expected to commit and did commit. keep() when a plan is kept, settle() with the output's length once its
    round is over (feeding the batch's Pool too); factor() scales the sequence's next expected extra tokens."""

    own: dict = field(default_factory=dict)  # key -> [delivered, expected]
    in_flight: tuple[Key, float, int] | None = None  # (key, expected extra tokens, output length before the round)

    def keep(self, key: Key, extra: float, length: int) -> None:
        self.in_flight = (key, max(0.0, extra), length)

    def settle(self, length: int, pool: Pool | None = None) -> None:
        if self.in_flight is not None:
            key, extra, before = self.in_flight
            done = max(0, length - before - 1)
            row = self.own.setdefault(key, [0.0, 0.0])
            row[0] = REALISED_DECAY * row[0] + done
            row[1] = REALISED_DECAY * row[1] + extra
            if pool is not None:
                pool.add(key, done, extra)
            self.in_flight = None

    def factor(self, key: Key, pool: Pool | None = None) -> float:
        done, promised = self.own.get(key, (0.0, 0.0))
        prior = pool.ratio(key) if pool is not None else 1.0
        return (done + REALISED_PRIOR * prior) / (promised + REALISED_PRIOR)


def _shape(ask: PlanAsk) -> tuple[float, int, list[int]]:
    """(expected tokens, verified nodes, tokens each draft forward feeds: [] for a plan without draft forwards)."""
    plan = ask.plan
    size = plan.size or len(plan.tree)
    expected = plan.expected if plan.expected is not None else 1.0
    if plan.proposer in NO_DRAFT or plan.tree.max_depth == 0:
        return expected, size, []
    depth = min(plan.tree.max_depth, size - 1)  # a chain stopped token by token: expected shorter than planned
    feeds = [max(1, ask.pending)] + [len(plan.tree.level(d)) for d in range(1, depth)]
    return expected, size, feeds


class _Step:
    """The speculating members of a step as the sums its price needs, grown one member at a time: extra target
    tokens, expected extra tokens, per draft level (members drafting that deep, the most tokens one feeds), and
    the draft levels fed in all."""

    def __init__(self):
        self.extra, self.gain, self.fed = 0, 0.0, 0
        self.levels: list[list[int]] = []

    def add(self, shape: tuple[float, int, list[int]]) -> _Step:
        expected, size, feeds = shape
        self.extra += size - 1
        self.gain += expected - 1
        for level, n in enumerate(feeds):
            if level == len(self.levels):
                self.levels.append([0, 0])
            self.levels[level][0] += 1
            self.levels[level][1] = max(self.levels[level][1], n)
        self.fed += len(feeds)
        return self


def choose(asks: list[PlanAsk], others: int, other_tokens: int, table, overhead: dict | None = None,
           factors: list[float] | None = None) -> list[bool]:
    """Which asks run as planned (True) and which take a plain step (False). others: the step's other sequences
    (not asking: a method's fixed plan, a prefill); other_tokens: the target tokens they bring (at least one each).
    table: drafting/batch_costs.BatchCosts. factors: each ask's Realised.factor() (default 1). See the module
    docstring."""
    batch = len(asks) + others
    if batch <= 1 or not asks:
        return [True] * len(asks)
    o = overhead or DEFAULT_OVERHEAD
    shapes = [_shape(a) for a in asks]
    if factors is not None:
        shapes = [(1 + f * (e - 1), size, feeds) for f, (e, size, feeds) in zip(factors, shapes)]
    base = other_tokens + len(asks)
    has_draft = "draft" in table.seconds

    def seconds(step: _Step) -> float:
        t = table.target(batch, (base + step.extra) / batch) + batch * o["round_s"]
        if step.levels and has_draft:
            for count, most in step.levels:
                t += table.scale["d"] * table.forward("draft", count, most)
            t += step.fed * o["level_s"]
        return t

    plain = seconds(_Step())
    gain = [(shapes[i][0] - 1) / max(seconds(_Step().add(shapes[i])) - plain, 1e-9) for i in range(len(asks))]
    order = sorted(range(len(asks)), key=lambda i: -gain[i])
    best_k, best, step = 0, batch / plain * (1 + MARGIN), _Step()
    for k, i in enumerate(order, start=1):  # each prefix grown from the last: O(asks x levels), not quadratic
        r = (batch + step.add(shapes[i]).gain) / seconds(step)
        if r > best:
            best_k, best = k, r
    keep = set(order[:best_k])
    return [i in keep for i in range(len(asks))]
