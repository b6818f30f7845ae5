"""A feature head's draft policy with online adaptation (`eagle:adapt=on`, `auto:head=DIR:adapt=on`,
models/eagle_adapt.py): the method's own policy decides the rounds; this one wraps it and, after the rounds the head
drafted, trains the request's copy of the head on the committed positions' target features.

    prepare   -> a fresh copy of the shared head on the head backend (HeadAdapter), its own optimiser (or, kept
                 for a conversation, the copy the last request left: keep_across_requests); the request's update
                 schedule (drafting/adapt_schedule.py) and prices: a head round's predicted seconds (auto's costs,
                 or the profile's for eagle) and an update's (`update_s`: the profile's, measured once per Decoder
                 by decoding/profiles.adapt_view; without one, this request's first update's)
    plan_round-> the committed tokens so far (prompt + committed) kept for the rows; where auto declined the head
                 only for its updates' charge, the schedule's period doubles
    observe   -> after a round the head drafted (drafted_with_head: auto's lookup, suffix and plain rounds do not
                 count and never update), its committed tokens and predicted seconds to the schedule; when it says
                 so (every `period`-th head round, adapt_every at first, doubling while updates do not pay, then
                 off): training_rows(outcome), the latest committed positions (whichever round committed them:
                 every committed position has the target's feature and law); adapter.update(rows). auto's head
                 plans pay update_s / period a round while adaptation is on (AutoPolicy.draft_charge_s)
    finish    -> the backend drafts with the shared head again; the copy is dropped (or kept, within its bound)
    report    -> {"adapt": {"updates", "rows", "seconds", "period", "off_since", "why", ...}}
                 (stats["eagle"]["adapt"], stats["auto"]["adapt"])

The updates read what verification already decided (committed tokens, the target's features), the schedule reads
committed tokens and predicted (never timed) seconds, and the head changes only between rounds, so the policy's
decisions still read draft-side state only (drafting/protocol.py): the output law stays the target's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from multispec.drafting.adapt_schedule import UpdateSchedule
from multispec.drafting.auto.costs import AloneCosts, AutoView
from multispec.drafting.protocol import DraftPolicy, RoundOutcome, RoundPlan
from multispec.errors import check
from multispec.models.eagle_adapt import AdaptSettings, HeadAdapter, TrainingRows, committed_rows

if TYPE_CHECKING:
    from multispec.models.eagle import FeatureTap


def drafted_with_head(outcome: RoundOutcome) -> bool:
    """Whether the head drafted this round: a plan of the draft backend (the head: eagle's "head", "head-dynamic"
    or "draft" plans, auto's "head" plans) whose draft ran. auto's lookup, suffix and plain ("none") rounds never
    run the head."""
    return outcome.plan.proposer not in ("none", "lookup", "suffix") and outcome.draft_calls > 0


PRICED_NODES = 32  # a head round's prices read the cost curves up to this many nodes (larger trees: the curves')


@dataclass(frozen=True)
class AdaptView(AutoView):
    """auto's view of the machine profile (the pair's costs, the head as the draft: AutoView) and update_s, the
    seconds of one update of the head here (decoding/profiles.adapt_view)."""

    update_s: float | None = None


def update_key(cost_key: str, settings: AdaptSettings) -> str:
    """The profile's "costs" key of an update's seconds: the pair's cost key (target and head, backends, threads,
    CPU: drafting/costs.cost_entry_key) and what an update's cost depends on besides (rows, steps)."""
    return f"{cost_key}||adapt rows={settings.rows} steps={settings.steps}"


def valid_update_entry(entry) -> bool:
    """Whether a profile entry is an update's seconds as adapt_view stores it: {"update_s": 0 <= s < 3600}."""
    s = entry.get("update_s") if isinstance(entry, dict) else None
    return isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and 0 <= s < 3600


class AdaptingPolicy:
    """`inner` (the method's policy) with the head adapted per request. shared: the head the Decoder family read
    once (never written: each request trains a copy of it); settings: lr, steps, rows and every (AdaptSettings);
    update_s: an update's seconds given (tests; None: the profile's, else the request's first update's)."""

    def __init__(self, inner: DraftPolicy, shared, settings: AdaptSettings, update_s: float | None = None):
        self.inner, self.shared, self.settings = inner, shared, settings
        self.fixed_update_s = update_s
        self.view: AutoView | None = None  # the Decoder family's view of the machine profile (use_profile)
        self.schedule = UpdateSchedule(settings.every)  # the request's (prepare)
        self.prices: AloneCosts | None = None  # what prices a head round (None: no costs, the period stays)
        self.update_s: float | None = None  # an update's seconds (None: not known yet)
        self.update_from: str | None = None  # where update_s comes from: "given", "profile" or "first update"
        self.needs_hidden, self.defers_draft_prefill = inner.needs_hidden, inner.defers_draft_prefill
        self.adapter: HeadAdapter | None = None
        self.tap: FeatureTap | None = None  # the request's target backend (prepare's), whose features are the rows
        self.seen: list[int] = []  # prompt + committed tokens when the current round was planned
        self.last: dict | None = None  # the last request's counters
        self.keep: int | None = None  # keep_across_requests' bound (bytes); None: per request
        self.kept: HeadAdapter | None = None  # the copy the last request left, for the next (keep mode)
        self.dropped: str | None = None  # why the kept copy was dropped last (over its bound), for report

    # what the Decoder reads of auto's policy (decoding/profiles.py): the wrapped policy's; eagle's policy (neither)
    # drafts every round with the head and is given the profile's view too, whose costs price its rounds
    proposers = property(lambda self: getattr(self.inner, "proposers", ("draft",)))
    fixed_costs = property(lambda self: getattr(self.inner, "fixed_costs", None))

    def keep_across_requests(self, max_bytes: int) -> None:
        """Conversation scope (`multispec chat --adapt-keep`): the adapted copy and its optimiser state go on from
        one request to the next of this policy (one Decoder: never another's), while they hold at most
        `max_bytes`; a copy over it is dropped at its request's end (the next starts from the shared head)."""
        check(max_bytes > 0, f"the adapted head's bound must be > 0 bytes, got {max_bytes}")
        self.keep = max_bytes

    def keep_estimate(self) -> int:
        """Bytes a kept copy holds: the head's floating-point parameters, and Adam's two moments of each."""
        return 3 * sum(p.numel() * p.element_size() for p in self.shared.parameters() if p.is_floating_point())

    def drop_kept(self) -> None:
        """Forget the kept copy: the next request starts from the shared head again (chat's /reset)."""
        self.kept, self.last, self.dropped = None, None, None

    def reset(self) -> None:
        self.inner.reset()
        self._close()
        self.seen, self.last = [], None

    def prepare(self, target, draft, context_len: int, temperature: float = 0.0) -> None:
        self.inner.prepare(target, draft, context_len, temperature)
        self._close()
        kept, self.kept = self.kept, None
        adapter = kept.attach(draft) if kept is not None else HeadAdapter(self.shared, draft, self.settings)
        self.tap, self.adapter = target, adapter
        self.schedule = UpdateSchedule(self.settings.every)
        costs = getattr(self.inner, "costs", None)  # auto's (the profile's or its fixed ones), else the profile's
        self.prices = costs if isinstance(costs, AloneCosts) else \
            AloneCosts(self.view.costs.fresh(), PRICED_NODES) if self.view is not None and self.view.costs else None
        given, profiled = self.fixed_update_s, getattr(self.view, "update_s", None)
        self.update_s = given if given is not None else profiled
        self.update_from = "given" if given is not None else "profile" if profiled is not None else "first update"
        self._charge()

    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        self.seen = list(history)
        plan = self.inner.plan_round(history, pending)
        if getattr(self.inner, "charge_declined", False):  # auto: the head lost only for the updates' charge
            self.schedule.decline()
            self._charge()
        return plan

    def start_round(self) -> None:
        self.inner.start_round()

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        return self.inner.keep_drafting(depth, parent_hidden, parent_q, new_tokens)

    def observe(self, outcome: RoundOutcome) -> None:
        self.inner.observe(outcome)
        if self.adapter is None or not drafted_with_head(outcome):
            return
        seconds = None if self.prices is None else \
            self.prices.round_time(outcome.tree, outcome.times.pending, True)  # predicted, never timed
        if self.schedule.add(len(outcome.committed), seconds, self.update_s):
            rows = self.training_rows(outcome)
            if rows is not None:
                before = self.adapter.seconds
                self.adapter.update(rows)
                if self.update_s is None:  # no profile entry: this request's first update prices its later ones
                    self.update_s = self.adapter.seconds - before
        self._charge()

    def _charge(self) -> None:
        """auto's head plans pay the amortised update, update_s / period a round, while adaptation is on."""
        if hasattr(self.inner, "draft_charge_s"):
            period, update_s = self.schedule.period, self.update_s
            self.inner.draft_charge_s = update_s / period if period is not None and update_s is not None else 0.0

    def training_rows(self, outcome: RoundOutcome) -> TrainingRows | None:
        """The round's training rows: the latest committed positions, with the target's features the tap kept."""
        if self.tap is None:
            return None
        return committed_rows(self.tap, self.seen + list(outcome.committed), self.settings.rows)

    def finish(self, history: list[int]) -> None:
        self.inner.finish(history)
        self._close()

    def _close(self) -> None:
        """The request's end: the backend drafts with the shared head again; the copy is dropped, or kept for the
        next request (keep mode) while its bytes are within the bound."""
        if self.adapter is not None:
            self.last = self._stats()
            self.adapter.close()
            size = self.adapter.nbytes()
            fits = self.keep is not None and size <= self.keep
            self.kept = self.adapter if fits else None
            self.dropped = None if fits or self.keep is None else \
                f"the adapted head and its optimiser state hold {size} bytes, over the bound of {self.keep}"
            self.adapter = None

    def observation(self) -> dict | None:
        return self.inner.observation()

    def use_profile(self, view) -> None:
        self.view = view
        self.inner.use_profile(view)

    def _stats(self) -> dict:
        assert self.adapter is not None
        return {**self.adapter.stats(), **self.schedule.report(), "update_s": self.update_s,
                "update_s_from": self.update_from, "rounds_priced": self.prices is not None}

    def report(self) -> dict | None:
        stats = self._stats() if self.adapter is not None else self.last
        if stats is not None and self.keep is not None:
            stats = {**stats, "kept": self.kept is not None or self.adapter is not None, "dropped": self.dropped}
        return {**(self.inner.report() or {}), "adapt": stats}
