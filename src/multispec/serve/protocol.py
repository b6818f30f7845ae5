"""Request and response bodies of the OpenAI-compatible API, as pydantic models validated at the edge.

Requests forbid unknown fields and coerce nothing (strict types: "5" is not an integer), so a typo or a wrong type
is a 400 naming the field rather than a silently ignored setting. An explicit `null` means the field's default (as
OpenAI's and vLLM's servers read it). Beyond OpenAI's fields, vLLM's extensions that multispec implements:
`top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`, `return_token_ids`,
`return_tokens_as_token_ids`, `add_special_tokens`, `logprobs_mode`; multispec's own `reproducible`. Fields that
are accepted only at their default (`UNSUPPORTED_UNLESS_DEFAULT`) or harmless and ignored (`IGNORED`) are listed in
docs/serve.md; `spec_decode` (the per-request speculative metrics, vLLM's names) and `token_ids` in responses.
"""
from __future__ import annotations

from dataclasses import fields
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, create_model,
                      field_validator, model_validator)

from multispec.params import SamplingParams

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
MAX_STOPS = 16
MAX_LOGPROBS = 20  # OpenAI's bound for completions `logprobs` and chat `top_logprobs`
MAX_N = 16  # choices per prompt
Number = StrictFloat | StrictInt


class _Request(BaseModel):
    """Strict, and an explicit null is the field's default (clients send `"stream": null` for "not set")."""

    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data):
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(_Request):
    include_usage: StrictBool = False
    # vLLM's (load generators such as guidellm send true): accepted, but usage still comes once, in the final
    # chunk (with include_usage), not in every chunk
    continuous_usage_stats: StrictBool = False


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict | None = None


# OpenAI's and vLLM's names of SamplingParams fields (a test checks that each names a field); every other
# SamplingParams field is a request field of its own name (SAMPLING_WIRE), but those the endpoints carry otherwise
WIRE_ALIASES = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
                "logprobs": "logprobs", "top_logprobs": "logprobs"}
CARRIED_OTHERWISE = ("max_new_tokens", "logprobs", "prompt_logprobs",  # the aliases above; echo (completions)
                     "json_schema", "regex", "choice", "grammar")  # response_format, structured_outputs, guided_*
# the server's own limits on a field, beyond what SamplingParams checks, and the JSON shape where it is not the
# field's own type (a dict's keys are strings in JSON)
WIRE_LIMITS: dict[str, dict] = {"temperature": dict(le=100), "repetition_penalty": dict(le=100),
                                "stop_token_ids": dict(max_length=64), "logit_bias": dict(max_length=1024)}
WIRE_TYPES: dict[str, Any] = {"stop": StrictStr | list[StrictStr] | None, "logit_bias": dict[StrictStr, Number] | None,
                              "logprobs_mode": Literal["raw", "processed"] | None}


def _strict(tp):
    """The strict pydantic type of a SamplingParams field's type: int -> StrictInt, float -> a number, a tuple of
    X -> a list of X, X | None -> ... | None; anything else is passed on for SamplingParams to check."""
    if tp is type(None):
        return tp
    args = get_args(tp)
    if get_origin(tp) in (Union, UnionType):
        return Union[tuple(_strict(a) for a in args)]
    if get_origin(tp) is tuple:
        return list[_strict(args[0])]  # type: ignore[misc]
    return {int: StrictInt, float: Number, bool: StrictBool, str: StrictStr}.get(tp, Any)


def sampling_wire_fields() -> dict[str, tuple]:
    """The request fields taken from SamplingParams by name (create_model's field definitions): each field's type
    made strict, default None (the field's own default, decided by SamplingParams), the server's limits."""
    hints = get_type_hints(SamplingParams)
    return {f.name: (WIRE_TYPES.get(f.name, _strict(hints[f.name]) | None), Field(None, **WIRE_LIMITS.get(f.name, {})))
            for f in fields(SamplingParams) if f.name not in CARRIED_OTHERWISE}


SAMPLING_WIRE = tuple(sampling_wire_fields())  # the request fields that are SamplingParams fields of that name


class _RequestFields(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions beside the sampling ones (`_SamplingFields`).
    temperature None takes the model's generation_config defaults (as vLLM does); seed None draws a fresh seed
    (OpenAI: sampling is not reproducible without one); with n > 1, sample j uses seed + j. `reproducible`
    (multispec's): verify with position-keyed noise so that the seed fixes the text whatever the server's method
    chooses (None: the library's default, see multispec.generate)."""

    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=0)
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    return_token_ids: StrictBool = False
    return_tokens_as_token_ids: StrictBool = False
    # accepted and ignored: they change nothing multispec does (see docs/serve.md)
    user: StrictStr | None = None
    request_id: StrictStr | None = None
    priority: StrictInt = 0
    cache_salt: StrictStr | None = None
    skip_special_tokens: Literal[True] = True
    spaces_between_special_tokens: StrictBool = True
    # accepted only at their defaults; anything else is refused by name (app._refuse_unsupported)
    best_of: StrictInt | None = None
    use_beam_search: StrictBool = False
    length_penalty: Number = 1
    include_stop_str_in_output: StrictBool = False
    truncate_prompt_tokens: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    prompt_logprobs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None

    @field_validator("stop", check_fields=False)
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v
        if stops is not None:
            if len(stops) > MAX_STOPS:
                raise ValueError(f"at most {MAX_STOPS} stop strings")
            if any(s == "" for s in stops):
                raise ValueError("stop strings must be non-empty")
        return stops or None

    @field_validator("logit_bias", check_fields=False)
    @classmethod
    def _bias(cls, v):
        for key, bias in (v or {}).items():
            if not key.isdigit():
                raise ValueError(f"keys must be token ids (decimal strings), got {key!r}")
            if abs(bias) > 100:
                raise ValueError(f"values must be in [-100, 100], got {bias} for token {key}")
        return v


_SamplingFields = create_model("_SamplingFields", __base__=_RequestFields,  # type: ignore[call-overload]
                               **sampling_wire_fields())
PromptIds = list[int]


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. prompt: a string, a list of strings, a list of token ids or a list of token-id lists
    (one choice per prompt and sample: index = prompt * n + sample). max_tokens 0 is allowed with echo (prompt
    logprobs only). max_completion_tokens: vLLM's alias of max_tokens."""

    prompt: Any = Field(...)
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: StrictInt | None = Field(None, ge=0)
    add_special_tokens: StrictBool = True
    suffix: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        """Returns a list of prompts, each a str or a list of ints (lists may be empty: the edge refuses them)."""
        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        if isinstance(v, str):
            return [v]
        if isinstance(v, list) and v:
            if all(isinstance(x, str) for x in v):
                return list(v)
            if all(is_int(x) for x in v):
                return [list(v)]
            if all(isinstance(x, list) and all(is_int(t) for t in x) for x in v):
                return [list(x) for x in v]
        if isinstance(v, list) and not v:
            raise ValueError("the prompt list is empty")
        raise ValueError("must be a string, a list of strings, a list of token ids or a list of token-id lists")


class TextPart(_Request):
    type: Literal["text"]
    text: StrictStr


class CalledFunction(_Request):
    name: StrictStr
    arguments: StrictStr | dict = "{}"  # OpenAI's: JSON text (an object is taken too)


class MessageToolCall(_Request):
    """An assistant message's tool call, as OpenAI returned it."""

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Request):
    """content None: an empty message (OpenAI allows it for assistant turns that carried tool calls). A "tool"
    message answers the call `tool_call_id` (text.chat_messages checks it is there)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: StrictStr | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict:
        """The message as text.chat_messages takes it."""
        out: dict = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            if self.name is not None:
                out["name"] = self.name
        return out


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions. max_completion_tokens is OpenAI's newer name for max_tokens."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool = False  # vLLM's chat echo: refused unless false
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    # tools (OpenAI's function calling), checked by multispec.tools.Tools.of; the older functions and the rest:
    # accepted only absent or empty (refused by name otherwise)
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: StrictBool | None = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    store: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    service_tier: StrictStr | None = None
    reasoning_effort: Any = None
    chat_template_kwargs: Any = None


class TokenizeRequest(_Request):
    """POST /tokenize (vLLM's shape): `prompt` (add_special_tokens default true) or `messages` (rendered by the
    chat template; add_special_tokens default false, as the template places its own)."""

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False


class DetokenizeRequest(_Request):
    model: StrictStr | None = None
    tokens: list[StrictInt]


# ---- responses ----

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class SpecDecodeMetrics(BaseModel):
    """One request's speculative-decoding metrics, named as vLLM names them (vllm/v1/spec_decode/metrics.py):
    mean_acceptance_length = 1 + accepted / drafts; accepted_per_position[d] counts rounds that accepted a draft
    token at depth d + 1. model: what the server loaded (stats["model"]: a GGUF file's name, SHA-256 and conversion
    id); profile: the digest of the machine profile the request was planned from."""

    method: str
    lossless: bool
    reproducible: bool
    model: dict | None = None
    profile: str | None = None  # the digest of the machine profile its plans came from (multispec/profile.py)
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    mean_acceptance_length: float | None
    draft_acceptance_rate: float | None
    accepted_per_position: list[int]


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions logprobs: per token its string, log-probability (None for an echoed prompt's
    first token), the top alternatives with the chosen token ({token: logprob}, vLLM's shape) and its character
    offset in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class SpeculativeDecoding(BaseModel):
    """One request's speculative decoding in vLLM's per-request shape (`metrics.speculative_decoding`, vLLM's
    `--per-request-spec-decode-metrics summary`). acceptance_histogram[j]: drafting rounds that accepted exactly j
    draft tokens (num_spec_tokens + 1 entries); num_spec_tokens: the deepest draft of the request (vLLM's fixed k;
    multispec's depth may vary by round); num_draft_tokens: drafted depth, summed over rounds. Never null: with no
    drafting round, mean_acceptance_length is 1 and draft_acceptance_rate 0."""

    mean_acceptance_length: float
    draft_acceptance_rate: float
    acceptance_histogram: list[int]
    num_spec_steps: int
    num_accepted_draft_tokens: int
    num_draft_tokens: int
    num_spec_tokens: int

    @classmethod
    def of(cls, stats: dict) -> "SpeculativeDecoding":
        steps, drafted = stats["num_spec_steps"], stats["num_draft_tokens"]
        accepted, per_pos = stats["num_accepted_draft_tokens"], list(stats["accepted_per_position"])
        # rounds accepting at depth d also accepted at every depth above it, so per_pos falls with d
        at_least = [steps, *per_pos]
        histogram = [at_least[j] - (at_least[j + 1] if j + 1 < len(at_least) else 0) for j in range(len(at_least))]
        return cls(mean_acceptance_length=1 + accepted / steps if steps else 1.0,
                   draft_acceptance_rate=accepted / drafted if drafted else 0.0, acceptance_histogram=histogram,
                   num_spec_steps=steps, num_accepted_draft_tokens=accepted, num_draft_tokens=drafted,
                   num_spec_tokens=len(per_pos))


class ResponseMetrics(BaseModel):
    """vLLM's top-level per-request `metrics` object (one sequence per request: absent when n or the prompts make
    several choices, as in vLLM)."""

    speculative_decoding: SpeculativeDecoding


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    spec_decode: SpecDecodeMetrics | None = None
    metrics: ResponseMetrics | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    """content: the text outside any tool calls (None when there is none beside calls)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"] | None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    spec_decode: SpecDecodeMetrics
    metrics: ResponseMetrics | None = None


class FunctionDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """OpenAI's streamed tool call: the first delta of call `index` carries its id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    spec_decode: SpecDecodeMetrics | None = None
    metrics: ResponseMetrics | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "multispec"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorBody
