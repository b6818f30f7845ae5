"""A feature head that keeps learning while it drafts (`eagle:adapt=on`, issue 67): online distillation from the
verification the target computes anyway.

After a round the target's cache holds the committed positions only, and the feature tap (models/eagle.FeatureTap)
holds the target's feature f_t at each of them: what verification computed. The latest committed positions are the
head's training rows, the same rows `multispec train-head` trains on: the committed token x_t, the feature of the
position before it (the head's input) and the target's law there, p_t = softmax(lm_head(f_t)) (the loss computes it
from f_t: models/eagle.head_loss, shared with training/eagle.py). `committed_rows` builds them; `HeadAdapter` runs a
few optimiser steps on them between rounds.

    adapter = HeadAdapter(shared_head, head_backend, AdaptSettings(lr=1e-4, rows=32, every=8))  # the request's
    after every 8th round: adapter.update(committed_rows(tap, tokens, 32))                       # copy, trained
    at the request's end:  adapter.close()             # the backend drafts with the shared head again

The defaults (lr 1e-4, one Adam step on the latest 32 committed positions after every 8th round) come from one
SmolLM2-135M-Instruct prompt with the shipped head, 512 greedy tokens on a shared core: mean acceptance length
2.38 frozen, 2.70 adapted; one update cost about as much as a target forward there, so updating after every round
(2.64) did not pay. benchmarks/eagle/adapt_long.py measures long outputs.

Lossless: the target is never changed (its parts take no gradient: `torch.autograd.grad` over the copy's own
parameters only), and an update runs between rounds, so every round's drafts are drawn from the q the verifier is
given; a head only moves acceptance (models/eagle.py). Per request: the copy is made from the shared head when the
request starts and dropped when it ends; the shared head (the Decoder family's, read once) is never written. The
head's cached rows of earlier positions keep the keys and values the weights of their time computed: a later
draft attends to them as they are (which moves acceptance only), instead of recomputing the whole context.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from multispec.errors import check
from multispec.models.base import sync

if TYPE_CHECKING:  # (transformers: imported when a head is, not when the method's options are checked)
    from multispec.models.eagle import EagleHead, FeatureTap, HeadBackend

MAX_STEPS = 16  # adapt_steps' bound: the optimiser steps one update may take
MAX_ROWS = 4096  # adapt_rows' bound
MAX_EVERY = 1024  # adapt_every's bound


@dataclass(frozen=True)
class AdaptSettings:
    """lr: Adam's learning rate; steps: optimiser steps per update; rows: the latest committed positions each step
    trains on (the newest rounds' among them); every: rounds between updates (an update after every `every`-th
    round: its cost shared by that many rounds)."""

    lr: float = 1e-4
    steps: int = 1
    rows: int = 32
    every: int = 8

    def __post_init__(self) -> None:
        check(isinstance(self.lr, (int, float)) and not isinstance(self.lr, bool) and 0 < self.lr <= 1,
              f"adapt_lr must be a learning rate in (0, 1], got {self.lr!r}")
        for name, v, hi in (("adapt_steps", self.steps, MAX_STEPS), ("adapt_rows", self.rows, MAX_ROWS),
                            ("adapt_every", self.every, MAX_EVERY)):
            check(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= hi,
                  f"{name} must be an integer in [1, {hi}], got {v!r}")


@dataclass(frozen=True)
class TrainingRows:
    """Committed positions a .. b-1 as training rows. tokens: long [1, L] (x_a .. x_{b-1}); features: float32
    [1, L, H], the target's feature at each (the tap's rows a .. b-1); before: float32 [1, H], the target's feature
    at a - 1, or None at a = 0 (the text's start: zeros)."""

    tokens: torch.Tensor
    features: torch.Tensor
    before: torch.Tensor | None

    @property
    def count(self) -> int:
        return int(self.tokens.shape[1])


def committed_rows(tap: FeatureTap, tokens: list[int], rows: int) -> TrainingRows | None:
    """The latest `rows` positions that have a target feature (the tap's rows 0 .. cache_len - 1, between rounds
    exactly the committed positions), tokens[t] the token at position t (prompt + committed; the newest committed
    token, which the target has not consumed yet, has no feature and is not a row). None: no such position."""
    end = tap.cache_len
    check(len(tokens) >= end, f"adaptation: {len(tokens)} tokens for {end} committed positions")
    start = max(0, end - rows)
    if end <= start:
        return None
    hidden = tap.hidden  # float32 [cache_len, H]
    with torch.inference_mode(False):  # plain tensors (the tap's may be inference tensors), which autograd may save
        return TrainingRows(torch.tensor(tokens[start:end], dtype=torch.long)[None], hidden[start:end].clone()[None],
                            hidden[start - 1:start].clone() if start else None)


class HeadAdapter:
    """One request's copy of the head, installed on its HeadBackend until `close`, and the optimiser over the copy's
    parameters (Adam, its state the request's too). update(rows) runs settings.steps steps of head_loss on `rows`;
    its counters (updates, rows, seconds) are what the request reports (`stats`)."""

    def __init__(self, shared: EagleHead, backend: HeadBackend, settings: AdaptSettings):
        self.shared, self.backend, self.settings = shared, backend, settings
        self.head = copy_head(shared)
        self.params = [p for p in self.head.parameters() if p.is_floating_point()]
        self.opt = torch.optim.Adam(self.params, lr=settings.lr)
        self.parts = loss_parts(backend)
        backend.head = self.head
        self.updates, self.rows, self.seconds, self.requests = 0, 0, 0.0, 1

    def update(self, rows: TrainingRows) -> None:
        """settings.steps optimiser steps on `rows` (on the copy; the target's parts take no gradient)."""
        from multispec.models.eagle import head_loss

        t0 = time.perf_counter()
        device = next(self.head.parameters()).device
        tokens, feats = rows.tokens.to(device), rows.features.to(device, self.backend.dtype)
        before = None if rows.before is None else rows.before.to(device, self.backend.dtype)
        with torch.inference_mode(False), torch.enable_grad():
            for _ in range(self.settings.steps):
                loss, _, _ = head_loss(self.head, self.parts, tokens, feats, None, 1, before)
                grads = torch.autograd.grad(loss, self.params)  # the copy's parameters only
                for p, g in zip(self.params, grads):
                    p.grad = g
                self.opt.step()
        self.updates += 1
        self.rows += rows.count * self.settings.steps
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        """The request is over: the backend drafts with the shared head again; the copy is dropped with this (or
        kept by a conversation's policy for its next request: attach)."""
        self.backend.head = self.shared

    def attach(self, backend: HeadBackend) -> HeadAdapter:
        """The next request of a conversation: the copy (its optimiser state too) drafts on `backend` again."""
        self.backend, self.parts = backend, loss_parts(backend)
        backend.head = self.head
        self.requests += 1
        return self

    def nbytes(self) -> int:
        """Bytes the copy holds beyond the shared head: its parameters and the optimiser's state."""
        state = [t for s in self.opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in [*self.head.parameters(), *state])

    def stats(self) -> dict:
        return {"updates": self.updates, "rows": self.rows, "seconds": self.seconds, "lr": self.settings.lr,
                "steps": self.settings.steps, "window": self.settings.rows, "every": self.settings.every,
                "requests": self.requests}


def time_update(shared: EagleHead, backend: HeadBackend, settings: AdaptSettings, reps: int = 3) -> float:
    """Seconds of one update here: settings.steps steps on settings.rows rows of random tokens and features (an
    update's cost depends on their shapes, not their values), by a copy of `shared` installed on `backend` for the
    while; the fastest of `reps` after an untimed one (Adam's first step makes its state). What the machine profile
    keeps as the update's cost (decoding/profiles.py); `backend` drafts with `shared` again after."""
    g, n, hidden = torch.Generator().manual_seed(0), settings.rows, backend.hidden_size
    with torch.inference_mode(False):  # plain tensors, which autograd may save
        rows = TrainingRows(torch.randint(0, int(backend.vocab_size), (1, n), generator=g),
                            torch.randn(1, n, hidden, generator=g), torch.randn(1, hidden, generator=g))
    adapter = HeadAdapter(shared, backend, settings)
    try:
        adapter.update(rows)
        best = float("inf")
        for _ in range(reps):
            sync(backend.device)  # (the timer counts the work, not its launch)
            t0 = time.perf_counter()
            adapter.update(rows)
            sync(backend.device)
            best = min(best, time.perf_counter() - t0)
        return best
    finally:
        adapter.close()


def loss_parts(backend: HeadBackend):
    """The target's parts the loss reads (models/eagle.TargetParts): the backend's, with the output layer cut once
    to the rows of the head's reduced vocabulary where it has one (p and q over those rows, as train-head trains)."""
    from dataclasses import replace

    parts, subset = backend.parts, backend.vocab_subset
    if subset is None:
        return parts
    with torch.inference_mode(False):
        rows = torch.nn.Linear(1, 1, bias=False)
        w = parts.lm_head.weight.detach().index_select(0, subset.ids.to(parts.lm_head.weight.device))  # [V', H]
        rows.weight = torch.nn.Parameter(w, requires_grad=False)
    return replace(parts, lm_head=rows)


def copy_head(shared: EagleHead) -> EagleHead:
    """A trainable copy of the shared head (its parameters its own; the shared head untouched)."""
    head = copy.deepcopy(shared)
    for p in head.parameters():
        p.requires_grad_(True)
    return head.eval()
