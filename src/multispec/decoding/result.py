"""What one generation returns (`Decoder.generate`, `multispec.generate`, batches)."""
from __future__ import annotations

from dataclasses import dataclass

from multispec.decoding.logprobs import TokenLogprob


@dataclass
class GenerationResult:
    """token_ids: the new tokens only. text: their decoding, cut before the first stop string. stats: see docs/architecture.md (the stats schema).
    finish_reason: "stop" (an EOS token or a stop string ended it), "length" (max_new_tokens, or the model's
    context, reached) or "abort" (a partial result carried by an exception, see `Decoder.generate`).

    When a stop string ends the output, `token_ids` are the tokens wholly before it: a token whose text straddles
    the stop string's start is dropped from `token_ids`, while `text` keeps its part before the stop. So
    decode(token_ids) == text, or a prefix of it short of that one token's head.

    logprobs: with `logprobs=k`, one TokenLogprob per token of token_ids (decoding/logprobs.py).
    prompt_logprobs: with `prompt_logprobs=True`, one per prompt token (None for the first).
    tool_calls: with tools (generate(messages=..., tools=...)), the calls the output made, OpenAI tool call objects
    (multispec.tools.parse_tool_calls: `text` stays the whole output); None without tools."""

    token_ids: list[int]
    text: str
    stats: dict
    finish_reason: str = "length"
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    tool_calls: list[dict] | None = None
