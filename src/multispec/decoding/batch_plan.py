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
per-request off switch, which also spares its planning); one kept is asked again next round.

The price is a model; the Gate checks it against the clock. Per batch size it keeps the decayed tokens per second
of the steps in which some asked plan ran and of the plain steps (nothing drafted, one token a sequence). Where
both have GATE_MIN steps and the speculating steps ran fewer tokens per second, the gate shuts at that batch size:
its asks are answered plain, except on every GATE_EXPLORE-th answering step, whose plans keep the measurement
current (and open the gate again once speculating steps outrun plain ones). A plain step's tokens per second hardly
depends on the text, so a speculating step's rate against it is the plans' measured worth at that batch size.
Plans depend on the policies' estimates and measured costs and times, never on a round's coins, so every lossless
verifier stays lossless.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from multispec.drafting.auto.costs import DEFAULT_OVERHEAD
from multispec.drafting.protocol import RoundPlan
from multispec.tree import Tree

__all__ = ["Gate", "MARGIN", "OFF_MAX", "PLAIN", "PlanAsk", "Pool", "Realised", "choose"]

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
GATE_MIN = 8  # steps of each kind (speculating, plain) at a batch size before the gate compares them
GATE_DECAY = 0.95  # the gate's sums decay per step of their kind (about the last 20 count)
GATE_EXPLORE = 8  # while shut at a batch size, every 8th answering step there runs its plans


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


@dataclass
class Gate:
    """Measured tokens per second of a batch's steps per batch size: the steps in which some asked plan ran
    against the plain ones (see the module docstring). record() after each step that was one or the other;
    open(batch) before a step's asks are answered."""

    rows: dict = field(default_factory=dict)  # batch size -> [[tokens, seconds, steps] speculating, [...] plain]
    answered: dict = field(default_factory=dict)  # batch size -> answering steps while shut (for GATE_EXPLORE)

    def record(self, batch: int, speculated: bool, tokens: int, seconds: float) -> None:
        row = self.rows.setdefault(batch, [[0.0, 0.0, 0], [0.0, 0.0, 0]])[0 if speculated else 1]
        row[0] = GATE_DECAY * row[0] + tokens
        row[1] = GATE_DECAY * row[1] + seconds
        row[2] += 1

    def shut(self, batch: int) -> bool:
        """Whether speculating steps at this batch size measured fewer tokens per second than plain ones."""
        spec, plain = self.rows.get(batch, ([0, 0, 0], [0, 0, 0]))
        if spec[2] < GATE_MIN or plain[2] < GATE_MIN:
            return False
        return spec[0] * plain[1] < plain[0] * spec[1]  # spec tokens / s < plain tokens / s

    def open(self, batch: int) -> bool:
        """Whether this step's asks at `batch` sequences may run as priced (shut: every GATE_EXPLORE-th may)."""
        if not self.shut(batch):
            self.answered.pop(batch, None)
            return True
        n = self.answered[batch] = self.answered.get(batch, 0) + 1
        return n % GATE_EXPLORE == 0

    def report(self) -> dict:
        """{batch size: {"spec_tps", "plain_tps", "shut"}} for the stats."""
        tps = lambda r: r[0] / r[1] if r[1] > 0 else None  # noqa: E731
        return {b: {"spec_tps": tps(s), "plain_tps": tps(p), "steps": [s[2], p[2]], "shut": self.shut(b)}
                for b, (s, p) in sorted(self.rows.items())}


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
