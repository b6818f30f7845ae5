"""The stop-string matcher and streamer as they were before text was detokenized incrementally: each round decoded
the whole output. Kept as the reference that tests/test_detok.py compares the incremental ones with."""
from __future__ import annotations

from typing import Callable

from multispec.text import StreamChunk


class OldStopStrings:
    """The one stop-string matcher. `cut_ids(new)`: the engine's test after each round (the shortest prefix of the
    new ids whose text contains a stop string, or None). `final(new)`: the text cut before the first stop string and
    the ids wholly before it. `held(text)`: how much of a streamed tail to hold back because it could still grow
    into a stop string. after_tokens (min_tokens): a stop string counts only where it ends past the text of the
    first after_tokens new tokens (vLLM checks none before min_tokens tokens)."""

    def __init__(self, tokenizer, stops: list[str], after_tokens: int = 0):
        self.tok, self.stops, self.after = tokenizer, list(stops), after_tokens

    def __bool__(self) -> bool:
        return bool(self.stops)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def first(self, text: str, floor: int = 0) -> int | None:
        """Where the first stop string that ends past text[:floor] starts, or None."""
        cuts = [i for i in (text.find(s, max(0, floor - len(s) + 1)) for s in self.stops) if i >= 0]
        return min(cuts) if cuts else None

    def floor(self, new: list[int]) -> int | None:
        """Length of the text of the first `after` new tokens (stop strings must end past it); None while fewer."""
        if len(new) < self.after:
            return None
        return len(self.decode(new[:self.after])) if self.after else 0

    def cut_ids(self, new: list[int]) -> int | None:
        floor = self.floor(new)
        if not self.stops or floor is None or self.first(self.decode(new), floor) is None:
            return None
        for k in range(max(1, self.after), len(new) + 1):
            if self.first(self.decode(new[:k]), floor) is not None:
                return k
        return len(new)

    def final(self, new: list[int]) -> tuple[str, list[int]]:
        """(text cut before the first stop string, the token ids wholly before it; see GenerationResult)."""
        text = self.decode(new)
        floor = self.floor(new)
        cut = self.first(text, floor) if self.stops and floor is not None else None
        if cut is None:
            return text, new
        text = text[:cut]
        n = len(new)
        while n > 0 and not text.startswith(self.decode(new[:n])):
            n -= 1
        return text, new[:n]

    def held(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


class OldTokenEnds:
    """Where the decoded text of a growing list of token ids ends cleanly, found incrementally as vLLM's detokenizer
    does: each token decoded with the tokens of the previous step as context. A token that adds no text (a special
    token) or only part of a character ends nowhere: it counts with the next token that completes text. decode(ids)
    -> str. `starts[i]`: the text length before token i (OpenAI's text_offset); `ends`: (token count, text length)
    at each clean end, (0, 0) first."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self._reset()

    def _reset(self) -> None:
        self.ids: list[int] = []
        self.starts: list[int] = []
        self.ends: list[tuple[int, int]] = [(0, 0)]
        self._length = self._prefix = self._read = 0

    def extend(self, ids: list[int]) -> list[int]:
        """Add ids; returns their starts."""
        first = len(self.ids)
        for t in ids:
            self.starts.append(self._length)
            self.ids.append(t)
            before = self.decode(self.ids[self._prefix:self._read])
            after = self.decode(self.ids[self._prefix:])
            if len(after) > len(before) and not after.endswith("\ufffd"):
                self._length += len(after) - len(before)
                self._prefix, self._read = self._read, len(self.ids)
                self.ends.append((len(self.ids), self._length))
        return self.starts[first:]

    def update(self, ids: list[int]) -> None:
        """Follow `ids`, the whole list so far (started afresh if it does not extend the ids seen)."""
        if ids[:len(self.ids)] != self.ids:
            self._reset()
        self.extend(ids[len(self.ids):])


class OldStreamer:
    """Calls back with text deltas as rounds commit tokens. Never shows text at or past a stop string, nor a tail
    that could still grow into one, nor a half-decoded character; `flush(final_text, final_ids)` sends the rest, so
    the deltas always add up to the final text. `latest` keeps the committed ids (for a partial result on failure).
    tokens=True (the server's mode): the callback gets a StreamChunk, the delta with the tokens it covers and their
    logprobs from `recorder` (a decoding.logprobs.LogprobRecorder, or None), instead of the bare delta."""

    def __init__(self, stops: OldStopStrings, callback: Callable | None, tokens: bool = False, recorder=None):
        self.stops, self.callback, self.tokens, self.recorder = stops, callback, tokens, recorder
        self.shown = ""
        self.latest: list[int] = []
        self.sent = 0  # tokens sent (token mode)
        self.chunks = 0
        self._ends = OldTokenEnds(stops.decode)

    def on_tokens(self, new: list[int]) -> None:
        self.latest = list(new)
        if self.callback is None:
            return
        whole = self.stops.decode(new)
        floor = self.stops.floor(new)
        cut = self.stops.first(whole, floor) if self.stops and floor is not None else None
        text = whole[:cut] if cut is not None else whole[:len(whole) - self.stops.held(whole)]
        if text.endswith("\ufffd"):
            return
        if len(text) > len(self.shown) and text.startswith(self.shown):
            self._send(text, new, self._covered(new, text, whole) if self.tokens else 0)

    def _covered(self, new: list[int], text: str, whole: str) -> int:
        """How many of `new` lie within `text` (whole: their decoded text): the last clean end whose text fits in
        it and whose ids decode to a prefix of it (the test StopStrings.final keeps ids by, so no token sent here
        is one the result drops)."""
        self._ends.update(new)
        for count, length in reversed(self._ends.ends):
            if count <= self.sent:
                break
            if length <= len(text) and text.startswith(whole if count == len(new) else
                                                        self.stops.decode(new[:count])):
                return count
        return self.sent

    def _send(self, text: str, ids: list[int], upto: int) -> None:
        delta = ""
        if len(text) > len(self.shown) and text.startswith(self.shown):
            delta, self.shown = text[len(self.shown):], text
        if not self.tokens:
            self.callback(delta)
            return
        rec = self.recorder
        logprobs = None if rec is None else list(rec.tokens[self.sent:upto])
        prompt = list(rec.prompt_tokens) if rec is not None and rec.prompt and not self.chunks else None
        chunk = StreamChunk(delta, list(ids[self.sent:upto]), logprobs, prompt)
        self.sent, self.chunks = upto, self.chunks + 1
        self.callback(chunk)

    def flush(self, final_text: str, final_ids: list[int] | None = None) -> None:
        """Send the rest of final_text; in token mode, with the rest of final_ids (the result's ids; default: the
        latest committed), even where no text is left (an EOS)."""
        if self.callback is None:
            return
        more = len(final_text) > len(self.shown) and final_text.startswith(self.shown)
        if not self.tokens:
            if more:
                self._send(final_text, self.latest, 0)
            return
        ids = self.latest if final_ids is None else list(final_ids)
        if more or len(ids) > self.sent:
            self._send(final_text, ids, max(len(ids), self.sent))
