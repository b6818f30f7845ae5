"""Request and response bodies of the OpenAI-compatible API, as pydantic models validated at the edge.

Requests forbid unknown fields and coerce nothing (strict types: "5" is not an integer), so a typo or a wrong type
is a 400 naming the field rather than a silently ignored setting. Extensions beyond OpenAI's API: `top_k` and
`return_token_ids` (vLLM's names) and `reproducible` in requests; `spec_decode` (the per-request speculative metrics, vLLM's names)
and `token_ids` in responses.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
MAX_STOPS = 16


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions. temperature None takes the model's
    generation_config defaults (as vLLM does); seed None draws a fresh seed (OpenAI: sampling is not reproducible
    without one)."""

    model_config = _STRICT
    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | StrictInt | None = Field(None, ge=0, le=100)
    top_p: StrictFloat | StrictInt | None = Field(None, gt=0, le=1)
    top_k: StrictInt | None = Field(None, ge=-1)  # vLLM: -1 or 0 means off
    seed: StrictInt | None = Field(None, ge=0, lt=2**63)
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt = Field(1, ge=1, le=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    return_token_ids: StrictBool = False
    # multispec: verify with position-keyed noise so that the seed fixes the text whatever the server's method
    # chooses (None: the library's default, see multispec.generate)
    reproducible: StrictBool | None = None
    # OpenAI options that multispec does not support: accepted only at their "off" values so that clients that
    # send the defaults explicitly work, refused otherwise (see app._refuse_unsupported).
    presence_penalty: StrictFloat | StrictInt = 0
    frequency_penalty: StrictFloat | StrictInt = 0

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v
        if stops is not None:
            if len(stops) > MAX_STOPS:
                raise ValueError(f"at most {MAX_STOPS} stop strings")
            if any(s == "" for s in stops):
                raise ValueError("stop strings must be non-empty")
        return stops or None


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. prompt: text, or token ids (one prompt; n = 1)."""

    prompt: StrictStr | list[StrictInt]
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    suffix: StrictStr | None = None
    best_of: StrictInt | None = Field(None, ge=1, le=1)


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions. max_completion_tokens is OpenAI's newer name for max_tokens."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None


# ---- responses ----

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpecDecodeMetrics(BaseModel):
    """One request's speculative-decoding metrics, named as vLLM names them (vllm/v1/spec_decode/metrics.py):
    mean_acceptance_length = 1 + accepted / drafts; accepted_per_position[d] counts rounds that accepted a draft
    token at depth d + 1."""

    method: str
    lossless: bool
    reproducible: bool
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    accepted_per_position: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    spec_decode: SpecDecodeMetrics | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"] | None
    logprobs: None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    spec_decode: SpecDecodeMetrics


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    spec_decode: SpecDecodeMetrics | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "multispec"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorBody
