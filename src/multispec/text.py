"""Text at the edges of a generation: prompt encoding, stop strings and streamed deltas. Tokenizers only, no models;
`multispec.generate` and `multispec serve` both use these, so a stop string behaves the same everywhere."""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from multispec.errors import MultispecError, check
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


def encode_chat(tokenizer, vocab_size: int, messages, chat_template: str | None = None) -> list[int]:
    """Token ids of a conversation as vLLM's `LLM.chat` and transformers' pipelines make them: the tokenizer's chat
    template (or `chat_template`, a Jinja string) rendered with the generation prompt, then tokenized without
    adding special tokens (the template places any BOS itself). messages: a non-empty list of {"role": str,
    "content": str}. A tokenizer without a template, a malformed message or a template that refuses the messages
    is one line (MultispecError)."""
    check(chat_template is not None or bool(getattr(tokenizer, "chat_template", None)),
          "this model's tokenizer has no chat template; give a prompt instead of messages (or a chat template)")
    check(isinstance(messages, (list, tuple)) and len(messages) > 0,
          f"messages must be a non-empty list of {{'role': ..., 'content': ...}}, got {messages!r:.80}")
    for i, m in enumerate(messages):
        check(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str),
              f"messages[{i}] must be a dict with a str 'role' and a str 'content', got {m!r:.80}")
        check_text(m["content"], f"messages[{i}]['content']")
    try:
        text = tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                             chat_template=chat_template, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    except Exception as e:  # noqa: BLE001 - Jinja raises its own errors (raise_exception in templates)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MultispecError(f"the chat template refused these messages: {first[:200]}") from None
    check(len(ids) > 0, "the chat template rendered an empty prompt")
    check(all(0 <= t < vocab_size for t in ids), f"the tokenizer gave token ids outside the model's [0, {vocab_size})")
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


class TokenEnds:
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


@dataclass(frozen=True)
class StreamChunk:
    """What a Streamer in token mode sends: a text delta and the committed tokens it covers, those whose decoded
    text now lies within the text shown (TokenEnds) and came with no earlier chunk; over a generation the chunks'
    token_ids add up to the result's token ids, and the last chunk carries what is left. logprobs: the recorder's
    entries for token_ids (None without one); prompt_logprobs: the prompt's, with the first chunk (when scored)."""

    text: str
    token_ids: list[int] | None = None  # None: unknown (a stand-in generation that streams text only)
    logprobs: list | None = None
    prompt_logprobs: list | None = None


class Streamer:
    """Calls back with text deltas as rounds commit tokens. Never shows text at or past a stop string, nor a tail
    that could still grow into one, nor a half-decoded character; `flush(final_text, final_ids)` sends the rest, so
    the deltas always add up to the final text. `latest` keeps the committed ids (for a partial result on failure).
    tokens=True (the server's mode): the callback gets a StreamChunk, the delta with the tokens it covers and their
    logprobs from `recorder` (a decoding.logprobs.LogprobRecorder, or None), instead of the bare delta."""

    def __init__(self, stops: StopStrings, callback: Callable | None, tokens: bool = False, recorder=None):
        self.stops, self.callback, self.tokens, self.recorder = stops, callback, tokens, recorder
        self.shown = ""
        self.latest: list[int] = []
        self.sent = 0  # tokens sent (token mode)
        self.chunks = 0
        self._ends = TokenEnds(stops.decode)

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
