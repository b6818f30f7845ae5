"""Streamed text that never runs past a stop string, and always adds up to the final text."""
from __future__ import annotations


class StopHoldback:
    """Passes streamed text deltas through, cut at the first stop string, holding back any tail that could be the
    start of one (so a stop string split across rounds is never half-sent). `finish(final_text)` returns what is
    left to send so that the deltas concatenated equal the library's final text."""

    def __init__(self, stops: list[str] | None):
        self.stops = stops or []
        self.buffer = ""  # everything the generation streamed
        self.sent = 0  # characters of `buffer` already passed on
        self.stopped = False

    def push(self, delta: str) -> str:
        if self.stopped:
            return ""
        self.buffer += delta
        cuts = [self.buffer.find(s) for s in self.stops if s in self.buffer]
        if cuts:
            limit, self.stopped = min(cuts), True
        else:
            limit = len(self.buffer) - self._partial_stop_tail()
        out = self.buffer[self.sent:limit] if limit > self.sent else ""
        self.sent = max(self.sent, limit)
        return out

    def finish(self, final_text: str) -> str:
        """The rest of final_text after what was sent. Sent text is always a prefix of the final text unless the
        library's streamed and final decodings disagree; then nothing more is sent (never text past a stop)."""
        sent = self.buffer[: self.sent]
        return final_text[len(sent):] if final_text.startswith(sent) else ""

    def _partial_stop_tail(self) -> int:
        """Length of the longest suffix of the buffer that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.buffer)), best, -1):
                if self.buffer.endswith(s[:n]):
                    best = n
                    break
        return best
