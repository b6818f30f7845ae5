"""auto's candidate plans and their values: E[committed tokens] / predicted seconds over a cost view
(drafting/auto/costs.py), with E[tokens] = 1 + Σ_nodes P(reach) from the acceptance estimates.

Plans: no speculation (one target step); a prompt-lookup chain of any length up to the match; a suffix tree from
the context and past requests (depth chosen by predicted tokens/s); or a draft tree built greedily for the
estimated acceptance (a chain is the tree this yields when second-rank acceptance is low).
"""
from __future__ import annotations

from multispec.drafting.auto.acceptance import DECAY, Acceptance, greedy_tree, to_tree
from multispec.drafting.lookup import NgramIndex
from multispec.drafting.protocol import RoundOutcome, RoundPlan
from multispec.drafting.suffix import SuffixProposer
from multispec.tree import Tree

CATCH_UP_ROUNDS = 16  # the draft's catch-up forward is charged over this many rounds (see Planner.draft)
SUFFIX_PRIOR = 2.0  # pseudo-counts of each continuation rate
# A suffix node's reach is its frequency score (the product of the conditional frequencies on its path) times c^depth:
# c, learned online, is the chance that the target goes one token further along a path the statistics say it always
# continues. Learned per length of the matched suffix (< 3, 3-5, 6-11, >= 12 tokens): as one number, it learned from
# failed short matches early in a generation and then valued long matches (a past request's text repeated) too low
# to be chosen (SmolLM2 with its head: no suffix tree in 40 HumanEval prompts, where a learned one drafted 486). It
# was a constant factor on the score, so a path seen once was worth half a token per node however deep it went:
# on a tool call (Qwen2.5-Coder 1.5B, where a row costs a third of a call), unique 12- to 20-token copies of the
# tool's schema were planned at 6-10 tokens and delivered 0-9 (2.7 a round), 0.86x constrained ar.
SUFFIX_PRIOR_RATE = (0.4, 0.5, 0.6, 0.7)  # c's prior per matched-length bucket (one per SUFFIX_MATCH_EDGES + 1)
SUFFIX_MATCH_EDGES = (3, 6, 12)

ROOT = Tree.chain(0)
CHAINS = [Tree.chain(k) for k in range(65)]


def _reach(c: float, depth: int) -> float:
    """The chance the target follows a path the suffix statistics call certain down to `depth`."""
    return c ** depth


class Planner:
    """The candidate plans of one generation and what they learned. Plans depend only on this generation's
    outcomes and the frozen costs, never on a round's own coins, so every round stays lossless."""

    def __init__(self, max_nodes: int, max_depth: int, max_width: int, lookup_tokens: int, max_ngram: int,
                 suffix_store=None, draft_proposer: str = "draft"):
        self.max_nodes, self.max_depth, self.max_width = max_nodes, max_depth, max_width
        self.draft_proposer = draft_proposer  # who drafts the draft plans: the draft model, or a head ("head")
        self.lookup_tokens = lookup_tokens
        self.draft_acc = Acceptance({1: 0.5, 2: 0.2, 3: 0.12, 4: 0.08})
        self.lookup_acc = Acceptance({1: 0.3, 2: 0.4, 3: 0.5})  # keyed (depth, matched n-gram length)
        self.ngrams = NgramIndex(max_ngram)
        self.suffix = SuffixProposer(suffix_store, depth=suffix_store.depth) if suffix_store is not None \
            else SuffixProposer()
        # per matched-length bucket, decayed sums: steps the target went on along the path, steps it could have
        self.suffix_rate = [[SUFFIX_PRIOR * c, SUFFIX_PRIOR] for c in SUFFIX_PRIOR_RATE[:len(SUFFIX_MATCH_EDGES) + 1]]
        self.suffix_scores: tuple[float, ...] = ()  # the planned suffix tree's scores (learn reads them)
        self.suffix_bucket = 0
        self.pending = 1  # the draft plan's pending count (rounded), read by chains stopped token by token
        self._greedy: tuple[int, list[tuple[int, int]], list[float]] | None = None  # (acceptance version, nodes, reach)
        self._cache: dict = {}

    def state(self) -> dict:
        """What this generation learned of acceptance, as JSON (drafting/auto/memory.py keeps it across them)."""
        return {"draft": self.draft_acc.state(), "lookup": self.lookup_acc.state(),
                "suffix_rate": [list(row) for row in self.suffix_rate]}

    def restore(self, state: dict) -> None:
        """Start from what earlier generations learned (`state`'s layout; a section in another shape is skipped)."""
        for name, acc in (("draft", self.draft_acc), ("lookup", self.lookup_acc)):
            if isinstance(state.get(name), dict):
                acc.restore(state[name])
        rate = state.get("suffix_rate")  # (an older file's "suffix" calibration is another model: skipped)
        if isinstance(rate, list) and len(rate) == len(self.suffix_rate) and all(
                isinstance(row, list) and len(row) == 2 and row[1] > 0 for row in rate):
            self.suffix_rate = [[float(a), float(b)] for a, b in rate]

    def ar(self, costs) -> RoundPlan:
        return RoundPlan(ROOT, "none", label="ar", predicted_tps=1.0 / (costs.t(1) + costs.overhead["round_s"]),
                         expected=1.0, size=1)

    def draft(self, costs, pending: int) -> RoundPlan:
        # pending counted to the next power of two: while auto decodes without its draft (the prompt and every
        # token since stay pending), the plan is recomputed when the catch-up cost doubles, not every round
        pending = 1 << max(0, pending - 1).bit_length()
        self.pending = pending
        key = (self.draft_acc.version, pending, costs.version)
        if self._cache.get("key") == key:
            return self._cache["plan"]
        if self._greedy is None or self._greedy[0] != self.draft_acc.version:  # changes with acceptance only
            rates = self.draft_acc.table(self.max_depth + 1, self.max_width + 1)
            self._greedy = (self.draft_acc.version,
                            *greedy_tree(lambda d, r: rates[d][r], self.max_nodes, self.max_depth, self.max_width))
        _, nodes, reach = self._greedy
        best_n, best_tps, expected = _best_draft_size(costs, nodes, reach, pending, self.max_nodes, self.max_depth)
        tree = to_tree(nodes[:best_n])
        if tree.max_depth == len(tree) - 1:  # a chain: drafted up to max_depth, stopped token by token
            plan = RoundPlan(CHAINS[self.max_depth], self.draft_proposer, label=f"{self.draft_proposer} chain",
                             predicted_tps=best_tps, expected=expected, size=len(tree))
        else:
            plan = RoundPlan(tree, self.draft_proposer, label=f"{self.draft_proposer} tree {len(tree) - 1}",
                             predicted_tps=best_tps, expected=expected, size=len(tree))
        self._cache = {"key": key, "plan": plan}
        return plan

    def lookup(self, costs, history: list[int]) -> RoundPlan | None:
        tokens, n = self.ngrams.propose(history, self.lookup_tokens)
        if not tokens:
            return None
        best_k, best_tps, best_e, expected, reach = 0, -1.0, 1.0, 1.0, 1.0
        rates = self.lookup_acc.table(max(16, len(tokens)), 4)
        for k in range(1, len(tokens) + 1):
            reach *= rates[k][n]
            expected += reach
            tps = expected / (costs.t(k + 1) + costs.overhead["round_s"])
            if tps > best_tps:
                best_k, best_tps, best_e = k, tps, expected
        tree = CHAINS[best_k] if best_k < len(CHAINS) else Tree.chain(best_k)
        return RoundPlan(tree, "lookup", tuple(tokens[:best_k]), label=f"lookup {best_k}", predicted_tps=best_tps,
                         ngram=n, expected=best_e, size=best_k + 1)

    def suffix_tree(self, costs, history: list[int]) -> RoundPlan | None:
        """A suffix tree (drafting/suffix.py), truncated to the depth with the best predicted tokens/s. A node at
        depth d is reached with probability score x c^d (c: the continuation rate learned for this length of the
        matched suffix)."""
        prop = self.suffix.propose(history, self.max_nodes)
        if len(prop.tree) == 1:
            return None
        bucket = sum(prop.match_len >= edge for edge in SUFFIX_MATCH_EDGES)
        c = self.suffix_rate[bucket][0] / self.suffix_rate[bucket][1]
        tree, best, expected = prop.tree, (0, -1.0, 1.0), 1.0
        for d in range(1, tree.max_depth + 1):
            level = tree.level(d)
            expected += _reach(c, d) * sum(prop.scores[level.start:level.stop])
            tps = expected / (costs.t(level.stop) + costs.overhead["round_s"])
            if tps > best[1]:
                best = (d, tps, expected)
        d, tps, expected = best
        sub = tree if d == tree.max_depth else tree.truncate(d)
        self.suffix_scores, self.suffix_bucket = prop.scores[:len(sub)], bucket
        return RoundPlan(sub, "suffix", tuple(prop.tokens[1:len(sub)]), label=f"suffix {len(sub) - 1}",
                         predicted_tps=tps, expected=expected, size=len(sub))

    def learn(self, outcome: RoundOutcome) -> None:
        """What a speculative round's accepted path says of its proposer's acceptance."""
        learn = {"suffix": self._learn_suffix, "lookup": self._learn_ranks, self.draft_proposer: self._learn_ranks}
        learn[outcome.plan.proposer](outcome)

    def _learn_suffix(self, outcome: RoundOutcome) -> None:
        """Along the accepted path, each node with drafted children is a step the target could take: it took it or
        the path ended. A step weighs the children's conditional frequencies (their scores over the node's; 1 where
        the grammar pruned the tree, whose indices are then not the plan's); a round whose tree the grammar pruned
        to its root verified nothing and teaches nothing."""
        tree, path, scores = outcome.tree, outcome.path, self.suffix_scores
        same = len(tree) == len(scores)
        went, could = 0.0, 0.0
        for i, node in enumerate(path):
            children = tree.children[node]
            if not children:
                break
            could += min(1.0, sum(scores[c] for c in children) / scores[node]) if same else 1.0
            went += i + 1 < len(path)
        row = self.suffix_rate[self.suffix_bucket]
        row[0] = DECAY * row[0] + went
        row[1] = DECAY * row[1] + could

    def _learn_ranks(self, outcome: RoundOutcome) -> None:
        """Draft trees: c(depth, rank) along the path; a lookup chain: keyed by (depth, matched n-gram length)."""
        plan, tree, path = outcome.plan, outcome.tree, outcome.path
        acc = self.draft_acc if outcome.draft_calls else self.lookup_acc
        acc.decay()
        for i, node in enumerate(path):
            children = tree.children[node]
            if not children:
                break
            nxt = path[i + 1] if i + 1 < len(path) else None
            for rank, child in enumerate(children, start=1):
                acc.add(i + 1, rank if outcome.draft_calls else plan.ngram, child == nxt)
                if child == nxt:
                    break


def _best_draft_size(costs, nodes, reach, pending: int, max_nodes: int,
                     max_depth: int) -> tuple[int, float, float]:
    """The number of greedy-order nodes with the best predicted tokens/s, that rate and its expected tokens. The first draft forward
    feeds the pending chain (the prompt, when the draft's prefill was deferred, and every token committed since the
    draft last ran); that catch-up is paid once and serves every later round, so it is charged spread over
    CATCH_UP_ROUNDS rounds: charged whole, it made the draft look dearer the longer auto went without it, and at
    T = 1 auto stayed on plain steps where draft chains paid 1.2x."""
    c_draft = [0.0] + [costs.d(n) for n in range(1, max_nodes + 1)]
    c_target = [0.0] + [costs.t(n) for n in range(1, max_nodes + 2)]
    base = costs.d(1) + (costs.d(pending) - costs.d(1)) / CATCH_UP_ROUNDS + costs.overhead["round_s"]
    best_n, best_tps, best_e = 1, -1.0, 1.0
    expected, fed_sum, deepest = 1.0, 0.0, 0
    sizes = [0] * (max_depth + 2)
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
        t = base + fed_sum + c_target[n + 1] + deepest * costs.overhead["level_s"]
        if expected / t > best_tps:
            best_n, best_tps, best_e = n, expected / t, expected
    return best_n, best_tps, best_e


def predicted_tps(plan: RoundPlan) -> float:
    """The predicted tokens/s of a plan the Planner made (it sets it on every plan)."""
    tps = plan.predicted_tps
    if tps is None:
        raise RuntimeError(f"auto: plan {plan.label!r} has no predicted tokens/s")
    return tps
