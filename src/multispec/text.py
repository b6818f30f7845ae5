"""Text at the edges of a generation: prompt encoding, stop strings and streamed deltas. Tokenizers only, no models;
`multispec.generate` and `multispec serve` both use these, so a stop string behaves the same everywhere."""
from __future__ import annotations

import numbers
from typing import Callable

import numpy as np
import torch

from multispec.errors import check
from multispec.validate import check_text


def encode_prompt(tokenizer, vocab_size: int, prompt) -> list[int]:
    """Token ids of `prompt`: a str, encoded by the tokenizer with its own special-token rules (transformers'
    `tokenizer(prompt)` and vLLM's add_special_tokens=True: a BOS only where the tokenizer's post-processor adds
    one), or 1-D integer ids taken as they are (a list, tuple, [L] or [1, L] integer tensor or array), each in
    [0, vocab_size)."""
    if isinstance(prompt, str):
        check(prompt != "", "the prompt is empty")
        check_text(prompt, "the prompt")
        ids = list(tokenizer(prompt)["input_ids"])
        check(len(ids) > 0, "the prompt encodes to no tokens")
        check(all(0 <= t < vocab_size for t in ids), f"the tokenizer gave token ids outside the model's "
                                                        f"[0, {vocab_size})")
        return ids
    check(not isinstance(prompt, (bytes, bytearray)),
          "the prompt is bytes; decode it to a str first (bytes are not token ids)")
    if isinstance(prompt, (torch.Tensor, np.ndarray)):
        check(prompt.ndim == 1 or (prompt.ndim == 2 and prompt.shape[0] == 1),
              f"token-id prompts must be 1-D (or [1, L]), got shape {tuple(prompt.shape)}")
        is_int = (not prompt.dtype.is_floating_point and not prompt.dtype.is_complex and prompt.dtype != torch.bool) \
            if isinstance(prompt, torch.Tensor) else np.issubdtype(prompt.dtype, np.integer)
        check(is_int, f"token ids must be integers, got dtype {prompt.dtype}")
        prompt = prompt.reshape(-1).tolist()
    check(isinstance(prompt, (list, tuple)),
          f"the prompt must be a str or a list of token ids, got {type(prompt).__name__}")
    for t in prompt:
        check(isinstance(t, numbers.Integral) and not isinstance(t, (bool, np.bool_)),
              f"token ids must be integers, got {t!r}")
    ids = [int(t) for t in prompt]
    check(len(ids) > 0, "the prompt is empty")
    check(all(0 <= t < vocab_size for t in ids), f"prompt token ids must be in [0, {vocab_size})")
    return ids


class StopStrings:
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


class Streamer:
    """Calls back with text deltas as rounds commit tokens. Never shows text at or past a stop string, nor a tail
    that could still grow into one, nor a half-decoded character; `flush(final_text)` sends the rest, so the deltas
    always add up to the final text. `latest` keeps the committed ids (for a partial result on failure)."""

    def __init__(self, stops: StopStrings, callback: Callable[[str], None] | None):
        self.stops, self.callback = stops, callback
        self.shown = ""
        self.latest: list[int] = []

    def on_tokens(self, new: list[int]) -> None:
        self.latest = list(new)
        if self.callback is None:
            return
        text = self.stops.decode(new)
        floor = self.stops.floor(new)
        cut = self.stops.first(text, floor) if self.stops and floor is not None else None
        text = text[:cut] if cut is not None else text[:len(text) - self.stops.held(text)]
        if text.endswith("\ufffd"):
            return
        self._send(text)

    def _send(self, text: str) -> None:
        if len(text) > len(self.shown) and text.startswith(self.shown):
            self.callback(text[len(self.shown):])
            self.shown = text

    def flush(self, final_text: str) -> None:
        if self.callback is not None:
            self._send(final_text)
