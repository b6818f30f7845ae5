"""When an adapting head updates (drafting/adapting.py): after every `period`-th round the head drafted. The period
starts at adapt_every and doubles while the updates do not pay for themselves, up to CAP_DOUBLINGS doublings; past
that, adaptation is off until acceptance falls by what an update would repay.

A window is the head rounds from one update to the next (while off: `cap` head rounds). At a window's end:

    gain  = tokens per head round in this window - in the window before, plus one standard error of that
            difference (the benefit of the doubt: tokens per round vary by about one token from round to round, so two
            windows of 8 rounds differ by about +- 0.5 by chance, and without the allowance noise alone would double
            the period in most windows where the updates do pay)
    price = update_s / (rounds x predicted seconds per committed token): the tokens per head round an update must
            add over the window's rounds to repay its seconds (auto charges a head round update_s / period: the
            same price)
    gain >= 2 price: the period halves (not below adapt_every); gain >= price: it stays; else it doubles (past
    the cap: off). While off, gain = how far tokens per head round fell since the window adaptation went off in
    (plus its standard error): once an update would repay that at the cap period, adaptation is on again at the
    cap period, with an update at once.

`decline` (auto chose another plan where the head's would have won without its updates' charge) doubles the
period too: the updates must cost less per round for the head to draft at all.

Only committed outcomes go in (the tokens each head round committed, what verification decided) and the rounds'
predicted seconds (the machine profile's costs, never a timing of the request), so identical seeded requests
decide alike and the output law stays the target's. An update that costs nothing always pays; without a price (no
costs, no update seconds yet) the period stays adapt_every.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

CAP_DOUBLINGS = 4  # the longest period: adapt_every x 16 (8 -> 128 head rounds between updates), then off


@dataclass
class Window:
    """Head rounds since the last update: how many, the tokens they committed, their predicted seconds."""

    rounds: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def mean(self) -> float:
        return self.tokens / self.rounds


class UpdateSchedule:
    """One request's update period. `add` each head round's outcome; it says when the head updates."""

    def __init__(self, every: int):
        self.every, self.cap = every, every << CAP_DOUBLINGS
        self.period: int | None = every  # head rounds between updates; None: off
        self.window = Window()  # the current window
        self.before: Window | None = None  # the one its gain is measured against
        self.rounds, self._last, self._sq = 0, 0, 0.0  # head rounds; the last one's tokens; Σ (tokens - last)²
        self.off_since: int | None = None  # the head round adaptation last went off at (None: on)
        self.why = "adapt_every"
        self.changes: list[tuple[int, int | None]] = []  # (head round, new period or None: off)

    def add(self, tokens: int, seconds: float | None, update_s: float | None) -> bool:
        """One round the head drafted: the tokens it committed (accepted + 1), its predicted seconds (None: no
        costs) and an update's seconds (None: not known yet). Returns whether the head updates now."""
        self._sq += (tokens - self._last) ** 2 if self.rounds else 0
        self.rounds, self._last = self.rounds + 1, tokens
        w = self.window
        w.rounds, w.tokens, w.seconds = w.rounds + 1, w.tokens + tokens, w.seconds + (seconds or 0.0)
        if w.rounds < (self.period or self.cap):
            return False
        self.window = Window()
        if self.before is None or seconds is None or update_s is None:  # the first window (the frozen head's),
            self.before = w  # or nothing to price it with
            return self.period is not None
        if self.period is None:
            return self._after_off(w, update_s)
        gain, price = self._gain(w), self._price(update_s, w)
        self.before = w
        if update_s <= 0 or gain >= 2 * price:
            if self.period > self.every:
                self._set(self.period // 2, f"the updates paid twice over ({gain:.3f} >= 2 x {price:.3f} "
                                            "tokens per head round)")
        elif gain < price:
            self._double(f"the last update gained {gain:.3f} < {price:.3f} tokens per head round, its price")
        return self.period is not None

    def decline(self) -> None:
        """auto chose another plan where the head's would have won without the updates' charge: double."""
        if self.period is not None:
            self._double("auto declined the head for its updates' charge")

    def _after_off(self, w: Window, update_s: float) -> bool:
        """A window while off: on again (at the cap period, updating now) once tokens per head round fell by what
        an update at the cap period repays."""
        assert self.before is not None
        fall, price = self.before.mean - w.mean + self._error(w), self._price(update_s, w)
        if fall < price:
            return False
        self.before = w
        self._set(self.cap, f"tokens per head round fell by {fall:.3f} >= {price:.3f}, an update's price")
        return True

    def _gain(self, w: Window) -> float:
        """Tokens per head round w gained over the window before, with one standard error in its favour."""
        assert self.before is not None
        return w.mean - self.before.mean + self._error(w)

    def _price(self, update_s: float, w: Window) -> float:
        """Tokens per head round an update must add over w's rounds to repay update_s (w's seconds per token)."""
        per_token = w.seconds / w.tokens
        return update_s / (w.rounds * per_token) if per_token > 0 else math.inf

    def _error(self, w: Window) -> float:
        """One standard error of the difference of w's mean and the window before's. The variance of tokens per
        round is the request's mean squared successive difference over 2 (von Neumann's): a rise of acceptance from
        window to window, which it is to detect, hardly counts in it, as it would in the plain variance."""
        assert self.before is not None
        var = self._sq / (2 * (self.rounds - 1)) if self.rounds > 1 else 0.0
        return math.sqrt(var * (1 / w.rounds + 1 / self.before.rounds))

    def _double(self, why: str) -> None:
        assert self.period is not None
        self._set(self.period * 2 if self.period < self.cap else None, why)

    def _set(self, period: int | None, why: str) -> None:
        if period is None and self.period is not None:
            self.off_since = self.rounds
        elif period is not None:
            self.off_since = None
        self.period, self.why = period, why
        self.changes.append((self.rounds, period))

    def report(self) -> dict:
        return {"period": self.period, "off_since": self.off_since, "why": self.why, "head_rounds": self.rounds,
                "changes": [list(c) for c in self.changes]}
