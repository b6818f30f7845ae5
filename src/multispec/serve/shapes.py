"""Logprobs in OpenAI's response shapes, built from the library's TokenLogprobs (decoding/logprobs.py).

Completions (legacy): {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}; each top dict holds
the k most likely tokens and the chosen one (vLLM's shape; lm-evaluation-harness reads the most likely entry to
decide whether a continuation is greedy). Chat: {content: [{token, logprob, bytes, top_logprobs: [...]}]}.
-inf (a token the processed law excludes, in processed mode) is written -9999.0 as vLLM does: JSON has no infinity.
"""
from __future__ import annotations

import math

from multispec.decoding.logprobs import TokenLogprob
from multispec.serve.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from multispec.text import TokenEnds

NEG_INF_AS = -9999.0


def _finite(x: float) -> float:
    return x if math.isfinite(x) else NEG_INF_AS


class TokenText:
    """Token strings as clients see them: decoded one token at a time (special tokens included), or "token_id:N"
    (vLLM's return_tokens_as_token_ids, for tokens that do not decode alone)."""

    def __init__(self, tokenizer, as_ids: bool):
        self.tok, self.as_ids, self._memo = tokenizer, as_ids, {}

    def __call__(self, token_id: int) -> str:
        if self.as_ids:
            return f"token_id:{token_id}"
        if token_id not in self._memo:
            self._memo[token_id] = self.tok.decode([token_id], skip_special_tokens=False)
        return self._memo[token_id]


def text_offsets(decode, ids: list[int], text: str) -> list[int]:
    """OpenAI's text_offset: where each of `ids` starts in `text`, their decoded text (decode(ids) -> str, special
    tokens skipped). Decoded incrementally, each token with the tokens of the previous step as context (vLLM's
    detokenizer, text.TokenEnds): a special token that decodes to nothing (a BOS) moves no offset, and a character
    split over several tokens is counted once, where it is complete. At most len(text) (an echoed prompt string may
    differ from the decoded ids)."""
    return [min(start, len(text)) for start in TokenEnds(decode).extend(ids)]


def completion_logprobs(entries: list[TokenLogprob | None], ids: list[int], text: TokenText, top: int,
                        offsets: list[int]) -> CompletionLogprobs:
    """entries[i] scores ids[i] (None: an echoed prompt's first token). top: alternatives per token. offsets:
    where each token starts in the choice's text (text_offsets)."""
    tokens, values, tops = [], [], []
    for token_id, e in zip(ids, entries):
        s = text(token_id)
        tokens.append(s)
        if e is None:
            values.append(None)
            tops.append(None)
            continue
        values.append(_finite(e.logprob))
        alternatives = {text(t): _finite(v) for t, v in e.top[:top]}
        alternatives.setdefault(s, _finite(e.logprob))
        tops.append(alternatives)
    return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops, text_offset=offsets)


def chat_logprobs(entries: list[TokenLogprob], text: TokenText, top: int) -> ChatLogprobs:
    def item(token_id: int, value: float) -> TopLogprob:
        s = text(token_id)
        return TopLogprob(token=s, logprob=_finite(value), bytes=list(s.encode("utf-8")))

    content = []
    for e in entries:
        head = item(e.token_id, e.logprob)
        content.append(ChatTokenLogprob(**head.model_dump(), top_logprobs=[item(t, v) for t, v in e.top[:top]]))
    return ChatLogprobs(content=content)


class StreamedLogprobs:
    """One streamed choice's logprobs, chunk by chunk (text.StreamChunk), in its endpoint's shape: a chunk carries
    its own tokens' logprobs, so that over the chunks they add up to the whole response's. Completions' text_offset
    counts from the start of the choice's text (after the echoed prompt, when there is one) as in the whole
    response. top: alternatives per token."""

    def __init__(self, decode, text: TokenText, top: int, chat: bool):
        self.decode, self.text, self.top, self.chat = decode, text, top, chat
        self.ends = TokenEnds(decode)
        self.base = 0  # the echoed prompt's length
        self.count = 0  # tokens sent

    def prompt(self, entries: list | None, ids: list[int], echo: str) -> CompletionLogprobs | None:
        """The echoed prompt's logprobs (its chunk comes first; None where the prompt was not scored)."""
        self.base = len(echo)
        if entries is None:
            return None
        return completion_logprobs(list(entries), ids, self.text, self.top, text_offsets(self.decode, ids, echo))

    def chunk(self, entries: list, ids: list[int], shown: int):
        """entries score ids, the chunk's tokens; shown: the length of the choice's text with this chunk's."""
        self.count += len(ids)
        if self.chat:
            return chat_logprobs(entries, self.text, self.top)
        offsets = [self.base + min(start, shown) for start in self.ends.extend(ids)]
        return completion_logprobs(entries, ids, self.text, self.top, offsets)
