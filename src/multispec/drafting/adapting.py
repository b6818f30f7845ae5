"""A feature head's draft policy with online adaptation (`eagle:adapt=on`, `auto:head=DIR:adapt=on`,
models/eagle_adapt.py): the method's own policy decides the rounds; this one wraps it and, after the rounds the head
drafted, trains the request's copy of the head on the committed positions' target features.

    prepare   -> a fresh copy of the shared head on the head backend (HeadAdapter), its own optimiser (or, kept
                 for a conversation, the copy the last request left: keep_across_requests)
    plan_round-> the committed tokens so far (prompt + committed) kept for the rows
    observe   -> after every settings.every-th round the head drafted (drafted_with_head: auto's lookup, suffix
                 and plain rounds do not count and never update): training_rows(outcome), the latest committed
                 positions (whichever round committed them: every committed position has the target's feature and
                 law); adapter.update(rows)
    finish    -> the backend drafts with the shared head again; the copy is dropped (or kept, within its bound)
    report    -> {"adapt": {"updates", "rows", "seconds", ...}} (stats["eagle"]["adapt"], stats["auto"]["adapt"])

The updates read what verification already decided (committed tokens, the target's features) and change the head
only between rounds, so the policy's decisions still read draft-side state only (drafting/protocol.py): the output
law stays the target's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

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


class AdaptingPolicy:
    """`inner` (the method's policy) with the head adapted per request. shared: the head the Decoder family read
    once (never written: each request trains a copy of it); settings: lr, steps and rows (AdaptSettings)."""

    def __init__(self, inner: DraftPolicy, shared, settings: AdaptSettings):
        self.inner, self.shared, self.settings = inner, shared, settings
        self.needs_hidden, self.defers_draft_prefill = inner.needs_hidden, inner.defers_draft_prefill
        self.adapter: HeadAdapter | None = None
        self.tap: FeatureTap | None = None  # the request's target backend (prepare's), whose features are the rows
        self.seen: list[int] = []  # prompt + committed tokens when the current round was planned
        self.rounds = 0  # rounds the head drafted in this request (an update after every settings.every-th)
        self.last: dict | None = None  # the last request's counters
        self.keep: int | None = None  # keep_across_requests' bound (bytes); None: per request
        self.kept: HeadAdapter | None = None  # the copy the last request left, for the next (keep mode)
        self.dropped: str | None = None  # why the kept copy was dropped last (over its bound), for report

    # what the Decoder reads of auto's policy (decoding/profiles.py): the wrapped policy's
    proposers = property(lambda self: getattr(self.inner, "proposers", ()))
    fixed_costs = property(lambda self: getattr(self.inner, "fixed_costs", False))

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
        self.tap, self.adapter, self.rounds = target, adapter, 0

    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        self.seen = list(history)
        return self.inner.plan_round(history, pending)

    def start_round(self) -> None:
        self.inner.start_round()

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        return self.inner.keep_drafting(depth, parent_hidden, parent_q, new_tokens)

    def observe(self, outcome: RoundOutcome) -> None:
        self.inner.observe(outcome)
        if not drafted_with_head(outcome):
            return
        self.rounds += 1
        if self.adapter is None or self.rounds % self.settings.every:
            return
        rows = self.training_rows(outcome)
        if rows is not None:
            self.adapter.update(rows)

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
            self.last = self.adapter.stats()
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
        self.inner.use_profile(view)

    def report(self) -> dict | None:
        stats = self.adapter.stats() if self.adapter is not None else self.last
        if stats is not None and self.keep is not None:
            stats = {**stats, "kept": self.kept is not None or self.adapter is not None, "dropped": self.dropped}
        return {**(self.inner.report() or {}), "adapt": stats}
