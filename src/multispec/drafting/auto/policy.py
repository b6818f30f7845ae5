"""`AutoPolicy`: every round, the candidate plan (drafting/auto/plans.py) with the most expected committed tokens
per second over this sequence's cost view (drafting/auto/costs.py), with back-offs and probes.

When no speculation wins, cheap probes (the best speculative plan, after 8, 16, 32 ... 256 plain rounds, a
schedule carried in the profile) keep the estimates alive so that auto can switch back.

auto plans from a view of the machine profile (`use_profile`, multispec/profile.py) and its own rounds' acceptance,
never from its timings: identical seeded generations plan alike. What it observed comes back from `observation()`
for a new profile (decoding/profiles.py). `report` only reads.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

import multispec.drafting.auto.memory as acceptance_memory
from multispec.drafting.auto.acceptance import ConfidenceRates, RealisedRates
from multispec.drafting.auto.costs import AloneCosts, AutoView
from multispec.drafting.auto.plans import Planner
from multispec.drafting.auto.plans import predicted_tps as _tps
from multispec.drafting.costs import CostModel, measure_costs
from multispec.drafting.protocol import DraftPolicyBase, RoundOutcome, RoundPlan

PROBE_PERIODS = (8, 16, 32, 64, 128, 256)
MARGIN = 0.03  # speculate only when predicted to beat a plain step by this much
QUIET_MAX = 8  # alone: at most this many plain steps in a row without weighing the plans
# A probe of a draft plan runs only while the draft's catch-up (the deferred prompt and every plain step since it
# last ran) costs at most this many plain target steps. Measured (Gemma 3 drafted by SmolLM2, T = 1, a long
# Spec-Bench prompt): a probe whose forward fed the deferred draft prefill took 4.6 s for 2 tokens, ~45 plain steps.
# A plan chosen on its merits still may (in a batch the engine weighs the catch-up against the step: batch_plan.py).
PROBE_CATCH_UP = 4


def family(plan: RoundPlan) -> str:
    """A plan's family for RealisedRates: "ar", "draft chain", "draft tree", "head chain", "lookup", "suffix"."""
    words = plan.label.removesuffix(" (probe)").split(" ")
    return " ".join(words[:2]) if plan.proposer not in ("lookup", "suffix", "none") else words[0]


class Charged:
    """A cost view with `charge_s` more seconds in every round (AloneCosts' t, d and overhead): what auto prices its
    draft plans with while each of their rounds pays a share of an adapting head's updates (drafting/adapting.py)."""

    def __init__(self, costs: AloneCosts, charge_s: float):
        self.t, self.d, self.version = costs.t, costs.d, (costs.version, charge_s)  # (plans cached on version)
        self.overhead = {**costs.overhead, "round_s": costs.overhead["round_s"] + charge_s}


class AutoPolicy(DraftPolicyBase):
    """proposers: which proposers may be used ("draft", "lookup", "suffix"). cost_model: fixed costs (tests);
    None: the profile's (`use_profile`; without one, measured when the generation starts, for a caller of the
    engine without a Decoder). draft_proposer: the registered proposer of the "draft" plans (the draft model's, or
    "head": a feature head's, method auto with head=DIR). memory: start from the profile's acceptance priors."""

    defers_draft_prefill = True  # a generation that never drafts never pays the draft's prefill

    def __init__(self, proposers=("draft", "lookup"), max_nodes: int = 32, max_depth: int = 12,
                 max_width: int = 4, lookup_tokens: int = 10, max_ngram: int = 3,
                 cost_model: CostModel | None = None, suffix_store=None, draft_proposer: str = "draft",
                 memory: bool = True):
        self.proposers = tuple(proposers)
        self.shape = dict(max_nodes=max_nodes, max_depth=max_depth, max_width=max_width,
                          lookup_tokens=lookup_tokens, max_ngram=max_ngram)
        self.draft_proposer = draft_proposer
        self.fixed_costs = cost_model
        self.suffix_store = suffix_store  # "suffix": the store of past requests shared by the Decoder family
        self.memory = memory  # acceptance statistics kept across generations (drafting/auto/memory.py)
        self.view: AutoView | None = None
        # seconds added to every draft plan's round: an adapting head's amortised update (drafting/adapting.py sets
        # it); charge_declined: the last weighed round chose another plan where the draft's would win without it
        self.draft_charge_s, self.charge_declined = 0.0, False
        self.reset()

    def reset(self) -> None:
        self.planner = Planner(**self.shape, suffix_store=self.suffix_store, draft_proposer=self.draft_proposer)
        self.costs: AloneCosts | None = (
            AloneCosts(self.fixed_costs, self.shape["max_nodes"]) if self.fixed_costs is not None else None)
        self.confidence = ConfidenceRates()
        self.realised_rates = RealisedRates()
        self.round_conf: list[float] = []
        self.has_draft = False
        self.current: RoundPlan | None = None
        self.ar_streak = self.probe_level = 0
        self._suffix_skip = self._suffix_backoff = 0
        self._skip = self._backoff = 0
        self.usage: Counter = Counter()
        self.realised: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])  # tokens, s, pred tps, n
        self.stored_overhead: dict | None = None
        self.memory_key: str | None = None  # set by prepare when memory is on
        self.realised_prior = RealisedRates()  # the profile's factors: what plans are scored with (frozen)
        self._observation: dict | None = None

    def use_profile(self, view: AutoView) -> None:
        """Plan from this view of the machine profile (the Decoder builds it once)."""
        self.view = view

    def prepare(self, target, draft, context_len: int, temperature: float = 0.0) -> None:
        self.has_draft = draft is not None and "draft" in self.proposers
        if self.memory and self.view is not None:  # the profile's acceptance for this pair and temperature
            self.memory_key = acceptance_memory.recall(self, self.view, temperature, len(PROBE_PERIODS))
        if self.fixed_costs is None:
            model = self.view.costs.fresh() if self.view is not None and self.view.costs is not None else \
                measure_costs(target, getattr(target, "model", target), draft if self.has_draft else None,
                              getattr(draft, "model", draft) if self.has_draft else None)[0]  # (no Decoder)
            self.costs = AloneCosts(model, self.shape["max_nodes"])

    def _costs(self) -> AloneCosts:  # set by reset with fixed costs, else by prepare
        if self.costs is None:
            raise RuntimeError("auto: no costs yet (prepare() runs before the first round)")
        return self.costs

    def _draft_costs(self) -> AloneCosts | Charged:
        """The costs a draft plan is priced with: with draft_charge_s more seconds a round, where there is one."""
        return Charged(self._costs(), self.draft_charge_s) if self.draft_charge_s else self._costs()

    # ------------------------------------------------------------------ planning
    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        costs, planner = self._costs(), self.planner
        self.charge_declined = False
        if self._skip > 0:  # see below: a plain step without weighing the others
            self._skip -= 1
            self.ar_streak += 1  # towards the next probe, as an evaluated plain step
            self.current = planner.ar(costs)
            return self.current
        ar = planner.ar(costs)
        candidates = [p for p in (planner.draft(self._draft_costs(), pending) if self.has_draft else None,
                                  planner.lookup(costs, history) if "lookup" in self.proposers else None,
                                  self._suffix_plan(history, ar)) if p is not None]
        score = self._scorer()
        best = max(candidates, key=score, default=ar)
        if score(best) < score(ar) * (1 + MARGIN):
            best = ar
        if self.draft_charge_s and self.has_draft and best.proposer != self.draft_proposer:  # lost for the charge?
            free = planner.draft(costs, pending)
            self.charge_declined = score(free) >= score(best) * (1 + MARGIN if best is ar else 1)
        self.current = self._probe_or(best, candidates, score)
        # after a plain step chosen on its merits, the next 1, 2, 4, 8 are taken unweighed (weighing costs ~0.3 ms
        # of Python, 3 % of a pycode-v1 step, on every round of a back-off)
        if self.current is ar:
            self._backoff = min(QUIET_MAX, max(1, 2 * self._backoff))
            self._skip = self._backoff
        else:
            self._backoff = 0
        return self.current

    def _suffix_plan(self, history: list[int], ar: RoundPlan) -> RoundPlan | None:
        """A suffix proposal costs ~0.05-0.5 ms of Python: after one that loses to a plain step, the next 1, 2,
        4 ... 16 rounds' proposals are skipped (sampling at T > 0 rarely repeats the context)."""
        if "suffix" not in self.proposers:
            return None
        if self._suffix_skip > 0:
            self._suffix_skip -= 1
            return None
        plan = self.planner.suffix_tree(self.costs, history)
        if plan is not None:
            if _tps(plan) < _tps(ar):
                self._suffix_backoff = min(16, max(1, 2 * self._suffix_backoff))
                self._suffix_skip = self._suffix_backoff
            else:
                self._suffix_backoff = 0
        return plan

    def _scorer(self):
        """A plan's predicted tokens/s times its family's predicted / realised seconds, with measured costs (fixed
        costs are not this machine's)."""
        if self.fixed_costs is not None:
            return _tps
        return lambda plan: _tps(plan) * self.realised_prior.factor(family(plan))

    def _probe_or(self, best: RoundPlan, speculative: list[RoundPlan], score=_tps) -> RoundPlan:
        """`best`, or, after a streak of plain steps as long as the probe period, the best speculative plan, to
        keep its estimates current (in a batch the engine may answer a probe with a plain step, as any plan)."""
        if best.tree.max_depth > 0 or not speculative:  # (a lookup or suffix plan tells nothing of the draft)
            if not speculative or best.proposer == self.draft_proposer or not self.has_draft:
                self.ar_streak = 0
                if best.tree.max_depth > 0:
                    self.probe_level = 0
            return best
        self.ar_streak += 1
        due = [p for p in speculative if self.ar_streak >= self._probe_period(p) and self._cheap_probe(p)]
        if not due:
            return best  # (the streak goes on: a lookup or suffix probe as soon as one is proposed)
        spec = max(due, key=score)
        self.ar_streak = 0
        self.probe_level += 1
        return replace(spec, label=spec.label + " (probe)")

    def _probe_period(self, plan: RoundPlan) -> int:
        """Plain rounds in a row before `plan` is probed: the period of this level."""
        return PROBE_PERIODS[min(self.probe_level, len(PROBE_PERIODS) - 1)]

    def _cheap_probe(self, plan: RoundPlan) -> bool:
        """Whether probing `plan` costs at most a few plain steps: not a draft plan with a long catch-up."""
        return plan.proposer != self.draft_proposer or self._short_catch_up(self.planner.pending)

    def _short_catch_up(self, pending: int) -> bool:
        """Whether the draft's forward over `pending` tokens costs at most PROBE_CATCH_UP plain steps."""
        c = self._costs()
        return c.d(pending) - c.d(1) <= PROBE_CATCH_UP * c.t(1)

    # ------------------------------------------------------------------ chains stopped token by token
    def start_round(self) -> None:
        self.round_conf = []

    def keep_drafting(self, depth, parent_hidden, parent_q, new_tokens=None) -> bool:
        """Draft chains: after each draft token, draft one more only if that raises the expected committed tokens
        per second, with the newest token's acceptance estimated from the draft's own probability of it
        (ConfidenceRates). Reads draft-side state only, so the round stays lossless."""
        plan = self.current
        if plan is None or len(plan.tree) - 1 != plan.tree.max_depth:
            return True  # trees: drafted whole
        conf = float(parent_q[0, new_tokens[0]])
        self.round_conf.append(conf)
        reach, expected = 1.0, 1.0
        for cf in self.round_conf:
            reach *= self.confidence.rate(cf)
            expected += reach
        c = self._draft_costs()
        o = c.overhead
        t_now = (c.d(self.planner.pending) + (depth - 1) * c.d(1) + c.t(depth + 1) + o["round_s"]
                 + depth * o["level_s"])
        nxt = self.confidence.rate(conf)  # confidence is persistent: the next token looks like this one
        t_next = t_now + c.d(1) + c.t(depth + 2) - c.t(depth + 1) + o["level_s"]
        return (expected + reach * nxt) / t_next > expected / t_now

    # ------------------------------------------------------------------ learning
    def observe(self, outcome: RoundOutcome) -> None:
        plan, tree, path = outcome.plan, outcome.tree, outcome.path
        key = plan.label.removesuffix(" (probe)")
        self.usage[key] += 1
        row = self.realised[key]
        row[0] += len(path)  # accepted nodes + the token that ends the round
        row[1] += outcome.times.round_s
        row[2] += plan.predicted_tps or 0.0
        row[3] += 1
        costs = self._costs()
        if outcome.times.shared == 1:  # (a batched round's times are the batch's: decoding/batch_plan.py prices it)
            predicted = costs.round_time(tree, outcome.times.pending, outcome.draft_calls > 0, outcome.times.ahead)
            self.realised_rates.add(family(plan), predicted, outcome.times.round_s)
            costs.observe(outcome)
        if len(tree) == 1:
            return
        self.planner.learn(outcome)
        if outcome.draft_calls and self.round_conf:  # draft chains: acceptance by the draft's confidence
            self.confidence.add_round(self.round_conf, len(path))

    def finish(self, history: list[int]) -> None:
        """Store the request for later suffix proposals; note what this generation observed (`observation`)."""
        if "suffix" in self.proposers and self.suffix_store is not None:
            self.suffix_store.add(None, list(history))
        obs: dict = {}
        if self.memory_key is not None:
            obs["acceptance"] = {self.memory_key: acceptance_memory.seen(self, len(PROBE_PERIODS))}
        if isinstance(self.costs, AloneCosts) and self.costs.round_log:  # (rounds it decoded alone)
            self.stored_overhead = self.costs.fitted_overhead()
            model = self.costs.model
            if model.key:
                obs["costs"] = {model.key: {"timed": model.timed(), "overhead": self.stored_overhead}}
        self._observation = obs or None

    def observation(self) -> dict | None:
        """The last generation's {"acceptance": {key: statistics}, "costs": {key: {"timed", "overhead"}}}, taken
        once (decoding/profiles.Observations)."""
        obs, self._observation = self._observation, None
        return obs

    def report(self) -> dict:
        plans = {}
        for key, (tokens, secs, pred, n) in sorted(self.realised.items(), key=lambda kv: -kv[1][3]):
            plans[key] = {"rounds": n, "tokens": int(tokens),
                          "realised_tokens_per_s": tokens / secs if secs > 0 else None,
                          "predicted_tokens_per_s": pred / n if n else None}
        costs = self.costs
        return {"plans": plans, "costs": None if costs is None else costs.model.summary(),
                "overhead": dict(self.stored_overhead or (costs.overhead if costs is not None else {})),
                "cost_correction": dict(costs.scale) if costs is not None else {},
                "realised_factor": {f: self.realised_rates.factor(f) for f in self.realised_rates.rows}}
