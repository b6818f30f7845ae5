"""A feature head's draft policy with online adaptation (`eagle:adapt=on`, models/eagle_adapt.py): the method's
own policy decides the rounds; this one wraps it and, after every round, trains the request's copy of the head on
the committed positions' target features.

    prepare   -> a fresh copy of the shared head on the head backend (HeadAdapter), its own optimiser
    plan_round-> the committed tokens so far (prompt + committed) kept for the rows
    observe   -> (after every settings.every-th round) training_rows(outcome): the latest committed positions;
                 adapter.update(rows)
    finish    -> the backend drafts with the shared head again; the copy is dropped
    report    -> {"adapt": {"updates", "rows", "seconds", ...}} (stats["eagle"]["adapt"])

The updates read what verification already decided (committed tokens, the target's features) and change the head
only between rounds, so the policy's decisions still read draft-side state only (drafting/protocol.py): the output
law stays the target's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from multispec.drafting.protocol import DraftPolicy, RoundOutcome, RoundPlan
from multispec.models.eagle_adapt import AdaptSettings, HeadAdapter, TrainingRows, committed_rows

if TYPE_CHECKING:
    from multispec.models.eagle import FeatureTap


class AdaptingPolicy:
    """`inner` (the method's policy) with the head adapted per request. shared: the head the Decoder family read
    once (never written: each request trains a copy of it); settings: lr, steps and rows (AdaptSettings)."""

    def __init__(self, inner: DraftPolicy, shared, settings: AdaptSettings):
        self.inner, self.shared, self.settings = inner, shared, settings
        self.needs_hidden, self.defers_draft_prefill = inner.needs_hidden, inner.defers_draft_prefill
        self.adapter: HeadAdapter | None = None
        self.tap: FeatureTap | None = None  # the request's target backend (prepare's), whose features are the rows
        self.seen: list[int] = []  # prompt + committed tokens when the current round was planned
        self.rounds = 0  # rounds observed in this request (an update after every settings.every-th)
        self.last: dict | None = None  # the last request's counters

    def reset(self) -> None:
        self.inner.reset()
        self._close()
        self.seen, self.last = [], None

    def prepare(self, target, draft, context_len: int, temperature: float = 0.0) -> None:
        self.inner.prepare(target, draft, context_len, temperature)
        self._close()
        self.tap, self.adapter, self.rounds = target, HeadAdapter(self.shared, draft, self.settings), 0

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
        if self.adapter is not None:
            self.last = self.adapter.stats()
            self.adapter.close()
            self.adapter = None

    def observation(self) -> dict | None:
        return self.inner.observation()

    def use_profile(self, view) -> None:
        self.inner.use_profile(view)

    def report(self) -> dict | None:
        stats = self.adapter.stats() if self.adapter is not None else self.last
        return {**(self.inner.report() or {}), "adapt": stats}
