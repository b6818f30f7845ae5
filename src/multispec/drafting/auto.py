"""`auto`: choose every round the drafting plan that maximizes expected committed tokens per second.

Inputs, all measured here and now:
- acceptance, estimated online and exponentially weighted: for the draft model, c(d, r) = P(the rank-r child of a
  node at depth d - 1 is accepted | that node was reached and ranks < r were rejected) — what rrs-wor (and greedy
  top-n verification) does, rank by rank; for prompt lookup, c(n, d) per matched n-gram length n and depth d;
- the cost model (drafting/costs.py): seconds of a target / draft forward of n tokens, plus per-round and
  per-draft-level overheads learned from earlier generations.

Plans: no speculation (one target step); a prompt-lookup chain of any length up to the match; with proposer
"suffix", a suffix tree from the context and past requests (depth chosen by predicted tokens/s); or a draft tree
built greedily for the estimated acceptance (OPT-Tree's construction: repeatedly add the candidate node with the
highest probability of being reached; since that probability only falls along a path and across ranks, every
prefix of the order is itself a tree, so one pass gives the best tree of every size). A chain is the tree this
yields when second-rank acceptance is low. The value of a plan is E[tokens] / predicted seconds, with
E[tokens] = 1 + Σ_nodes P(reach).

When no speculation wins, cheap probes (the best speculative plan, every 8, 16, 32, 64 rounds) keep the estimates
alive so that auto can switch back. Plans depend only on this generation's outcomes and the costs cached before it
started (frozen during a generation), never on the round's own coins, so every round is a lossless round and the
output law is the target's.
"""
from __future__ import annotations

import heapq
from collections import Counter, defaultdict

from multispec.drafting.costs import CostModel, get_cost_model, update_after_generation
from multispec.drafting.lookup import NgramIndex
from multispec.drafting.protocol import DraftPolicyBase, RoundOutcome, RoundPlan
from multispec.drafting.suffix import SuffixProposer
from multispec.tree import Tree

DECAY = 0.95  # per round: about the last 20 rounds carry the estimates
PRIOR_WEIGHT = 2.0
SHRINK = 3.0  # pseudo-observations pulling a depth's estimate towards the pooled one for its rank
PROBE_PERIODS = (8, 16, 32, 64)
SCALE_RATE = 0.2  # how fast measured forward times correct the calibrated costs within a generation
CATCH_UP_ROUNDS = 8  # the draft's catch-up forward is charged over this many rounds (see _draft_plan)
SCALE_STEP = 0.05  # a cost correction that moved this much (relative) remakes the cached plans
BATCH_PLAIN_FROM = 4  # sampling (T > 0) in a batch of at least this many sequences: plain steps only
BATCH_SKIP_BELOW = 0.8  # in a batch: plans predicted below this fraction of a plain step's rate start a back-off
MARGIN = 0.03
# In a batch a plan's cost also falls on the other sequences (each speculating sequence lengthens every step, while
# the batch ends with its slowest sequence), which the share model does not see: speculate only for a clear gain.
BATCH_MARGIN = 0.25  # speculate only when predicted to beat plain decoding by this much: never slower comes first
CONF_EDGES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.97)  # buckets of the draft's probability of its own token
DEFAULT_OVERHEAD = {"round_s": 4e-4, "level_s": 3e-4}
SUFFIX_PRIOR = 2.0  # pseudo-counts of the suffix calibration
SUFFIX_PRIOR_CALIB = 0.5  # where the calibration starts: a node reached half as often as its frequency score says


class Acceptance:
    """Exponentially weighted accept/try counts per (depth, rank), shrunk towards the pooled rate of each rank.
    `table(depths, ranks)` evaluates every rate once per change, so planning reads a small list."""

    def __init__(self, prior: dict[int, float]):
        self.prior = prior  # rank -> prior conditional acceptance
        self.num: dict[tuple[int, int], float] = defaultdict(float)
        self.den: dict[tuple[int, int], float] = defaultdict(float)
        self.version = 0  # bumped on every change (plans cached on it)
        self._table: tuple[int, list[list[float]]] | None = None

    def decay(self) -> None:
        for k in self.num:
            self.num[k] *= DECAY
            self.den[k] *= DECAY
        self.version += 1

    def add(self, depth: int, rank: int, accepted: bool) -> None:
        self.num[(depth, rank)] += float(accepted)
        self.den[(depth, rank)] += 1.0
        self.version += 1

    def table(self, depths: int, ranks: int) -> list[list[float]]:
        """rates[d][r] for d in 0..depths, r in 0..ranks (index 0 unused)."""
        if self._table is not None and self._table[0] == self.version and len(self._table[1]) > depths:
            return self._table[1]
        pn: dict[int, float] = defaultdict(float)
        pd: dict[int, float] = defaultdict(float)
        for (d, r), v in self.num.items():
            pn[r] += v
            pd[r] += self.den[(d, r)]
        rates = [[0.0] * (ranks + 1) for _ in range(depths + 1)]
        for r in range(1, ranks + 1):
            prior = self.prior.get(r, self.prior[max(self.prior)])
            pooled = (pn[r] + PRIOR_WEIGHT * prior) / (pd[r] + PRIOR_WEIGHT)
            for d in range(1, depths + 1):
                rates[d][r] = (self.num.get((d, r), 0.0) + SHRINK * pooled) / (self.den.get((d, r), 0.0) + SHRINK)
        self._table = (self.version, rates)
        return rates

    def rate(self, depth: int, rank: int) -> float:
        return self.table(max(depth, 16), max(rank, 4))[depth][rank]


def greedy_tree(rate, max_nodes: int, max_depth: int, max_width: int) -> tuple[list[tuple[int, int]], list[float]]:
    """OPT-Tree-style greedy growth. rate(depth, rank) -> conditional acceptance. Returns the nodes in the order
    added, as (parent order index or -1 for the root, rank), and each node's reach probability."""
    # heap of candidates: (-reach, tie, parent index, depth, rank, reach of the parent times P(ranks < r rejected))
    heap = [(-rate(1, 1), 0, -1, 1, 1, 1.0)]
    nodes: list[tuple[int, int]] = []
    reach: list[float] = []
    depths: list[int] = []
    tie = 1
    while heap and len(nodes) < max_nodes:
        neg, _, parent, depth, rank, base = heapq.heappop(heap)
        nodes.append((parent, rank))
        reach.append(-neg)
        depths.append(depth)
        me = len(nodes) - 1
        c = rate(depth, rank)
        if rank < max_width:  # the next sibling is reached when this one is rejected
            nb = base * (1 - c)
            heapq.heappush(heap, (-(nb * rate(depth, rank + 1)), tie, parent, depth, rank + 1, nb))
            tie += 1
        if depth < max_depth:
            heapq.heappush(heap, (-(-neg * rate(depth + 1, 1)), tie, me, depth + 1, 1, -neg))
            tie += 1
    return nodes, reach


def _bucket(conf: float) -> int:
    for i, edge in enumerate(CONF_EDGES):
        if conf < edge:
            return i
    return len(CONF_EDGES)


def to_tree(nodes: list[tuple[int, int]]) -> Tree:
    """Greedy-order nodes (parent's greedy index or -1, rank) -> a breadth-first Tree: level by level, children
    grouped under their parent in the parent's tree order, siblings in rank order."""
    depth: list[int] = []
    for parent, _ in nodes:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    index = {}  # greedy index -> tree node index
    parents = [-1]
    for d in range(1, max(depth, default=0) + 1):
        level = [i for i in range(len(nodes)) if depth[i] == d]
        level.sort(key=lambda i: (index.get(nodes[i][0], 0), nodes[i][1]))
        for i in level:
            parents.append(0 if nodes[i][0] < 0 else index[nodes[i][0]])
            index[i] = len(parents) - 1
    return Tree(tuple(parents))


_ROOT = Tree.chain(0)
_CHAINS = [Tree.chain(k) for k in range(65)]


class AutoPolicy(DraftPolicyBase):
    """See the module docstring. proposers: which proposers may be used ("draft", "lookup")."""

    defers_draft_prefill = True  # a generation that never drafts never pays the draft's prefill

    def __init__(self, proposers=("draft", "lookup"), max_nodes: int = 32, max_depth: int = 12,
                 max_width: int = 4, lookup_tokens: int = 10, max_ngram: int = 3, forced_plans=None,
                 cost_model: CostModel | None = None, suffix_store=None):
        self.proposers = tuple(proposers)
        self.max_nodes, self.max_depth, self.max_width = max_nodes, max_depth, max_width
        self.lookup_tokens, self.max_ngram = lookup_tokens, max_ngram
        self.forced_plans = forced_plans  # tests: (history, round index) -> RoundPlan, replacing the choice
        self.fixed_costs = cost_model
        self.suffix_store = suffix_store  # "suffix": the store of past requests shared by the Decoder family
        # (StepBatcher, BatchCosts) when this policy plans one sequence of a batch (decoding/batch.py): a plan is
        # then valued at its share of the batched forwards, for the batch's live size
        self.batch = None
        self.sampling_in_batch = False  # set per run by a batch lane: T > 0
        self.reset()

    def reset(self) -> None:
        self.draft_acc = Acceptance({1: 0.5, 2: 0.2, 3: 0.12, 4: 0.08})
        self.lookup_acc = Acceptance({1: 0.3, 2: 0.4, 3: 0.5})  # keyed (depth, matched n-gram length)
        self.costs: CostModel | None = self.fixed_costs
        self.overhead = dict(DEFAULT_OVERHEAD)
        self.rounds = 0
        self.ar_streak = 0
        self.probe_level = 0
        self.has_draft = False
        self.usage: Counter = Counter()
        self.realised: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])  # tokens, s, pred tps, n
        self.round_log: list[tuple[int, float]] = []  # (draft levels, overhead seconds) for the overhead fit
        self._greedy = None
        self.scale = {"t1": 1.0, "tn": 1.0, "d": 1.0}
        self.scale_version = 0
        self._scale_seen = dict(self.scale)  # the scales the cached plans were made with
        self.current: RoundPlan | None = None
        self.round_conf = []
        self._pending = 1
        self.conf_acc = [[0.0, 0.0] for _ in range(len(CONF_EDGES) + 1)]
        self.ngrams = NgramIndex(self.max_ngram)
        self.suffix = SuffixProposer(self.suffix_store, depth=self.suffix_store.depth) \
            if self.suffix_store is not None else SuffixProposer()
        # decayed sums: accepted nodes, predicted (Σ scores of the drafted nodes)
        self.suffix_calib = [SUFFIX_PRIOR * SUFFIX_PRIOR_CALIB, SUFFIX_PRIOR]
        self._suffix_skip = self._suffix_backoff = 0
        self._batch_skip = self._batch_backoff = 0
        self._suffix_predicted = 0.0
        self._plan_cache: dict = {}
        self._curves = None  # (target, draft) seconds by forward size, read from the cost model in prepare

    def prepare(self, target, draft, context_len: int) -> None:
        self.has_draft = draft is not None and "draft" in self.proposers
        if self.batch is not None and self.fixed_costs is None:
            self.costs = self.batch[1].cost_model()  # measured batched, before any sequence ran
        elif self.costs is None and self.forced_plans is None:
            self.costs = get_cost_model(target, getattr(target, "model", target),
                                        draft if self.has_draft else None,
                                        getattr(draft, "model", draft) if self.has_draft else None, context_len)
        entry_overhead = getattr(self.costs, "overhead", None)
        if entry_overhead:
            self.overhead = dict(entry_overhead)
        self._curves = None
        # the costs are frozen for the generation: read once here (_t, _d), not interpolated again for every plan
        if self.costs is not None and self.batch is None:
            n = range(1, self.max_nodes + 2)
            self._curves = ([0.0] + [self.costs.target(i) for i in n],
                            [0.0] + [self.costs.draft(i) if self.costs.draft is not None else 0.0 for i in n])

    # ------------------------------------------------------------------ planning
    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        self.rounds += 1
        if self.forced_plans is not None:  # tests: plans forced to change between rounds
            self.current = self.forced_plans(history, self.rounds - 1)
            return self.current
        if self.sampling_in_batch and self.batch is not None and self.batch[0].live >= BATCH_PLAIN_FROM:
            # Measured (docs/batching.md): sampling in a batch of 4 or more, speculation of any kind lost 11-28 %
            # to plain batched steps on every configuration tried (each speculating sequence lengthens every
            # step, its planning runs in turn with everyone else's, and the batch ends with its slowest sequence).
            self.current = self._ar_plan()
            return self.current
        if self._batch_skip > 0:  # see below: a plain step without weighing the others
            self._batch_skip -= 1
            self.current = self._ar_plan()
            return self.current
        candidates = [self._ar_plan()]
        if self.has_draft:
            candidates.append(self._draft_plan(pending))
        if "lookup" in self.proposers:
            plan = self._lookup_plan(history)
            if plan is not None:
                candidates.append(plan)
        if "suffix" in self.proposers:
            plan = self._suffix_plan(history)
            if plan is not None:
                candidates.append(plan)
                # a suffix proposal costs ~0.05-0.5 ms of Python: after one that loses to a plain step, skip the
                # next 1, 2, 4 ... 16 rounds' proposals (sampling at T > 0 rarely repeats the context)
                if plan.predicted_tps < candidates[0].predicted_tps:
                    self._suffix_backoff = min(16, max(1, 2 * self._suffix_backoff))
                    self._suffix_skip = self._suffix_backoff
                else:
                    self._suffix_backoff = 0
        ar = candidates[0]
        best = max(candidates[1:], key=lambda p: p.predicted_tps, default=ar)
        if self.batch is not None and self.batch[0].live > 1:
            # In a batch every sequence's planning runs in turn between two forwards, so it costs the whole
            # batch: when the best speculative plan falls well short of a plain step, plain steps follow for the
            # next 1, 2, 4 ... 16 rounds without weighing the others.
            if best is ar or best.predicted_tps < ar.predicted_tps * BATCH_SKIP_BELOW:
                self._batch_backoff = min(16, max(1, 2 * self._batch_backoff))
                self._batch_skip = self._batch_backoff
            else:
                self._batch_backoff = 0
        margin = BATCH_MARGIN if self.batch is not None and self.batch[0].live > 1 else MARGIN
        if best.predicted_tps < ar.predicted_tps * (1 + margin):
            best = ar
        self.current = best
        if best.proposer == "none" and len(candidates) > 1:
            self.ar_streak += 1
            period = PROBE_PERIODS[min(self.probe_level, len(PROBE_PERIODS) - 1)]
            if self.batch is not None:  # in a batch a probe's draft forwards hold up every sequence: probe B x rarer
                period *= max(1, self.batch[0].live)
            if self.ar_streak >= period:  # probe: the best speculative plan, to keep its estimates current
                self.ar_streak = 0
                self.probe_level += 1
                spec = max(candidates[1:], key=lambda p: p.predicted_tps)
                self.current = RoundPlan(spec.tree, spec.proposer, spec.tokens, spec.label + " (probe)",
                                         spec.predicted_tps, spec.ngram)
                return self.current
        else:
            self.ar_streak = 0
            if best.proposer != "none":
                self.probe_level = 0
        return best

    # ------------------------------------------------------------------ costs corrected online
    def _t(self, n: int) -> float:
        """Predicted seconds of a target forward of n tokens: the calibrated curve times what this generation's
        own forwards measured against it (one factor for single-token steps, one for multi-token verification:
        the ratio between them is what decides whether speculation pays, and load changes it)."""
        if self.batch is not None:  # its share of a forward of one token per sequence, plus what its n - 1 more add
            batcher, costs = self.batch
            b = max(1, batcher.live)
            base = costs.forward("target", b, 1)
            return base / b + (costs.forward("target", b, 1 + (n - 1) / b) - base if n > 1 else 0.0)
        raw = self._curves[0][n] if self._curves is not None and n < len(self._curves[0]) else self.costs.target(n)
        return raw * (self.scale["t1"] if n == 1 else self.scale["tn"])

    def _d(self, n: int) -> float:
        if self.costs.draft is None:
            return 0.0
        if self.batch is not None:  # a draft forward is shared by the sequences drafting beside it: as many as last time
            batcher, costs = self.batch
            k = max(1, batcher.last.get(0, 1))
            return costs.forward("draft", k, n) / k
        raw = self._curves[1][n] if self._curves is not None and n < len(self._curves[1]) else self.costs.draft(n)
        return raw * self.scale["d"]

    def _learn(self, key: str, predicted: float, measured: float) -> None:
        if predicted > 0 and measured > 0:
            ratio = min(3.0, max(1 / 3, measured / predicted))
            self.scale[key] = (1 - SCALE_RATE) * self.scale[key] + SCALE_RATE * self.scale[key] * ratio
            # plans are remade (a draft plan costs ~0.4 ms, 5 % of a small target's step) only when a scale has
            # moved by SCALE_STEP since they were made, not on every round's jitter
            if abs(self.scale[key] / self._scale_seen[key] - 1) > SCALE_STEP:
                self._scale_seen = dict(self.scale)
                self.scale_version += 1

    # ------------------------------------------------------------------ chains stopped token by token
    def start_round(self) -> None:
        self.round_conf: list[float] = []

    def keep_drafting(self, depth, parent_hidden, parent_q, new_tokens=None) -> bool:
        """Draft chains: after each draft token, draft one more only if that raises the expected committed tokens
        per second, with the newest token's acceptance estimated from the draft's own probability of it (a
        training-free predictor, like transformers' confidence threshold, but calibrated online). Reads draft-side
        state only, so the round stays lossless."""
        plan = self.current
        if plan is None or plan.proposer != "draft" or len(plan.tree) - 1 != plan.tree.max_depth \
                or self.costs is None:
            return True  # trees (and forced test plans): drafted whole
        conf = float(parent_q[0, new_tokens[0]])
        self.round_conf.append(conf)
        reach, expected = 1.0, 1.0
        for cf in self.round_conf:
            reach *= self._conf_rate(cf)
            expected += reach
        c = self.costs
        t_now = (self._d(self._pending) + (depth - 1) * self._d(1) + self._t(depth + 1) + self.overhead["round_s"]
                 + depth * self.overhead["level_s"])
        nxt = self._conf_rate(conf)  # confidence is persistent: the next token looks like this one
        t_next = t_now + self._d(1) + self._t(depth + 2) - self._t(depth + 1) + self.overhead["level_s"]
        return (expected + reach * nxt) / t_next > expected / t_now

    def _conf_rate(self, conf: float) -> float:
        b = _bucket(conf)
        num, den = self.conf_acc[b]
        prior = (CONF_EDGES[b - 1] if b > 0 else 0.0) * 0.5 + (CONF_EDGES[b] if b < len(CONF_EDGES) else 1.0) * 0.5
        return (num + PRIOR_WEIGHT * prior) / (den + PRIOR_WEIGHT)

    def _ar_plan(self) -> RoundPlan:
        t = self._t(1) + self.overhead["round_s"]
        return RoundPlan(_ROOT, "none", label="ar", predicted_tps=1.0 / t)

    def _draft_plan(self, pending: int) -> RoundPlan:
        # pending counted to the next power of two: while auto decodes without its draft (the prompt and every
        # token since stay pending), the plan is recomputed when the catch-up cost doubles, not every round
        pending = 1 << max(0, pending - 1).bit_length()
        self._pending = pending
        key = (self.draft_acc.version, pending, self.scale_version, self.batch[0].live if self.batch else 0)
        if self._plan_cache.get("key") == key:
            return self._plan_cache["plan"]
        if self._greedy is None or self._greedy[0] != self.draft_acc.version:  # the tree only changes with acceptance
            rates = self.draft_acc.table(self.max_depth + 1, self.max_width + 1)
            self._greedy = (self.draft_acc.version,
                            *greedy_tree(lambda d, r: rates[d][r], self.max_nodes, self.max_depth, self.max_width))
        _, nodes, reach = self._greedy
        c_draft = [0.0] + [self._d(n) for n in range(1, self.max_nodes + 1)]
        c_target = [0.0] + [self._t(n) for n in range(1, self.max_nodes + 2)]
        # The first draft forward feeds the pending chain (the prompt, when the draft's prefill was deferred, and
        # every token committed since the draft last ran). That catch-up is paid once and then serves every later
        # round, so it is charged spread over CATCH_UP_ROUNDS rounds: charged whole, it made the draft look dearer
        # the longer auto went without it, and at T = 1 auto stayed on plain steps where draft chains paid 1.2x.
        base = self._d(1) + (self._d(pending) - self._d(1)) / CATCH_UP_ROUNDS + self.overhead["round_s"]
        best_n, best_tps = 1, -1.0
        expected, fed_sum, deepest = 1.0, 0.0, 0
        sizes = [0] * (self.max_depth + 2)
        depth_of: list[int] = []
        for n, ((parent, _), r) in enumerate(zip(nodes, reach), start=1):
            d = 1 if parent < 0 else depth_of[parent] + 1
            depth_of.append(d)
            if d > deepest:  # the previous deepest level is now fed to the draft
                if deepest >= 1:
                    fed_sum += c_draft[sizes[deepest]]
                deepest = d
            elif d < deepest:  # a fed level grew
                fed_sum += c_draft[sizes[d] + 1] - c_draft[sizes[d]]
            sizes[d] += 1
            expected += r
            t = base + fed_sum + c_target[n + 1] + deepest * self.overhead["level_s"]
            if expected / t > best_tps:
                best_n, best_tps = n, expected / t
        tree = to_tree(nodes[:best_n])
        if tree.max_depth == len(tree) - 1:  # a chain: drafted up to max_depth, stopped token by token (keep_drafting)
            plan = RoundPlan(_CHAINS[self.max_depth], "draft", label="draft chain", predicted_tps=best_tps)
        else:
            plan = RoundPlan(tree, "draft", label=f"draft tree {len(tree) - 1}", predicted_tps=best_tps)
        self._plan_cache = {"key": key, "plan": plan}
        return plan

    def _lookup_plan(self, history: list[int]) -> RoundPlan | None:
        tokens, n = self.ngrams.propose(history, self.lookup_tokens)
        if not tokens:
            return None
        best_k, best_tps, expected, reach = 0, -1.0, 1.0, 1.0
        rates = self.lookup_acc.table(max(16, len(tokens)), 4)
        for k in range(1, len(tokens) + 1):
            reach *= rates[k][n]
            expected += reach
            t = self._t(k + 1) + self.overhead["round_s"]
            if expected / t > best_tps:
                best_k, best_tps = k, expected / t
        chain = tuple(tokens[:best_k])
        return RoundPlan(_CHAINS[best_k] if best_k < len(_CHAINS) else Tree.chain(best_k), "lookup", chain, label=f"lookup {best_k}", predicted_tps=best_tps,
                         ngram=n)

    def _suffix_plan(self, history: list[int]) -> RoundPlan | None:
        """A suffix tree (drafting/suffix.py: frequencies of continuations in the context and past requests),
        truncated to the depth with the best predicted tokens/s. A node's reach is its empirical frequency score
        times a calibration factor learned online (accepted nodes / Σ predicted scores of drafted trees)."""
        if self._suffix_skip > 0:
            self._suffix_skip -= 1
            return None
        prop = self.suffix.propose(history, self.max_nodes)
        if len(prop.tree) == 1:
            return None
        calib = self.suffix_calib[0] / self.suffix_calib[1]
        tree, best = prop.tree, (0, -1.0, 0.0)
        for d in range(1, tree.max_depth + 1):
            n = tree.level_end(d)
            predicted = sum(prop.scores[1:n])
            tps = (1 + calib * predicted) / (self._t(n) + self.overhead["round_s"])
            if tps > best[1]:
                best = (d, tps, predicted)
        d, tps, predicted = best
        sub = tree if d == tree.max_depth else tree.truncate(d)
        plan = RoundPlan(sub, "suffix", tuple(prop.tokens[1:len(sub)]), label=f"suffix {len(sub) - 1}",
                         predicted_tps=tps)
        self._suffix_predicted = predicted
        return plan

    # ------------------------------------------------------------------ learning
    def observe(self, outcome: RoundOutcome) -> None:
        plan, tree, path, times = outcome.plan, outcome.tree, outcome.path, outcome.times
        committed = len(path)  # accepted nodes + the token that ends the round
        key = "ar" if plan.proposer == "none" else plan.label.removesuffix(" (probe)")
        self.usage[key] += 1
        row = self.realised[key]
        row[0] += committed
        row[1] += times.round_s
        row[2] += plan.predicted_tps or 0.0
        row[3] += 1
        if self.costs is not None and self.batch is None:  # batched: a forward's time includes waiting for others
            n = len(tree)
            self.costs.observe("target", self.costs.target(n), times.target_fwd_s)
            self._learn("t1" if n == 1 else "tn", self._t(n), times.target_fwd_s)
            if times.proposer == "draft":
                raw = self.draft_time(tree, times.pending)
                self.costs.observe("draft", raw, times.draft_s)
                self._learn("d", raw * self.scale["d"], times.draft_s)
            levels = tree.max_depth if times.proposer == "draft" else 0
            forward = times.target_fwd_s + (times.draft_s if levels else 0.0)
            other = max(0.0, times.round_s - forward)
            self.round_log.append((levels, other))
            if levels == 0:  # per-round overhead, learned as it goes
                self.overhead["round_s"] += SCALE_RATE * (other - self.overhead["round_s"])
        if plan.proposer == "none" or len(tree) == 1:
            return
        if plan.proposer == "suffix":
            self.suffix_calib = [DECAY * self.suffix_calib[0] + (len(path) - 1),
                                 DECAY * self.suffix_calib[1] + self._suffix_predicted]
            return
        acc = self.draft_acc if plan.proposer == "draft" else self.lookup_acc
        acc.decay()
        if plan.proposer == "draft" and self.round_conf:  # chains: acceptance by the draft's confidence
            for row in self.conf_acc:
                row[0] *= DECAY
                row[1] *= DECAY
            for i, cf in enumerate(self.round_conf[: len(path)]):  # tried: depth i+1, reached since path >= i+1
                row = self.conf_acc[_bucket(cf)]
                row[0] += float(i + 1 < len(path))
                row[1] += 1.0
        kids = tree.children
        for i, node in enumerate(path):
            children = kids[node]
            if not children:
                break
            nxt = path[i + 1] if i + 1 < len(path) else None
            depth = i + 1
            for rank, child in enumerate(children, start=1):
                if plan.proposer == "lookup":  # chain: keyed by (depth, matched n-gram length)
                    acc.add(depth, plan.ngram, child == nxt)
                else:
                    acc.add(depth, rank, child == nxt)
                if child == nxt:
                    break

    def draft_time(self, tree: Tree, pending: int) -> float:
        """Predicted seconds of drafting `tree` (one draft forward per level but the deepest)."""
        if self.costs is None or self.costs.draft is None:
            return 0.0
        sizes = [len(tree.level(d)) for d in range(1, tree.max_depth)]
        return self.costs.draft(pending) + sum(self.costs.draft(s) for s in sizes)

    def finish(self, history: list[int]) -> None:
        if "suffix" in self.proposers and self.suffix_store is not None:
            self.suffix_store.add(None, list(history))

    def report(self) -> dict:
        if self.costs is not None and self.batch is None:
            self._fit_overheads()
            update_after_generation(self.costs, self.overhead)
        plans = {}
        for key, (tokens, secs, pred, n) in sorted(self.realised.items(), key=lambda kv: -kv[1][3]):
            plans[key] = {"rounds": n, "tokens": int(tokens),
                          "realised_tokens_per_s": tokens / secs if secs > 0 else None,
                          "predicted_tokens_per_s": pred / n if n else None}
        return {"plans": plans, "costs": None if self.costs is None else self.costs.summary(),
                "overhead": dict(self.overhead), "cost_correction": dict(self.scale)}

    def _fit_overheads(self) -> None:
        ar = sorted(o for lv, o in self.round_log if lv == 0)
        spec = [(lv, o) for lv, o in self.round_log if lv > 0]
        if ar:
            self.overhead["round_s"] = ar[len(ar) // 2]
        if spec:
            per = sorted(max(0.0, o - self.overhead["round_s"]) / lv for lv, o in spec)
            self.overhead["level_s"] = per[len(per) // 2]

