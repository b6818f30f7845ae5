"""The HTTP layer: OpenAI-compatible endpoints over the scheduler. No generation logic here: handlers validate a
request (pydantic, at the edge), prepare it (Decoder.prepare, off the event loop), and relay the scheduler's events as one JSON response or as
server-sent events (`data: {chunk}` lines, then `data: [DONE]`). Every refusal is an OpenAI-style error object.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from multispec.decoding.request import PreparedRequest
from multispec.errors import MultispecError
from multispec.params import ParamError
from multispec.serve.edge import APIError, Edge, RequireApiKey, ServeSettings, error_json, refuse, structured_fields
from multispec.serve.memory import cache_report, choose_max_model_len
from multispec.serve.metrics import ServerMetrics
from multispec.serve.protocol import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                      ChatCompletionRequest, ChatCompletionResponse, CompletionChoice,
                                      CompletionRequest, CompletionResponse, Delta, DetokenizeRequest,
                                      DetokenizeResponse, ErrorResponse, FunctionDelta, ModelCard, ModelList,
                                      ResponseMetrics, SpecDecodeMetrics, SpeculativeDecoding, TokenizeRequest,
                                      TokenizeResponse, ToolCall, ToolCallDelta, Usage)
from multispec.serve.scheduler import QueueFull, Scheduler, decoder_generate
from multispec.tool_calls import ToolCallParser, calls_of
from multispec.tools import Tools
from multispec.serve.shapes import (StreamedLogprobs, TokenText, chat_logprobs, completion_logprobs,
                                    text_offsets)

__all__ = ["APIError", "ServeSettings", "create_app"]

log = logging.getLogger("multispec.serve")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def create_app(pair, settings: ServeSettings, generate_fn=None) -> FastAPI:
    """The ASGI app serving `pair`: one Decoder per worker, built here (the method and its trained models are
    checked and read now, once), and the batch slots' caches. generate_fn(decoder, PreparedRequest, stream=,
    stream_chunks=) -> GenerationResult: the Decoder's own `run_prepared` unless given (tests pass a blocking one). app.state.cache_report:
    the caches' memory, one line for start-up."""
    from multispec.decoding.decoder import Decoder
    from multispec.decoding.methods import DEFAULT_METHOD

    decoder = Decoder(pair, settings.method or DEFAULT_METHOD, settings.backend, profile=settings.profile,
                      **settings.method_options)
    decoder.machine.learning = settings.profile_learning
    generations = settings.max_batch if settings.max_batch > 1 else settings.max_concurrent
    max_model_len, why = choose_max_model_len(decoder, generations, settings.max_model_len)
    scheduler = Scheduler(decoder, settings.max_concurrent, settings.max_queue, generate_fn or decoder_generate,
                          settings.max_batch, max_model_len=max_model_len)
    metrics = ServerMetrics(scheduler, settings.model_name)
    app = FastAPI(title="multispec", summary="OpenAI-compatible server with lossless speculative decoding")
    if settings.api_key is not None:
        app.add_middleware(RequireApiKey, key=settings.api_key)
    app.state.scheduler, app.state.metrics, app.state.settings = scheduler, metrics, settings
    app.state.cache_report = cache_report(scheduler, why)
    app.router.add_event_handler("shutdown", scheduler.shutdown)
    app.router.add_event_handler("shutdown", lambda: save_observed_profile(decoder))
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
    edge = Edge(settings, decoder, max_model_len)
    edge.max_concurrent = scheduler.max_concurrent
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        metrics.request_rejected.labels(reason="queue_full" if e.status == 429 else "invalid").inc()
        return error_json(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        return error_json(APIError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("unhandled error")
        return error_json(APIError(500, f"internal error: {type(e).__name__}", type="internal_error"))

    @app.get("/health")
    @app.head("/health", include_in_schema=False)  # one operation in the OpenAPI schema (no duplicate id)
    async def health():
        return {"status": "ok", "running": scheduler.running, "waiting": scheduler.waiting}

    def card() -> ModelCard:
        return ModelCard(id=settings.model_name, created=created, max_model_len=edge.context)

    @app.get("/v1/models", response_model=ModelList)
    async def models():
        return ModelList(data=[card()])

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard)
    async def model(model_id: str):  # the openai client's models.retrieve
        if model_id != settings.model_name:
            raise APIError(404, f"the model `{model_id}` does not exist; this server serves `{settings.model_name}`",
                           param="model", code="model_not_found")
        return card()

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize", response_model=TokenizeResponse)
    @app.post("/v1/tokenize", response_model=TokenizeResponse, include_in_schema=False)
    async def tokenize(request: Request):
        req = await edge.parse(request, TokenizeRequest)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give exactly one of `prompt` and `messages`", param="prompt")
        if req.prompt is not None:
            ids = await edge.off_loop(edge.prompt_ids, req.prompt, req.add_special_tokens is not False)
        else:
            ids = await edge.off_loop(edge.chat_ids, req.messages, bool(req.add_special_tokens),
                                      req.add_generation_prompt)
        strs = await edge.off_loop(edge.token_strs, ids) if req.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=edge.context, tokens=ids, token_strs=strs)

    @app.post("/detokenize", response_model=DetokenizeResponse)
    @app.post("/v1/detokenize", response_model=DetokenizeResponse, include_in_schema=False)
    async def detokenize(request: Request):
        req = await edge.parse(request, DetokenizeRequest)
        edge.check_ids(req.tokens, "tokens", allow_empty=True)
        return DetokenizeResponse(prompt=await edge.off_loop(edge.decode, req.tokens))

    @app.post("/v1/completions", response_model=CompletionResponse)
    async def completions(request: Request):
        req = await edge.parse(request, CompletionRequest)
        refuse(req.suffix is not None, "suffix")
        max_tokens = _first_set(req.max_tokens, req.max_completion_tokens, COMPLETION_DEFAULT_MAX_TOKENS)
        if max_tokens == 0 and not req.echo:
            raise APIError(400, "max_tokens: 0 is allowed only with echo (to score the prompt); give at least 1",
                           param="max_tokens")
        edge.check_count(len(req.prompt), req.n)
        prompts = []
        for i, prompt in enumerate(req.prompt):
            param = "prompt" if len(req.prompt) == 1 else f"prompt.{i}"
            if isinstance(prompt, str):
                ids = await edge.off_loop(edge.prompt_ids, prompt, req.add_special_tokens, param)
            else:
                ids = edge.check_ids(prompt, param)
            prompts.append((prompt, ids, param))
        # an echoed prompt is scored when logprobs are asked for, and always with max_tokens 0 (a prefill only)
        score_prompt = req.echo and (req.logprobs is not None or max_tokens == 0)
        budget = "max_tokens" if req.max_tokens is not None or req.max_completion_tokens is None else \
            "max_completion_tokens"
        jobs = await edge.off_loop(edge.prepare, req, [(ids, param) for _, ids, param in prompts], max_tokens,
                                   req.logprobs, score_prompt, budget)
        texts = [p if isinstance(p, str) else None for p, _, _ in prompts for _ in range(req.n)]
        return await _respond(request, req, jobs, chat=False, prompt_texts=texts)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse)
    async def chat_completions(request: Request):
        req = await edge.parse(request, ChatCompletionRequest)
        for name in ("functions", "function_call", "audio", "modalities", "prediction", "reasoning_effort",
                     "chat_template_kwargs"):
            value = getattr(req, name)
            refuse(value is not None and value not in ([], {}, "none", "auto"), name)
        refuse(req.echo, "echo")
        refuse(req.continue_final_message, "continue_final_message")
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        edge.check_count(1, req.n)
        try:
            tools = Tools.of(req.tools, req.tool_choice, req.parallel_tool_calls)
        except ParamError as e:
            raise APIError(400, str(e), param=e.param) from None
        ids = await edge.off_loop(edge.chat_ids, req.messages, False, req.add_generation_prompt, tools)
        grammar = tools.grammar(edge.tokenizer) if tools is not None else None
        max_tokens = _first_set(req.max_completion_tokens, req.max_tokens, None)
        if max_tokens == 0:
            raise APIError(400, "max_tokens must be at least 1", param="max_tokens")
        if max_tokens is None:
            max_tokens = max(1, edge.context - len(ids))
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        budget = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        jobs = await edge.off_loop(edge.prepare, req, [(ids, "messages")], max_tokens, logprobs, False, budget,
                                   grammar)
        return await _respond(request, req, jobs, chat=True, tools=tools if tools is not None and tools.parse else None)

    async def _respond(request: Request, req, jobs: list[PreparedRequest], chat: bool, prompt_texts=None, tools=None):
        runs = []
        try:
            for job in jobs:
                runs.append(scheduler.submit(job))
        except QueueFull:
            for run in runs:  # all or nothing: the admitted part of this request is withdrawn
                run.cancel.set()
            raise APIError(429, f"the server is at capacity ({scheduler.max_concurrent} running, {settings.max_queue} "
                           "queued); retry later", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(settings.retry_after_s)}) from None
        reply = _Reply(req, jobs, runs, chat, settings, metrics, request, live, edge, prompt_texts, tools)
        if req.stream:
            return StreamingResponse(reply.sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await reply.whole()

    return app


def save_observed_profile(decoder) -> None:
    """At shutdown, a server on the cache folder's default profile keeps what its requests observed (acceptance,
    cost drift) for the next start; a server given a profile writes nothing."""
    if decoder.machine.is_default and len(decoder.observations):
        from multispec.profile import MachineProfile

        decoder.updated_profile().save(MachineProfile.default_path())


def _first_set(*values):
    return next((v for v in values if v is not None), None)


class _Reply:
    """Relays a request's runs (one per prompt and sample; choice index i is runs[i]) to its client, as one
    response or as server-sent events."""

    def __init__(self, req, jobs: list[PreparedRequest], runs: list, chat: bool, settings: ServeSettings, metrics: ServerMetrics,
                 request: Request, live: dict | None, edge: Edge, prompt_texts: list | None = None, tools=None):
        self.req, self.jobs, self.runs, self.chat = req, jobs, runs, chat
        self.tools = tools  # the request's Tools when its output's calls are parsed (else None)
        self.live = {} if live is None else live
        for run in runs:
            self.live[id(run)] = run
        self.settings, self.metrics, self.request, self.edge = settings, metrics, request, edge
        self.prompt_texts = prompt_texts or [None] * len(runs)
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.arrived = min(run.arrived for run in runs)
        self.deadline = self.arrived + settings.request_timeout
        self.first_text_at: float | None = None
        self.token_text = TokenText(edge.tokenizer, req.return_tokens_as_token_ids)

    def cancel(self) -> None:
        for run in self.runs:
            run.cancel.set()

    async def events(self):
        """(index, kind, payload) of every run until each has ended; (None, "tick", None) about once a second
        while waiting; (None, "timeout", None) at the deadline, after cancelling the runs. ("shutdown": the server
        is stopping, create_app's stop_all.)"""
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, run):
            while True:
                kind, payload = await run.events.get()
                await merged.put((index, kind, payload))
                if kind != "text":
                    return

        pumps = [asyncio.ensure_future(pump(i, run)) for i, run in enumerate(self.runs)]
        open_runs = len(self.runs)
        try:
            while open_runs:
                left = self.deadline - time.perf_counter()
                if left <= 0:
                    self.cancel()
                    self.metrics.request_rejected.labels(reason="timeout").inc()
                    yield None, "timeout", None
                    return
                try:
                    index, kind, payload = await asyncio.wait_for(merged.get(), min(left, 1.0))
                except asyncio.TimeoutError:
                    yield None, "tick", None
                    continue
                if kind == "text" and self.first_text_at is None:
                    self.first_text_at = time.perf_counter()
                    self.metrics.ttft.observe(self.first_text_at - self.arrived)
                if kind != "text":
                    open_runs -= 1
                yield index, kind, payload
        finally:
            for task in pumps:
                task.cancel()
            for run in self.runs:
                self.live.pop(id(run), None)

    def _finished(self, index: int, result) -> tuple[Usage, SpecDecodeMetrics]:
        stats = result.stats
        prompt = len(self.jobs[index].prompt_ids)
        usage = Usage(prompt_tokens=prompt, completion_tokens=len(result.token_ids),
                      total_tokens=prompt + len(result.token_ids))
        spec = SpecDecodeMetrics(**{k: stats[k] for k in SpecDecodeMetrics.model_fields if k in stats})  # (model: optional)
        now = time.perf_counter()
        if self.first_text_at is None:  # nothing was streamed (empty text): the first token came with the end
            self.first_text_at = now
            self.metrics.ttft.observe(now - self.arrived)
        self.metrics.finished(stats, usage.prompt_tokens, usage.completion_tokens, result.finish_reason,
                              now - self.arrived)
        return usage, spec

    def _request_metrics(self, results: list) -> ResponseMetrics | None:
        """vLLM's per-request `metrics` object: for a request of one sequence only (as vLLM)."""
        if len(self.runs) != 1 or len(results) != 1:
            return None
        return ResponseMetrics(speculative_decoding=SpeculativeDecoding.of(results[0].stats))

    def _usage(self, usages: list[Usage]) -> Usage:
        """Prompt tokens counted once per prompt (n samples share one), completion tokens over every choice."""
        n = getattr(self.req, "n", 1)
        prompt = sum(u.prompt_tokens for i, u in enumerate(usages) if i % n == 0)
        completion = sum(u.completion_tokens for u in usages)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def _failure(self, kind: str, payload) -> APIError:
        if kind == "shutdown":
            return APIError(503, "the server is shutting down; the generation was stopped", type="server_error",
                            code="shutting_down")
        if kind == "timeout":
            return APIError(504, f"the request did not finish within --request-timeout {self.settings.request_timeout}"
                            " s", type="timeout_error", code="timeout")
        if isinstance(payload, MultispecError):
            self.metrics.request_rejected.labels(reason="invalid").inc()
            return APIError(400, str(payload), param=self._constraint_field(str(payload)))
        self.metrics.request_rejected.labels(reason="error").inc()
        return APIError(500, f"generation failed: {type(payload).__name__}", type="internal_error")

    def _constraint_field(self, message: str) -> str | None:
        """The request field that carried the constraint an error during generation names (a grammar that dead-ends
        past its first tokens): the structured-output field, or `tools`; None for any other error."""
        if not message.startswith(("json_schema:", "regex:", "choice:", "grammar:")):
            return None
        carrier, _ = structured_fields(self.req)
        return carrier or ("tools" if getattr(self.req, "tools", None) else None)

    def _echo_text(self, index: int) -> str:
        text = self.prompt_texts[index]
        return text if text is not None else self.edge.decode(self.jobs[index].prompt_ids)

    def _logprobs(self, index: int, result):
        """The choice's logprobs in its endpoint's shape (None when not asked for); runs off the event loop."""
        job = self.jobs[index]
        top = job.params.logprobs
        if top is None:
            return None
        if self.chat:
            return chat_logprobs(result.logprobs, self.token_text, top)
        entries, ids = list(result.logprobs), list(result.token_ids)
        offsets = text_offsets(self.edge.decode, ids, result.text)  # into the choice's text
        if self.req.echo:
            echo = self._echo_text(index)
            offsets = text_offsets(self.edge.decode, list(job.prompt_ids), echo) + [len(echo) + o for o in offsets]
            entries, ids = list(result.prompt_logprobs) + entries, list(job.prompt_ids) + ids
        return completion_logprobs(entries, ids, self.token_text, top, offsets)

    async def _choice(self, index: int, result):
        lp = await asyncio.to_thread(self._logprobs, index, result)
        ids = result.token_ids if self.req.return_token_ids else None
        if self.chat:
            content, calls, finish = result.text, [], result.finish_reason
            if self.tools is not None:  # the parser the stream uses, fed the whole text
                parser = ToolCallParser(self.tools.forced)
                content = "".join(calls_of(parser.feed(result.text) + parser.finish(), calls)) or None
                finish = _finish(parser, finish)
            message = AssistantMessage(content=content, tool_calls=[ToolCall(**c) for c in calls] or None)
            return ChatChoice(index=index, message=message, logprobs=lp, token_ids=ids, finish_reason=finish)
        text = (await asyncio.to_thread(self._echo_text, index)) + result.text if self.req.echo else result.text
        return CompletionChoice(index=index, text=text, finish_reason=result.finish_reason, logprobs=lp,
                                token_ids=ids, prompt_token_ids=list(self.jobs[index].prompt_ids)
                                if self.req.return_token_ids else None)

    async def whole(self):
        """Wait for every run's end; a client that goes away cancels them (checked about once a second)."""
        next_check = time.perf_counter() + 1.0
        results: dict[int, object] = {}
        async for index, kind, payload in self.events():
            if kind in ("tick", "text") and time.perf_counter() >= next_check:
                next_check = time.perf_counter() + 1.0
                if await self.request.is_disconnected():
                    self.cancel()
                    self.metrics.request_rejected.labels(reason="cancelled").inc()
                    return Response(status_code=499)
            if kind == "done":
                results[index] = payload
            elif kind in ("error", "timeout", "cancelled", "shutdown"):
                self.cancel()
                return error_json(self._failure(kind, payload))
        order = sorted(results)
        finished = [self._finished(i, results[i]) for i in order]
        usage = self._usage([u for u, _ in finished])
        spec = finished[0][1]
        choices = [await self._choice(i, results[i]) for i in order]
        name = self.settings.model_name
        request_metrics = self._request_metrics([results[i] for i in order])
        if self.chat:
            return ChatCompletionResponse(id=self.id, created=self.created, model=name, usage=usage,
                                          spec_decode=spec, metrics=request_metrics, choices=choices)
        return CompletionResponse(id=self.id, created=self.created, model=name, usage=usage, spec_decode=spec,
                                  metrics=request_metrics, choices=choices)

    async def sse(self):
        """data: chunk lines, then data: [DONE]. The generation's own stream never passes a stop string and its
        deltas add up to the final text (text.Streamer), so they are relayed as they come, tagged with their
        choice index. Logprobs (when asked for) come with the chunk of their tokens (text.StreamChunk), an echoed
        prompt's with the echo (sent once the prompt is scored); what no chunk carried comes with the choice's last.
        A client that disconnects closes this generator: the runs are cancelled in `finally`."""
        sent = [""] * len(self.runs)
        usages: dict[int, Usage] = {}
        finished: dict[int, object] = {}  # index -> its GenerationResult
        ended = False
        logprobs = [None if job.params.logprobs is None else
                    StreamedLogprobs(self.edge.decode, self.token_text, job.params.logprobs, self.chat)
                    for job in self.jobs]
        echo_waits = {i for i, lp in enumerate(logprobs) if lp is not None and self.req.echo and not self.chat}
        parsers = [ToolCallParser(self.tools.forced) for _ in self.runs] if self.tools is not None else None
        try:
            for i in range(len(self.runs)):
                if self.chat:
                    yield self._sse(self._chunk(i, Delta(role="assistant", content="")))
                elif self.req.echo and i not in echo_waits:
                    yield self._sse(self._chunk(i, await asyncio.to_thread(self._echo_text, i)))
            async for index, kind, payload in self.events():
                if index in echo_waits and kind in ("text", "done"):  # the echo, with the prompt's logprobs
                    echo_waits.discard(index)
                    echo = await asyncio.to_thread(self._echo_text, index)
                    lp = await asyncio.to_thread(logprobs[index].prompt, payload.prompt_logprobs,
                                                 list(self.jobs[index].prompt_ids), echo)
                    yield self._sse(self._chunk(index, echo, logprobs=lp))
                if kind == "text":
                    sent[index] += payload.text
                    lp = None
                    if logprobs[index] is not None and payload.token_ids and payload.logprobs is not None:
                        lp = await asyncio.to_thread(logprobs[index].chunk, payload.logprobs, payload.token_ids,
                                                     len(sent[index]))
                    if parsers is not None:  # logprobs go with the chunk of their tokens, shown or held
                        deltas = self._tool_deltas(parsers[index], payload.text) or \
                            ([Delta()] if lp is not None else [])
                        for i, delta in enumerate(deltas):
                            yield self._sse(self._chunk(index, delta, logprobs=lp if i == 0 else None))
                    elif payload.text or lp is not None:
                        yield self._sse(self._chunk(index, Delta(content=payload.text) if self.chat else payload.text,
                                                    logprobs=lp))
                elif kind == "done":
                    result = finished[index] = payload
                    usages[index], spec = self._finished(index, result)
                    rest = result.text[len(sent[index]):] if result.text.startswith(sent[index]) else ""
                    sent[index] += rest
                    lp, left = logprobs[index], None
                    if lp is not None and len(result.token_ids) > lp.count:
                        left = await asyncio.to_thread(lp.chunk, result.logprobs[lp.count:],
                                                       result.token_ids[lp.count:], len(sent[index]))
                    finish = result.finish_reason
                    if parsers is not None:
                        deltas = self._tool_deltas(parsers[index], rest, final=True) or \
                            ([Delta()] if left is not None else [])
                        for i, delta in enumerate(deltas):
                            yield self._sse(self._chunk(index, delta, logprobs=left if i == 0 else None))
                        finish = _finish(parsers[index], finish)
                    elif rest or left is not None:
                        yield self._sse(self._chunk(index, Delta(content=rest) if self.chat else rest, logprobs=left))
                    ids = result.token_ids if self.req.return_token_ids else None
                    yield self._sse(self._chunk(index, Delta() if self.chat else "", finish, spec, ids))
                elif kind in ("error", "timeout", "cancelled", "shutdown"):
                    self.cancel()
                    ended = True
                    yield self._sse(ErrorResponse(error=self._failure(kind, payload).body))
                    break
            if not ended:
                ended = True
                if self.req.stream_options is not None and self.req.stream_options.include_usage:
                    yield self._sse(self._usage_chunk(self._usage([usages[i] for i in sorted(usages)]),
                                                      self._request_metrics([finished[i] for i in sorted(finished)])))
            yield "data: [DONE]\n\n"
        finally:
            if not ended:
                self.cancel()
                self.metrics.request_rejected.labels(reason="cancelled").inc()

    @staticmethod
    def _tool_deltas(parser: ToolCallParser, text: str, final: bool = False) -> list[Delta]:
        """The deltas of streamed text whose tool calls are parsed (tools.ToolCallParser): content as it is known not
        to start a call; each call as OpenAI streams one, its id, type and name, then its arguments (in pieces as they
        are written where the grammar forces the call)."""
        n = parser.calls - 1  # the call that arguments belong to
        events = parser.feed(text) + (parser.finish() if final else [])
        deltas = []
        for kind, value in events:
            if kind == "content":
                deltas.append(Delta(content=value))
                continue
            if kind == "call":
                n, f = n + 1, value["function"]
                deltas.append(Delta(tool_calls=[ToolCallDelta(index=n, id=value["id"], type="function",
                                                              function=FunctionDelta(name=f["name"], arguments=""))]))
                value = f["arguments"]
            if value:
                deltas.append(Delta(tool_calls=[ToolCallDelta(index=n, function=FunctionDelta(arguments=value))]))
        return deltas

    def _chunk(self, index: int, content, finish_reason=None, spec=None, token_ids=None, logprobs=None) -> BaseModel:
        if self.chat:
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.settings.model_name,
                                       spec_decode=spec, choices=[ChatChunkChoice(
                                           index=index, delta=content, finish_reason=finish_reason,
                                           token_ids=token_ids, logprobs=logprobs)])
        return CompletionResponse(id=self.id, created=self.created, model=self.settings.model_name, spec_decode=spec,
                                  choices=[CompletionChoice(index=index, text=content, finish_reason=finish_reason,
                                                            token_ids=token_ids, logprobs=logprobs)])

    def _usage_chunk(self, usage: Usage, request_metrics: ResponseMetrics | None) -> BaseModel:
        """The final chunk (choices []): usage, and vLLM's per-request `metrics` where vLLM streams them."""
        if self.chat:
            return ChatCompletionChunk(id=self.id, created=self.created, model=self.settings.model_name, choices=[],
                                       usage=usage, metrics=request_metrics)
        return CompletionResponse(id=self.id, created=self.created, model=self.settings.model_name, choices=[],
                                  usage=usage, metrics=request_metrics)

    @staticmethod
    def _sse(body: BaseModel) -> str:
        return f"data: {body.model_dump_json(exclude_none=True)}\n\n"


def _finish(parser: ToolCallParser, reason: str) -> str:
    """A tool-parsed choice's finish_reason: tool_calls once it made calls, unless its end cut one off."""
    return "tool_calls" if parser.calls and not parser.cut else reason
