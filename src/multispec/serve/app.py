"""The HTTP layer: OpenAI-compatible endpoints over the scheduler. No generation logic here: handlers validate a
request (pydantic, at the edge), turn it into a Job, and relay the scheduler's events as one JSON response or as
server-sent events (`data: {chunk}` lines, then `data: [DONE]`). Every refusal is an OpenAI-style error object.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from multispec.errors import MultispecError
from multispec.sampling import SamplingConfig
from multispec.serve.metrics import ServerMetrics
from multispec.serve.protocol import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                      ChatCompletionRequest, ChatCompletionResponse, CompletionChoice,
                                      CompletionRequest, CompletionResponse, Delta, ErrorBody, ErrorResponse,
                                      ModelCard, ModelList, SpecDecodeMetrics, Usage)
from multispec.serve.scheduler import Job, QueueFull, Scheduler, decoder_generate
from multispec.text import encode_prompt

log = logging.getLogger("multispec.serve")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class ServeSettings:
    """model_name: the id clients pass as `model`. method None: generate's own default method. chat_template: a
    Jinja template overriding the tokenizer's. request_timeout: seconds from arrival (queueing included)."""

    model_name: str
    method: str | None = None
    method_options: dict = field(default_factory=dict)
    backend: str = "hf"
    max_concurrent: int = 2
    max_queue: int = 32
    max_batch: int = 1  # > 1: continuous batching over that many slots (the fast backend); max_concurrent follows
    request_timeout: float = 600.0
    retry_after_s: int = 1
    chat_template: str | None = None
    max_body_bytes: int = 1 << 20


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.body, self.headers = status, ErrorBody(message=message, type=type, param=param,
                                                                 code=code), headers


def _error_json(e: APIError) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=e.body).model_dump(), status_code=e.status, headers=e.headers)


def create_app(pair, settings: ServeSettings, generate_fn=None) -> FastAPI:
    """The ASGI app serving `pair`: one Decoder per worker, built here (the method and its trained models are
    checked and read now, once). generate_fn(decoder, prompt_ids, **sampling) -> GenerationResult: the Decoder's
    own `generate` unless given (tests pass a blocking one)."""
    from multispec.decoding.decoder import Decoder
    from multispec.decoding.methods import DEFAULT_METHOD

    decoder = Decoder(pair, settings.method or DEFAULT_METHOD, settings.backend, **settings.method_options)
    scheduler = Scheduler(decoder, settings.max_concurrent, settings.max_queue, generate_fn or decoder_generate,
                          settings.max_batch)
    metrics = ServerMetrics(scheduler)
    app = FastAPI(title="multispec", summary="OpenAI-compatible server with lossless speculative decoding")
    app.state.scheduler, app.state.metrics, app.state.settings = scheduler, metrics, settings
    app.router.add_event_handler("shutdown", scheduler.shutdown)
    live: dict[int, object] = {}  # id -> Run of every request still being answered

    def stop_all() -> int:
        """Answer every request in flight with a 503 error object and stop its generation at its next committed
        text (queued ones before they start). Call on the event loop (`multispec serve` does on a second Ctrl-C, or
        when the first signal's drain time is up). Returns how many were stopped."""
        runs = list(live.values())
        for run in runs:
            run.cancel.set()
            run.events.put_nowait(("shutdown", None))
        return len(runs)

    app.state.live_runs, app.state.stop_all = live, stop_all
    edge = _Edge(settings, decoder)
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        metrics.request_rejected.labels(reason="queue_full" if e.status == 429 else "invalid").inc()
        return _error_json(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        return _error_json(APIError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("unhandled error")
        return _error_json(APIError(500, f"internal error: {type(e).__name__}", type="internal_error"))

    @app.get("/health")
    async def health():
        return {"status": "ok", "running": scheduler.running, "waiting": scheduler.waiting}

    @app.get("/v1/models", response_model=ModelList)
    async def models():
        return ModelList(data=[ModelCard(id=settings.model_name, created=created, max_model_len=edge.context)])

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions", response_model=CompletionResponse)
    async def completions(request: Request):
        req = await edge.parse(request, CompletionRequest)
        _refuse(req.logprobs is not None, "logprobs")
        _refuse(req.echo, "echo")
        _refuse(req.suffix is not None, "suffix")
        ids = edge.prompt_ids(req.prompt)
        job = edge.job(req, ids, req.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS)
        return await _respond(request, req, job, chat=False)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse)
    async def chat_completions(request: Request):
        req = await edge.parse(request, ChatCompletionRequest)
        _refuse(req.logprobs or req.top_logprobs is not None, "logprobs")
        ids = edge.chat_ids(req)
        max_tokens = req.max_completion_tokens or req.max_tokens
        job = edge.job(req, ids, max_tokens if max_tokens is not None else max(1, edge.context - len(ids)))
        return await _respond(request, req, job, chat=True)

    async def _respond(request: Request, req, job: Job, chat: bool):
        try:
            run = scheduler.submit(job)
        except QueueFull:
            raise APIError(429, f"the server is at capacity ({scheduler.max_concurrent} running, {settings.max_queue} "
                           "queued); retry later", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(settings.retry_after_s)}) from None
        reply = _Reply(req, job, run, chat, settings, metrics, request, live)
        if req.stream:
            return StreamingResponse(reply.sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await reply.whole()

    return app


def _refuse(condition, option: str) -> None:
    if condition:
        raise APIError(400, f"{option} is not supported by multispec serve", param=option, code="unsupported")


class _Edge:
    """Request validation that needs the model: prompt encoding, chat template, context length."""

    def __init__(self, settings: ServeSettings, decoder):
        self.settings = settings
        self.reproducible_when_seeded = decoder.entry.reproducible_when_seeded  # the served method's default
        self.tokenizer = decoder.pair.tokenizer
        self.context = decoder.context  # the Decoder's: the smaller of target's and draft's positions, or None
        self.vocab = decoder.vocab_size
        self._lock = threading.Lock()  # fast tokenizers may refuse concurrent use ("Already borrowed")

    async def parse(self, request: Request, model: type[BaseModel]):
        body = await request.body()
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
            loc = ".".join(str(p) for p in err["loc"])
            raise APIError(400, f"{loc or 'body'}: {err['msg']}", param=loc or None) from None
        except RecursionError:
            raise APIError(400, "the body is nested too deeply") from None
        if req.model is not None and req.model != self.settings.model_name:
            raise APIError(404, f"the model `{req.model}` does not exist; this server serves "
                           f"`{self.settings.model_name}`", param="model", code="model_not_found")
        _refuse(req.presence_penalty != 0, "presence_penalty")
        _refuse(req.frequency_penalty != 0, "frequency_penalty")
        return req

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """As multispec.generate encodes a prompt (text.encode_prompt)."""
        try:
            with self._lock:
                return encode_prompt(self.tokenizer, self.vocab, prompt)
        except MultispecError as e:
            raise APIError(400, str(e), param="prompt") from None

    def chat_ids(self, req: ChatCompletionRequest) -> list[int]:
        """The messages rendered by the chat template (which places any BOS itself), then tokenized."""
        template = self.settings.chat_template
        if template is None and not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions, or start the "
                           "server with --chat-template FILE", param="messages", code="no_chat_template")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            with self._lock:
                text = self.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                                          add_generation_prompt=True)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        except Exception as e:  # noqa: BLE001 - Jinja raises its own errors (raise_exception in templates)
            raise APIError(400, f"the chat template refused these messages: {str(e)[:200]}",
                           param="messages") from None
        if not ids:
            raise APIError(400, "the chat template rendered an empty prompt", param="messages")
        return ids

    def job(self, req, ids: list[int], max_tokens: int) -> Job:
        if self.context is not None and len(ids) + max_tokens > self.context:
            raise APIError(400, f"this model's maximum context length is {self.context} tokens; the request asks "
                           f"for {len(ids) + max_tokens} ({len(ids)} in the prompt, {max_tokens} to generate)",
                           param="max_tokens", code="context_length_exceeded")
        top_k = None if req.top_k in (None, -1, 0) else req.top_k
        temperature = None if req.temperature is None else float(req.temperature)
        top_p = None if req.top_p is None else float(req.top_p)
        try:  # generate's own check, before the request is queued
            SamplingConfig(temperature=1.0 if temperature is None else temperature, top_k=top_k, top_p=top_p)
        except MultispecError as e:
            raise APIError(400, str(e)) from None
        seed = req.seed if req.seed is not None else secrets.randbelow(2**31)
        # the library's default mode is decided by whether a seed was given, so the server keeps that distinction
        reproducible = req.reproducible if req.reproducible is not None else (
            self.reproducible_when_seeded and req.seed is not None)
        return Job(prompt_ids=ids, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   seed=seed, stop=req.stop, reproducible=reproducible)


class _Reply:
    """Relays one run's events to its client, as one response or as server-sent events."""

    def __init__(self, req, job: Job, run, chat: bool, settings: ServeSettings, metrics: ServerMetrics,
                 request: Request, live: dict | None = None):
        self.req, self.job, self.run, self.chat = req, job, run, chat
        self.live = {} if live is None else live
        self.live[id(run)] = run
        self.settings, self.metrics, self.request = settings, metrics, request
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.deadline = run.arrived + settings.request_timeout
        self.first_text_at: float | None = None

    async def events(self):
        """The run's events; ("tick", None) about once a second while waiting; ("timeout", None) at the deadline,
        after cancelling the run. ("shutdown", None): the server is stopping (create_app's stop_all)."""
        try:
            async for event in self._events():
                yield event
        finally:
            self.live.pop(id(self.run), None)

    async def _events(self):
        while True:
            left = self.deadline - time.perf_counter()
            if left <= 0:
                self.run.cancel.set()
                self.metrics.request_rejected.labels(reason="timeout").inc()
                yield "timeout", None
                return
            try:
                kind, payload = await asyncio.wait_for(self.run.events.get(), min(left, 1.0))
            except asyncio.TimeoutError:
                yield "tick", None
                continue
            if kind == "text" and self.first_text_at is None:
                self.first_text_at = time.perf_counter()
                self.metrics.ttft.observe(self.first_text_at - self.run.arrived)
            yield kind, payload
            if kind != "text":
                return

    def _finished(self, result) -> tuple[Usage, SpecDecodeMetrics]:
        stats = result.stats
        usage = Usage(prompt_tokens=len(self.job.prompt_ids), completion_tokens=len(result.token_ids),
                      total_tokens=len(self.job.prompt_ids) + len(result.token_ids))
        spec = SpecDecodeMetrics(**{k: stats[k] for k in SpecDecodeMetrics.model_fields})
        now = time.perf_counter()
        if self.first_text_at is None:  # nothing was streamed (empty text): the first token came with the end
            self.metrics.ttft.observe(now - self.run.arrived)
        self.metrics.finished(stats, usage.prompt_tokens, usage.completion_tokens, result.finish_reason,
                              now - self.run.arrived)
        return usage, spec

    def _failure(self, kind: str, payload) -> APIError:
        if kind == "shutdown":
            return APIError(503, "the server is shutting down; the generation was stopped", type="server_error",
                            code="shutting_down")
        if kind == "timeout":
            return APIError(504, f"the request did not finish within --request-timeout {self.settings.request_timeout}"
                            " s", type="timeout_error", code="timeout")
        if isinstance(payload, MultispecError):
            self.metrics.request_rejected.labels(reason="invalid").inc()
            return APIError(400, str(payload))
        self.metrics.request_rejected.labels(reason="error").inc()
        return APIError(500, f"generation failed: {type(payload).__name__}", type="internal_error")

    async def whole(self):
        """Wait for the end; a client that goes away cancels the run (checked about once a second)."""
        next_check = time.perf_counter() + 1.0
        async for kind, payload in self.events():
            if kind in ("tick", "text") and time.perf_counter() >= next_check:
                next_check = time.perf_counter() + 1.0
                if await self.request.is_disconnected():
                    self.run.cancel.set()
                    self.metrics.request_rejected.labels(reason="cancelled").inc()
                    return Response(status_code=499)
            if kind == "done":
                result = payload
                usage, spec = self._finished(result)
                ids = result.token_ids if self.req.return_token_ids else None
                if self.chat:
                    return ChatCompletionResponse(
                        id=self.id, created=self.created, model=self.settings.model_name, usage=usage,
                        spec_decode=spec, choices=[ChatChoice(message=AssistantMessage(content=result.text),
                                                              finish_reason=result.finish_reason, token_ids=ids)])
                return CompletionResponse(
                    id=self.id, created=self.created, model=self.settings.model_name, usage=usage, spec_decode=spec,
                    choices=[CompletionChoice(text=result.text, finish_reason=result.finish_reason, token_ids=ids)])
            if kind in ("error", "timeout", "cancelled", "shutdown"):
                return _error_json(self._failure(kind, payload))

    async def sse(self):
        """data: chunk lines, then data: [DONE]. The generation's own stream never passes a stop string and its
        deltas add up to the final text (text.Streamer), so they are relayed as they come. A client that
        disconnects closes this generator: the run is cancelled in `finally`."""
        sent = ""
        ended = False
        try:
            if self.chat:
                yield self._sse(self._chunk(Delta(role="assistant", content="")))
            async for kind, payload in self.events():
                if kind == "text":
                    sent += payload
                    yield self._sse(self._chunk(Delta(content=payload) if self.chat else payload))
                elif kind == "done":
                    result = payload
                    usage, spec = self._finished(result)
                    rest = result.text[len(sent):] if result.text.startswith(sent) else ""
                    if rest:
                        yield self._sse(self._chunk(Delta(content=rest) if self.chat else rest))
                    ids = result.token_ids if self.req.return_token_ids else None
                    yield self._sse(self._chunk(Delta() if self.chat else "", result.finish_reason, spec, ids))
                    if self.req.stream_options is not None and self.req.stream_options.include_usage:
                        yield self._sse(self._usage_chunk(usage))
                    ended = True
                elif kind in ("error", "timeout", "cancelled", "shutdown"):
                    ended = True
                    yield self._sse(ErrorResponse(error=self._failure(kind, payload).body))
            yield "data: [DONE]\n\n"
        finally:
            if not ended:
                self.run.cancel.set()
                self.metrics.request_rejected.labels(reason="cancelled").inc()

    def _chunk(self, content, finish_reason=None, spec=None, token_ids=None) -> BaseModel:
        if self.chat:
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.settings.model_name,
                                       spec_decode=spec, choices=[ChatChunkChoice(
                                           delta=content, finish_reason=finish_reason, token_ids=token_ids)])
        return CompletionResponse(id=self.id, created=self.created, model=self.settings.model_name, spec_decode=spec,
                                  choices=[CompletionChoice(text=content, finish_reason=finish_reason,
                                                            token_ids=token_ids)])

    def _usage_chunk(self, usage: Usage) -> BaseModel:
        if self.chat:
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.settings.model_name, choices=[],
                                       usage=usage)
        return CompletionResponse(id=self.id, created=self.created, model=self.settings.model_name, choices=[],
                                  usage=usage)

    @staticmethod
    def _sse(body: BaseModel) -> str:
        return f"data: {body.model_dump_json(exclude_none=True)}\n\n"
