"""Text at the edges of a generation: prompt encoding, stop strings and streamed deltas. Tokenizers only, no models;
`multispec.generate` and `multispec serve` both use these, so a stop string behaves the same everywhere."""
from __future__ import annotations

import bisect
import json
import math
import numbers
import re
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


def encode_chat(tokenizer, vocab_size: int, messages, chat_template: str | None = None,
                tools: list[dict] | None = None, model: str | None = None) -> list[int]:
    """Token ids of a conversation as vLLM's `LLM.chat` and transformers' pipelines make them: the tokenizer's chat
    template (or `chat_template`, a Jinja string) rendered with the generation prompt, then tokenized without
    adding special tokens (the template places any BOS itself). messages: a non-empty list of {"role": str,
    "content": str}; an assistant turn may carry OpenAI `tool_calls` (content may then be None) and a "tool" turn
    its `tool_call_id`. tools: OpenAI tool objects for the template (multispec.tools.Tools.template_tools); a
    template that never reads `tools` is refused, naming `model` (default: the tokenizer's path). A tokenizer without a template, a malformed message or a
    template that refuses the messages is one line (MultispecError)."""
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    check(bool(template), no_chat_template(model or getattr(tokenizer, "name_or_path", "") or "this model"))
    if tools:
        check(template_has_tools(template), tools_refusal(model or getattr(tokenizer, "name_or_path", "") or
                                                          "this model"))
    rendered = chat_messages(messages)
    try:
        text = tokenizer.apply_chat_template(rendered, chat_template=chat_template, tools=tools or None,
                                             tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    except Exception as e:  # noqa: BLE001 - Jinja raises its own errors (raise_exception in templates)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MultispecError(f"the chat template refused these messages: {first[:200]}") from None
    check(len(ids) > 0, "the chat template rendered an empty prompt")
    check(all(0 <= t < vocab_size for t in ids), f"the tokenizer gave token ids outside the model's [0, {vocab_size})")
    return ids


def no_chat_template(model: str) -> str:
    return (f"{model} has no chat template (its tokenizer holds none); give one with --chat-template FILE "
            f"(chat_template= in the library), or a prompt instead of messages")


def template_has_tools(template) -> bool:
    """Whether a chat template (a Jinja string, or transformers' {name: template}) renders `tools` at all."""
    sources = template.values() if isinstance(template, dict) else [template or ""]
    return any(re.search(r"\btools\b", s) for s in sources)


def tools_refusal(model: str) -> str:
    return (f"the chat template of {model} has no tool support (it never reads `tools`); give a template that has "
            f"one with --chat-template FILE (chat_template=), e.g. multispec's templates/hermes_tools.jinja")


def chat_messages(messages) -> list[dict]:
    """The messages as a chat template takes them, checked: role and content, an assistant's tool_calls (their
    JSON-text arguments as objects, as templates expect) and a tool message's tool_call_id and name."""
    check(isinstance(messages, (list, tuple)) and len(messages) > 0,
          f"messages must be a non-empty list of {{'role': ..., 'content': ...}}, got {messages!r:.80}")
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        content_ok = isinstance(m, dict) and (isinstance(m.get("content"), str) or
                                              (calls and m.get("content") is None))
        check(isinstance(m, dict) and isinstance(m.get("role"), str) and content_ok,
              f"messages[{i}] must be a dict with a str 'role' and a str 'content', got {m!r:.80}")
        check_text(m["content"] or "", f"messages[{i}]['content']")
        one = {"role": m["role"], "content": m["content"] if m["content"] is not None else ""}
        if m["role"] == "tool":
            check(isinstance(m.get("tool_call_id"), str) and m["tool_call_id"] != "",
                  f"messages[{i}] has role tool but no tool_call_id (the id of the call it answers)")
            one["tool_call_id"] = m["tool_call_id"]
            if isinstance(m.get("name"), str):
                one["name"] = m["name"]
        if calls:
            check(m["role"] == "assistant", f"messages[{i}]: only assistant messages carry tool_calls")
            one["tool_calls"] = [_template_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(calls)]
        out.append(one)
    return out


def _template_call(call, where: str) -> dict:
    f = call.get("function") if isinstance(call, dict) else None
    check(isinstance(f, dict) and isinstance(f.get("name"), str),
          f"{where} must be {{'id': ..., 'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}")
    args = f.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise MultispecError(f"{where}.function.arguments is not JSON text: {args!r:.80}") from None
    check(isinstance(args, dict), f"{where}.function.arguments must be a JSON object")
    out = {"type": "function", "function": {"name": f["name"], "arguments": args}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out


def _decodes_locally(tokenizer) -> bool:
    """Whether a text decoded piece by piece (TokenEnds) can be the whole's decoding: not where the tokenizer cleans
    up spaces before punctuation (WordPiece's clean_up_tokenization_spaces; transformers ignores it for BPE)."""
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return True
    probe = "a . b , c 's"
    try:
        return tokenizer.decode(tokenizer.encode(probe, add_special_tokens=False), skip_special_tokens=True) == probe
    except Exception:  # noqa: BLE001 - a tokenizer that cannot say: decode the whole text, as before
        return False


class StopStrings:
    """The one stop-string matcher. `cut_ids(new)`: the engine's test after each round (the shortest prefix of the
    new ids whose text contains a stop string, or None). `final(new)`: the text cut before the first stop string and
    the ids wholly before it. `held(text)`: how much of a streamed tail to hold back because it could still grow
    into a stop string. after_tokens (min_tokens): a stop string counts only where it ends past the text of the
    first after_tokens new tokens (vLLM checks none before min_tokens tokens).

    The text of a growing output is detokenized incrementally (`detok`, shared with the Streamer), and each new
    token's text is searched with the last longest-stop - 1 characters before it, so a round's text work follows
    its new tokens, not the output so far. A tokenizer whose decoding is not local (one that cleans up spaces
    across tokens) and stop strings holding U+FFFD take the whole text every time, as before."""

    def __init__(self, tokenizer, stops: list[str], after_tokens: int = 0):
        self.tok, self.stops, self.after = tokenizer, list(stops), after_tokens
        self.longest = max(map(len, self.stops), default=0)
        self.detok = TokenEnds(self.decode)
        # "\ufffd" in a stop could match a half-decoded character, which a later token replaces
        self._whole = not _decodes_locally(tokenizer) or any("\ufffd" in s for s in self.stops)
        self._steps = 0  # tokens of detok scanned for stop strings
        self._floor: int | None = None  # floor(new) once len(new) >= after
        self._searched = 0  # no stop string ends past the floor within this much text (committed, so it stays)
        self._hit: tuple[int, int] | None = None  # (fewest tokens whose text holds a stop, where the first starts)

    def __bool__(self) -> bool:
        return bool(self.stops)

    @property
    def incremental(self) -> bool:
        return not self._whole and self.detok.local

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

    def follow(self, new: list[int]) -> None:
        """Bring detok (and the stop search) to `new`, the output so far: a round costs its new tokens."""
        kept = self.detok.sync(new)
        if kept < self._steps:
            self._steps = kept
            if kept < max(1, self.after):
                self._floor, self._searched = None, 0
            if self._hit is not None and self._hit[0] > kept:
                self._hit = None
            self._searched = min(self._searched, len(self.detok.committed))
        for t in new[kept:]:
            self.detok.push(t)
            self._steps += 1
            if self.stops:
                self._scan()

    def _scan(self) -> None:
        """Search the text of the first _steps tokens where it may hold a stop string not seen before."""
        k, detok = self._steps, self.detok
        if self.after and k == self.after:
            self._floor = len(detok.committed) + len(detok.tail)
        if k < max(1, self.after) or self._hit is not None:
            return
        floor = self._floor if self.after else 0
        assert floor is not None
        start = max(floor, self._searched)
        lo = max(0, min(start - self.longest + 1, len(detok.committed)))
        region = detok.committed[lo:] + detok.tail
        found = [i for i in (region.find(s, max(0, start - len(s) + 1 - lo)) for s in self.stops) if i >= 0]
        if found:
            self._hit = (k, lo + min(found))
        self._searched = len(detok.committed)

    def cut_ids(self, new: list[int]) -> int | None:
        if not self.stops:
            return None
        if self.incremental:
            self.follow(new)
        if not self.incremental:
            return self._cut_ids_whole(new)
        if len(new) < self.after or self._hit is None:
            return None
        return self._hit[0]

    def _cut_ids_whole(self, new: list[int]) -> int | None:
        floor = self.floor(new)
        if not self.stops or floor is None or self.first(self.decode(new), floor) is None:
            return None
        for k in range(max(1, self.after), len(new) + 1):
            if self.first(self.decode(new[:k]), floor) is not None:
                return k
        return len(new)

    def stop_at(self, new: list[int]) -> int | None:
        """first(decode(new), floor(new)) for the new ids detok follows (after follow(new), incremental)."""
        if not self.stops or len(new) < self.after or self._hit is None:
            return None
        if self._hit[0] == len(new):
            return self._hit[1]
        assert self._floor is not None or not self.after
        return self.first(self.detok.text, self._floor or 0)  # the output went on past a stop (not cut there)

    def final(self, new: list[int]) -> tuple[str, list[int]]:
        """(text cut before the first stop string, the token ids wholly before it; see GenerationResult)."""
        text = self.decode(new)
        floor = self.floor(new)
        cut = self.first(text, floor) if self.stops and floor is not None else None
        if cut is None:
            return text, new
        text = text[:cut]
        n = len(new)
        if self.incremental and self._steps:  # detok has followed this output: a prefix's text is a small decode
            self.follow(new)
        prefix = self.detok.text_upto if self.incremental else (lambda k: self.decode(new[:k]))
        while n > 0 and not text.startswith(prefix(n)):
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


_SAME_TAIL = 16  # TokenEnds.sync: how many of the last ids held must match for a list to extend them


class TokenEnds:
    """The incremental detokenizer, as vLLM's `detokenize_incrementally`: each token decoded with the tokens of the
    previous step as context (a prefix offset and a read offset), so that a step costs one or two small decodes. A
    token that adds no text (a special token) or only part of a character (its text ends in "\\ufffd") ends nowhere:
    its text is held as `tail`, and counts with the next token that completes text. decode(ids) -> str.
    `starts[i]`: the text length before token i (OpenAI's text_offset); `ends`: (token count, text length) at each
    clean end, (0, 0) first; `committed`: the text up to the last clean end; `text` (committed + tail) equals
    decode(ids) where decoding is local (byte-level BPE, SentencePiece); `local` turns False once a step's text
    did not extend the step's context (then a caller needing decode(ids) decodes them whole)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self._reset()

    def _reset(self) -> None:
        self.ids: list[int] = []
        self.starts: list[int] = []
        self.ends: list[tuple[int, int]] = [(0, 0)]
        self.committed = self.tail = ""
        self._prefix = self._read = 0
        self._before = ""  # decode(ids[_prefix:_read]), the context's text
        self.local = True

    @property
    def text(self) -> str:
        return self.committed + self.tail

    def push(self, t: int) -> None:
        self.starts.append(len(self.committed))
        self.ids.append(t)
        before, after = self._before, self.decode(self.ids[self._prefix:])
        if not after.startswith(before):
            self.local = False
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.committed += after[len(before):]
            self.tail = ""
            self._prefix, self._read = self._read, len(self.ids)
            self._before = self.decode(self.ids[self._prefix:self._read])
            self.ends.append((len(self.ids), len(self.committed)))
        else:
            self.tail = after[len(before):]

    def extend(self, ids: list[int]) -> list[int]:
        """Add ids; returns their starts."""
        first = len(self.ids)
        for t in ids:
            self.push(t)
        return self.starts[first:]

    def sync(self, ids: list[int]) -> int:
        """Keep the ids held that start `ids` (rewound to a clean end where `ids` is shorter; afresh where they
        differ) and return how many: follows one growing list of ids (a round's output), checking its last few."""
        n, m = len(self.ids), len(ids)
        if m >= n and list(ids[max(0, n - _SAME_TAIL):n]) == self.ids[max(0, n - _SAME_TAIL):]:
            return n
        if m < n and list(ids[max(0, m - _SAME_TAIL):]) == self.ids[max(0, m - _SAME_TAIL):m]:
            return self._rewind(m)
        self._reset()
        return 0

    def _rewind(self, m: int) -> int:
        """Back to the last clean end at most m tokens in; returns its token count."""
        j = bisect.bisect_right(self.ends, (m, math.inf)) - 1
        count, length = self.ends[j]
        del self.ids[count:], self.starts[count:], self.ends[j + 1:]
        self.committed, self.tail = self.committed[:length], ""
        self._prefix, self._read = (self.ends[j - 1][0] if j else 0), count
        self._before = self.decode(self.ids[self._prefix:count]) if count else ""
        return count

    def text_upto(self, n: int) -> str:
        """The text of the first n ids held (decode(ids[:n]) where decoding is local), from the clean end before."""
        j = bisect.bisect_right(self.ends, (n, math.inf)) - 1
        count, length = self.ends[j]
        if count == n:
            return self.committed[:length]
        prefix = self.ends[j - 1][0] if j else 0
        before = self.decode(self.ids[prefix:count]) if count else ""
        return self.committed[:length] + self.decode(self.ids[prefix:n])[len(before):]

    def update(self, ids: list[int]) -> None:
        """Follow `ids`, the whole list so far (see sync)."""
        self.extend(ids[self.sync(ids):])


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
    logprobs from `recorder` (a decoding.logprobs.LogprobRecorder, or None), instead of the bare delta. The text
    comes from the stop strings' incremental detokenizer (StopStrings.detok), one round's tokens at a time."""

    def __init__(self, stops: StopStrings, callback: Callable | None, tokens: bool = False, recorder=None):
        self.stops, self.callback, self.tokens, self.recorder = stops, callback, tokens, recorder
        self.shown = ""
        self._latest: list[int] = []
        self._count = 0
        self.sent = 0  # tokens sent (token mode)
        self.chunks = 0

    @property
    def latest(self) -> list[int]:
        """The ids of the last round (the engine's list only grows between rounds: kept by reference, not copied)."""
        return list(self._latest[:self._count])

    def on_tokens(self, new: list[int]) -> None:
        self._latest, self._count = new, len(new)
        if self.callback is None:
            return
        stops = self.stops
        if stops.incremental:
            stops.follow(new)
        if stops.incremental:
            whole = stops.detok.text
            cut = stops.stop_at(new)
            held = stops.held(whole[max(0, len(whole) - stops.longest):]) if cut is None else 0
        else:
            whole = stops.decode(new)
            floor = stops.floor(new)
            cut = stops.first(whole, floor) if stops and floor is not None else None
            held = stops.held(whole) if cut is None else 0
        text = whole[:cut] if cut is not None else whole[:len(whole) - held]
        if text.endswith("\ufffd"):
            return
        if len(text) > len(self.shown) and text.startswith(self.shown):
            self._send(text, new, self._covered(new, text, whole) if self.tokens else 0)

    def _covered(self, new: list[int], text: str, whole: str) -> int:
        """How many of `new` lie within `text` (whole: their decoded text): the last clean end whose text fits in
        it and whose ids decode to a prefix of it (the test StopStrings.final keeps ids by, so no token sent here
        is one the result drops). Where decoding is local, a clean end's ids decode to whole[:length]."""
        stops = self.stops
        local = stops.incremental
        if not local:
            stops.detok.update(new)
        for count, length in reversed(stops.detok.ends):
            if count <= self.sent:
                break
            if length <= len(text) and (local or text.startswith(whole if count == len(new) else
                                                                 stops.decode(new[:count]))):
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
