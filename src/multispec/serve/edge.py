"""The request edge: everything a request is checked against before it is queued (body, JSON, fields, prompt
encoding, chat template, context length, then `Decoder.prepare`: the request prepared once, its grammar compiled),
and the OpenAI error it gets otherwise. Tokenizing and preparing run off the event loop: a long prompt or a large
grammar must not hold up /health or other requests. The scheduler queues the PreparedRequest as it is.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import threading
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from multispec.errors import MultispecError
from multispec.params import ParamError, SamplingParams
from multispec.structured import with_additional_properties
from multispec.decoding.request import PreparedRequest
from multispec.serve.protocol import SAMPLING_WIRE, ErrorBody, ErrorResponse
from multispec.text import chat_messages, encode_chat, encode_prompt, template_has_tools, tools_refusal
from multispec.tools import Tools
from multispec.validate import check_text


@dataclass(frozen=True)
class ServeSettings:
    """model_name: the id clients pass as `model`. method None: generate's own default method. chat_template: a
    Jinja template overriding the tokenizer's. request_timeout: seconds from arrival (queueing included).
    read_timeout: seconds for a request's headers to arrive (else the connection is closed, serve/http.py) and for
    its body (else 408). max_model_len: the most tokens (prompt + output) a request may take (None: what fits the
    cache budget, serve/memory.py). api_key: when set, every path but /health and /metrics needs
    `Authorization: Bearer <api_key>` (RequireApiKey)."""

    model_name: str
    method: str | None = None
    method_options: dict = field(default_factory=dict)
    backend: str | None = None  # None: the default rule (decoding/pair_checks.default_backend), as generate()
    max_concurrent: int = 2
    max_queue: int = 32
    max_batch: int = 1  # > 1: continuous batching over that many slots (the fast backend); max_concurrent follows
    request_timeout: float = 600.0
    retry_after_s: int = 1
    chat_template: str | None = None
    max_body_bytes: int = 1 << 20
    read_timeout: float = 30.0
    max_model_len: int | None = None
    api_key: str | None = field(default=None, repr=False)
    profile: object = None  # a MachineProfile (None: the cache folder's, updated with what it observed at shutdown)
    # each finished request's acceptance folded into the profile the next requests plan from (in memory; every
    # response's spec_decode.profile names the digest it was planned from)
    profile_learning: bool = True


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.body, self.headers = status, ErrorBody(message=message, type=type, param=param,
                                                                 code=code), headers


def error_json(e: APIError) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=e.body).model_dump(), status_code=e.status, headers=e.headers)


OPEN_PATHS = ("/health", "/metrics")  # open with an API key too, as in vLLM: for load balancers and Prometheus


class RequireApiKey:
    """ASGI middleware (vLLM's --api-key): every path but OPEN_PATHS (the /v1 API, /tokenize, /detokenize, the
    OpenAPI pages) needs `Authorization: Bearer <key>`, compared in constant time, else 401 with an OpenAI error
    object. Closed by default, so that no route is left open by a path spelled another way."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode("utf-8")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = _bearer(scope["headers"])
            if given is None or not hmac.compare_digest(given, self.key):
                message = ("no API key: send it as `Authorization: Bearer <key>`" if given is None else
                           "incorrect API key")
                e = APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await error_json(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _bearer(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the request's first Authorization header if its scheme is Bearer (any case), else None."""
    value = next((v for k, v in headers if k == b"authorization"), None)
    scheme, _, token = (value or b"").strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" and token.strip() else None


def _type_tag(part) -> bool:
    """Whether a pydantic error location part names a union member (str, float, list[int], ...), not a field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "list", "dict") or "[" in part
                                      or part.startswith(("function-", "literal", "constrained")))


def refuse(condition, option: str) -> None:
    if condition:
        raise APIError(400, f"{option} is not supported by multispec serve", param=option, code="unsupported")


# fields accepted only at their default value: (name, is-default test) -> refused by name otherwise
_DEFAULT_ONLY = (
    ("best_of", lambda v: v in (None, 1)), ("use_beam_search", lambda v: v is False),
    ("length_penalty", lambda v: v == 1), ("include_stop_str_in_output", lambda v: v is False),
    ("truncate_prompt_tokens", lambda v: v is None), ("allowed_token_ids", lambda v: v is None),
    ("bad_words", lambda v: v in (None, [])), ("prompt_logprobs", lambda v: v is None),
)
STRUCTURED_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}  # vLLM's


def structured_fields(req) -> tuple[str | None, dict]:
    """The request's structured-output constraint as SamplingParams fields, from whichever one field carries it:
    OpenAI's response_format (json_object: any JSON object; json_schema: its `schema`), vLLM's structured_outputs
    ({json | regex | choice | grammar | json_object}) or the older guided_json / guided_regex / guided_choice /
    guided_grammar. Returns (the field that carried it, or None; the fields). Two carriers at once are refused by
    name."""
    found: list[tuple[str, dict]] = []
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type == "json_object":
        found.append(("response_format", {"json_schema": {"type": "object"}}))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None:
            raise APIError(400, "response_format.json_schema is required with type json_schema (OpenAI's {\"name\": "
                           "..., \"schema\": {...}})", param="response_format.json_schema")
        spec = rf.json_schema
        if not isinstance(spec.get("schema", {}), (dict, bool)):
            raise APIError(400, "response_format.json_schema.schema must be a JSON schema object",
                           param="response_format.json_schema.schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise APIError(400, "response_format.json_schema.strict must be a boolean",
                           param="response_format.json_schema.strict")
        schema = spec.get("schema", {})  # OpenAI: absent = any JSON
        # strict (the default): objects take only their declared keys (structured.py closes them); strict false:
        # the schema's own JSON Schema meaning, extra keys allowed where it does not say otherwise
        found.append(("response_format", {"json_schema": schema if strict is not False
                                          else with_additional_properties(schema, True)}))
    so = getattr(req, "structured_outputs", None)
    if so is not None:
        if not isinstance(so, dict):
            raise APIError(400, "structured_outputs must be an object with one of json, regex, choice, grammar, "
                           "json_object", param="structured_outputs")
        given = {k: v for k, v in so.items() if v is not None and v is not False}
        unknown = [k for k in given if k not in (*STRUCTURED_KEYS, "json_object")]
        if unknown or len(given) != 1:
            raise APIError(400, "structured_outputs takes exactly one of json, regex, choice, grammar, json_object"
                           + (f" (unknown: {', '.join(unknown)})" if unknown else ""), param="structured_outputs")
        key, value = next(iter(given.items()))
        found.append(("structured_outputs", {"json_schema": {"type": "object"}} if key == "json_object"
                      else {STRUCTURED_KEYS[key]: value}))
    for key, field_name in STRUCTURED_KEYS.items():
        value = getattr(req, f"guided_{key}", None)
        if value is not None:
            found.append((f"guided_{key}", {field_name: value}))
    if len(found) > 1:
        raise APIError(400, f"give one structured-output field, not {' and '.join(n for n, _ in found)}",
                       param=found[1][0])
    return found[0] if found else (None, {})


class Edge:
    """Request validation that needs the model: prompt encoding, chat template, context length, then the request
    prepared by the Decoder (`prepare`). Tokenizing and preparing run off the event loop (`off_loop`): a long
    prompt must not hold up /health or other requests."""

    def __init__(self, settings: ServeSettings, decoder, max_model_len: int):
        self.settings = settings
        self.decoder = decoder
        self.tokenizer = decoder.pair.tokenizer
        self.context = max_model_len  # at most the Decoder's context (the smaller of target's and draft's positions)
        self.context_name = "this model's maximum context length" if max_model_len == decoder.context else \
            "this server's maximum context length (--max-model-len)"
        self.vocab = decoder.vocab_size
        self.max_concurrent = settings.max_concurrent  # create_app sets the scheduler's (max_batch with batching)
        self._lock = threading.Lock()  # fast tokenizers may refuse concurrent use ("Already borrowed")

    @staticmethod
    async def off_loop(fn, *args):
        return await asyncio.to_thread(fn, *args)

    async def parse(self, request: Request, model: type[BaseModel]):
        try:  # a client that stops sending half-way must not hold its connection for ever
            body = await asyncio.wait_for(request.body(), self.settings.read_timeout)
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within {self.settings.read_timeout} s",
                           code="read_timeout") from None
        if len(body) > self.settings.max_body_bytes:
            raise APIError(413, f"request body over {self.settings.max_body_bytes} bytes")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise APIError(400, f"the body is not valid UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start})") \
                from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise APIError(400, f"the body is not valid JSON: {str(e)[:200]}".encode("utf-8", "backslashreplace")
                           .decode("utf-8")) from None
        if not isinstance(data, dict):
            raise APIError(400, "the body must be a JSON object")
        try:  # JSON escapes can spell lone surrogates (\ud800), which are not text: no tokenizer or reply takes them
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(400, "the body holds a string that is not valid Unicode text (a lone surrogate escape "
                           "such as \\ud800)") from None
        except RecursionError:
            raise APIError(400, "the body is nested too deeply") from None
        try:
            req = model.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"] if not _type_tag(p))
            raise APIError(400, f"{loc or 'body'}: {err['msg']}", param=loc or None) from None
        except RecursionError:
            raise APIError(400, "the body is nested too deeply") from None
        if req.model is not None and req.model != self.settings.model_name:
            raise APIError(404, f"the model `{req.model}` does not exist; this server serves "
                           f"`{self.settings.model_name}`", param="model", code="model_not_found")
        for name, is_default in _DEFAULT_ONLY:
            if name in type(req).model_fields:
                refuse(not is_default(getattr(req, name)), name)
        return req

    def check_count(self, prompts: int, n: int) -> None:
        """Refuse more generations (prompts x n) than the server holds at once, naming `prompt` when the prompts
        alone are too many."""
        most = self.max_concurrent + self.settings.max_queue
        if prompts * n > most:
            raise APIError(400, f"the request asks for {prompts * n} generations ({prompts} prompt(s) x n {n}); this "
                           f"server holds at most {most} at once", param="prompt" if prompts > most else "n")

    def check_ids(self, ids: list[int], param: str, allow_empty: bool = False) -> list[int]:
        if not ids and not allow_empty:
            raise APIError(400, "the prompt is empty", param=param)
        if any(not 0 <= t < self.vocab for t in ids):
            raise APIError(400, f"token ids must be in [0, {self.vocab})", param=param)
        return ids

    def prompt_ids(self, prompt: str, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
        """As multispec.generate encodes a prompt (text.encode_prompt); add_special_tokens False: the text's own
        tokens only (vLLM's option)."""
        try:
            with self._lock:
                if add_special_tokens:
                    return encode_prompt(self.tokenizer, self.vocab, prompt)
                check_text(prompt, "the prompt")
                ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        except MultispecError as e:
            raise APIError(400, str(e), param=param) from None
        return self.check_ids(ids, param)

    def chat_ids(self, messages, add_special_tokens: bool = False, add_generation_prompt: bool = True,
                 tools: Tools | None = None) -> list[int]:
        """The messages rendered by the chat template (which places any BOS itself), then tokenized: as
        multispec.generate(messages=...) does (text.encode_chat) unless the request asks otherwise. tools: the
        request's, rendered by the template (one that has no tool support is refused, naming `tools`)."""
        template = self.settings.chat_template
        if template is None and not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions, or start the "
                           "server with --chat-template FILE", param="messages", code="no_chat_template")
        if tools is not None and not template_has_tools(template or self.tokenizer.chat_template):
            raise APIError(400, tools_refusal(self.settings.model_name), param="tools", code="no_tool_support")
        listed = tools.template_tools() if tools is not None else None
        try:
            rendered = chat_messages([m.for_template() for m in messages])
            with self._lock:
                if add_generation_prompt and not add_special_tokens:
                    return self.check_ids(encode_chat(self.tokenizer, self.vocab, rendered, template, listed),
                                          "messages")
                text = self.tokenizer.apply_chat_template(rendered, chat_template=template, tokenize=False, tools=listed,
                                                          add_generation_prompt=add_generation_prompt)
                ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        except MultispecError as e:
            raise APIError(400, str(e), param="messages") from None
        except Exception as e:  # noqa: BLE001 - Jinja raises its own errors (raise_exception in templates)
            raise APIError(400, f"the chat template refused these messages: {str(e)[:200]}",
                           param="messages") from None
        if not ids:
            raise APIError(400, "the chat template rendered an empty prompt", param="messages")
        return self.check_ids(ids, "messages")

    def decode(self, ids) -> str:
        with self._lock:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_strs(self, ids: list[int]) -> list[str]:
        with self._lock:
            return self.tokenizer.convert_ids_to_tokens(ids)

    def prepare(self, req, prompts: list[tuple[list[int], str]], max_tokens: int, logprobs: int | None = None,
                prompt_logprobs: bool = False, budget_param: str = "max_tokens",
                tool_grammar: str | None = None) -> list[PreparedRequest]:
        """Every generation the request asks for, prepared by the Decoder before any is queued (call off the event
        loop: it tokenizes nothing, but compiles a grammar): prompt i's sample j is index i * n + j, with seed +
        j. prompts: (token ids, the field that holds them: prompt, prompt.1, messages), named when too long;
        budget_param: the field max_tokens came from (max_tokens or max_completion_tokens), named when it is. The
        request's settings make one SamplingParams (its fields by name, SAMPLING_WIRE), checked once."""
        for ids, prompt_param in prompts:
            self._check_context(ids, max_tokens, prompt_param, budget_param)
        carrier, structured = structured_fields(req)
        if tool_grammar is not None:  # the calls' grammar (tools.Tools.grammar): the one constraint
            if carrier:
                raise APIError(400, f"{carrier} cannot be combined with tool_choice {req.tool_choice!r:.60} (or a "
                               "strict function): the tool calls' grammar is the output's constraint", param=carrier)
            carrier, structured = "tools", {"grammar": tool_grammar}
        settings = {name: getattr(req, name) for name in SAMPLING_WIRE if getattr(req, name) is not None}
        seeds = [req.seed + j if req.seed is not None else None for _ in prompts for j in range(req.n)]
        try:  # the request object, validated once, and the model's own checks, before the request is queued
            params = SamplingParams(max_new_tokens=max_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                                    **settings, **structured)
            return self.decoder.prepare_many([ids for ids, _ in prompts for _ in range(req.n)], params, seeds)
        except ParamError as e:  # OpenAI's name for the token budget
            message, param = str(e).replace("max_new_tokens", budget_param), e.param.replace("max_new_tokens",
                                                                                               budget_param)
            if param in STRUCTURED_KEYS.values() and carrier:
                param = carrier
            raise APIError(400, message, param=param) from None

    def _check_context(self, ids: list[int], max_tokens: int, prompt_param: str, budget_param: str) -> None:
        """The server's context rule (vLLM's, and its wording): a prompt and its budget past max_model_len are
        refused, not capped (the library caps max_new_tokens with a warning)."""
        field_name = prompt_param.split(".")[0]
        if len(ids) > self.context or (len(ids) == self.context and max_tokens > 0):  # scoring only fills them all
            raise APIError(400, f"{self.context_name} is {self.context} tokens. However, your {field_name} has "
                           f"{len(ids)} tokens, which leaves no room for the completion. Please reduce the length "
                           f"of the {field_name}.", param=prompt_param, code="context_length_exceeded")
        if len(ids) + max_tokens > self.context:
            raise APIError(400, f"{self.context_name} is {self.context} tokens. However, you requested "
                           f"{len(ids) + max_tokens} tokens ({len(ids)} in the {field_name}, {max_tokens} in the "
                           f"completion). Please reduce the length of the {field_name} or completion.",
                           param=budget_param, code="context_length_exceeded")
