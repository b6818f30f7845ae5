"""auto's acceptance estimates, learned online within a generation and exponentially weighted.

- `Acceptance`: c(d, r) = P(the rank-r child of a node at depth d - 1 is accepted | that node was reached and ranks
  < r were rejected) — what rrs-wor (and greedy top-n verification) does, rank by rank — shrunk towards the pooled
  rate of each rank. Prompt lookup keys it by (depth, matched n-gram length) instead.
- `ConfidenceRates`: a chain's next token accepted, by the draft's own probability of it (a training-free
  predictor like transformers' confidence threshold, calibrated online).
- `RealisedRates`: per plan family, how fast its rounds ran against the seconds predicted for them.
- `greedy_tree` / `to_tree`: the best draft tree of every size for the estimated rates (OPT-Tree's construction).
"""
from __future__ import annotations

import heapq
import math
from collections import defaultdict

from multispec.tree import Tree

DECAY = 0.95  # per round: about the last 20 rounds carry the estimates
PRIOR_WEIGHT = 2.0
SHRINK = 3.0  # pseudo-observations pulling a depth's estimate towards the pooled one for its rank
REALISED_PRIOR = 4.0  # rounds of evidence that the cost model is right (factor 1)
REALISED_CLAMP = (0.5, 1.5)
CONF_EDGES = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.97)  # buckets of the draft's probability of its own token


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

    def state(self) -> dict[str, list[float]]:
        """The counts as JSON: {"depth,rank": [accepted, tried]} (drafting/auto/memory.py stores them)."""
        return {f"{d},{r}": [self.num[(d, r)], den] for (d, r), den in self.den.items() if den > 1e-6}

    def restore(self, state: dict) -> None:
        """Start from stored counts (what `state` wrote; keys that do not parse are skipped)."""
        for k, v in state.items():
            d, _, r = k.partition(",")
            num, den = v if isinstance(v, list) and len(v) == 2 else (1.0, 0.0)
            if d.isdigit() and r.isdigit() and 0 <= num <= den:
                self.num[(int(d), int(r))], self.den[(int(d), int(r))] = float(num), float(den)
        self.version += 1


class ConfidenceRates:
    """P(a chain's next draft token is accepted), by bucket of the draft's probability of it (CONF_EDGES)."""

    def __init__(self) -> None:
        self.rows = [[0.0, 0.0] for _ in range(len(CONF_EDGES) + 1)]  # [accepted, tried] per bucket, decayed

    def rate(self, conf: float) -> float:
        b = bucket(conf)
        num, den = self.rows[b]
        prior = (CONF_EDGES[b - 1] if b > 0 else 0.0) * 0.5 + (CONF_EDGES[b] if b < len(CONF_EDGES) else 1.0) * 0.5
        return (num + PRIOR_WEIGHT * prior) / (den + PRIOR_WEIGHT)

    def state(self) -> list[list[float]]:
        return [list(row) for row in self.rows]

    def restore(self, rows: list) -> None:
        if len(rows) == len(self.rows) and all(len(r) == 2 and 0 <= r[0] <= r[1] for r in rows):
            self.rows = [[float(a), float(t)] for a, t in rows]

    def add_round(self, confs: list[float], path_len: int) -> None:
        """One chain round: confs[i] the draft's probability of its token at depth i + 1; path_len: accepted + 1."""
        for row in self.rows:
            row[0] *= DECAY
            row[1] *= DECAY
        for i, cf in enumerate(confs[:path_len]):  # tried: depth i + 1, reached since path >= i + 1
            row = self.rows[bucket(cf)]
            row[0] += float(i + 1 < path_len)
            row[1] += 1.0


class RealisedRates:
    """Per plan family ("ar", "draft chain", "draft tree", "lookup", "suffix", ...): how fast its rounds ran against
    the seconds the cost model predicted for the tree each actually drafted — a decayed mean of log(predicted /
    realised), shrunk towards 0 by REALISED_PRIOR rounds. factor(family) = exp of it, clamped: what the cost model
    misses about a family (a suffix or lookup proposal's Python, a chain's per-level work, a machine busier than at
    calibration) is corrected from its own rounds: a generation scores plans with the factors its profile holds
    (fixed for the run) and records its own rounds for the next profile (drafting/auto/memory.py).
    Acceptance is not in it (the acceptance estimates learn that), so a family that was unlucky is not held down."""

    def __init__(self) -> None:
        self.rows: dict[str, list[float]] = {}  # family -> [Σ log(predicted / realised), rounds], decayed

    def add(self, family: str, predicted_s: float, realised_s: float) -> None:
        if predicted_s > 0 and realised_s > 0:
            row = self.rows.setdefault(family, [0.0, 0.0])
            row[0] = DECAY * row[0] + math.log(predicted_s / realised_s)
            row[1] = DECAY * row[1] + 1.0

    def factor(self, family: str) -> float:
        total, n = self.rows.get(family, (0.0, 0.0))
        return min(REALISED_CLAMP[1], max(REALISED_CLAMP[0], math.exp(total / (n + REALISED_PRIOR))))

    def state(self) -> dict[str, list[float]]:
        return {k: [v[0], v[1]] for k, v in self.rows.items()}

    def restore(self, rows: dict) -> None:
        for k, v in rows.items():
            if isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v) and v[1] >= 0:
                self.rows[k] = [float(v[0]), float(v[1])]


def bucket(conf: float) -> int:
    for i, edge in enumerate(CONF_EDGES):
        if conf < edge:
            return i
    return len(CONF_EDGES)


def greedy_tree(rate, max_nodes: int, max_depth: int, max_width: int) -> tuple[list[tuple[int, int]], list[float]]:
    """OPT-Tree-style greedy growth: repeatedly add the candidate node with the highest probability of being
    reached; that probability only falls along a path and across ranks, so every prefix of the order is itself a
    tree and one pass gives the best tree of every size. rate(depth, rank) -> conditional acceptance. Returns the
    nodes in the order added, as (parent order index or -1 for the root, rank), and each node's reach."""
    # heap of candidates: (-reach, tie, parent index, depth, rank, reach of the parent times P(ranks < r rejected))
    heap = [(-rate(1, 1), 0, -1, 1, 1, 1.0)]
    nodes: list[tuple[int, int]] = []
    reach: list[float] = []
    tie = 1
    while heap and len(nodes) < max_nodes:
        neg, _, parent, depth, rank, base = heapq.heappop(heap)
        nodes.append((parent, rank))
        reach.append(-neg)
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


def to_tree(nodes: list[tuple[int, int]]) -> Tree:
    """Greedy-order nodes (parent's greedy index or -1, rank) -> a breadth-first Tree: level by level, children
    grouped under their parent in the parent's tree order, siblings in rank order."""
    depth: list[int] = []
    for parent, _ in nodes:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    index: dict[int, int] = {}  # greedy index -> tree node index
    parents = [-1]
    for d in range(1, max(depth, default=0) + 1):
        level = [i for i in range(len(nodes)) if depth[i] == d]
        level.sort(key=lambda i: (index.get(nodes[i][0], 0), nodes[i][1]))
        for i in level:
            parents.append(0 if nodes[i][0] < 0 else index[nodes[i][0]])
            index[i] = len(parents) - 1
    return Tree(tuple(parents))
