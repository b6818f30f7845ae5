"""The scheduler: the one owner of generation state in the server.

Admitted requests wait in a bounded queue for one of `max_concurrent` workers. There is one Decoder per worker,
built at start-up, and a worker takes a free Decoder for a whole generation. Two kinds:
- continuous batching (`max_batch` > 1, the fast backend): the Decoders are the lanes of one BatchGroup
  (decoding/batch.py), one slot each of shared batched caches, and the workers are generations on the group's one
  loop (no thread per request); the generations in flight run their forwards together as one batched forward per
  model, a request joins the batch at its first forward and leaves it (freeing its slot) when it ends — finished,
  stopped, cancelled or timed out. max_concurrent = max_batch.
- one sequence per forward (`max_batch` 1): Decoders from `Decoder.spawn` (trained models read once and shared),
  each owning its caches; the generations interleave round by round (torch releases the GIL inside its ops).
Memory is bounded by max_concurrent caches of at most max_model_len tokens (serve/memory.py). Beyond
max_concurrent + max_queue requests, `submit` raises QueueFull (HTTP 429).

Events flow from a generation to its request handler through an asyncio queue:
("text", text.StreamChunk) as text is committed (the delta, the tokens it covers and their logprobs), then exactly
one of ("done", GenerationResult), ("cancelled", None), ("error", exception). Cancelling a run (client gone,
timeout) sets its event; the stream callback then raises Cancelled inside the generation at the next
committed text, which unwinds `generate` and frees its caches.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from multispec.errors import MultispecError
from multispec.decoding.request import PreparedRequest
from multispec.text import StreamChunk

log = logging.getLogger("multispec.serve")


class QueueFull(Exception):
    """Every worker is busy and the queue is at --max-queue."""


class Cancelled(Exception):
    """Raised by a run's stream callback, inside its generation thread, once the run is cancelled."""


@dataclass
class Run:
    """An admitted job: its event queue (read on the event loop) and its cancellation flag (read in its thread)."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)

    def emit(self, kind: str, payload=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: the server is shutting down and nobody is listening
            pass


def decoder_generate(decoder, prepared: PreparedRequest, **kwargs):
    """How a worker runs a job: the Decoder's `run_prepared` (nothing checked again: the edge prepared it), with
    stream=, stream_chunks= (tests pass a stand-in with this signature)."""
    return decoder.run_prepared(prepared, **kwargs)


class Scheduler:
    """decoder: the first Decoder (the others are spawned from it, one per worker). generate_fn(decoder,
    PreparedRequest, stream=, stream_chunks=True) -> GenerationResult (stream gets text.StreamChunks; a stand-in may stream bare text, and ignore stream_chunks).
    max_model_len: the most tokens (prompt + output) a generation holds; batch slots are sized for it."""

    def __init__(self, decoder, max_concurrent: int, max_queue: int, generate_fn: Callable = decoder_generate,
                 max_batch: int = 1, *, max_model_len: int):
        self.decoder = decoder
        self.generate_fn = generate_fn
        self.max_model_len = max_model_len
        self.group = None
        if max_batch > 1:
            from multispec.decoding.batch import BatchGroup

            self.group = BatchGroup(decoder, max_batch, decoder.cache_rows(max_model_len))
            self.decoders, max_concurrent = list(self.group.lanes), max_batch
        else:
            self.decoders = [decoder] + [decoder.spawn() for _ in range(max_concurrent - 1)]  # one per worker
        self.on_start: Callable[[float], None] | None = None  # seconds queued, when a generation starts
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for d in self.decoders:
            self._free.put(d)
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.waiting = 0
        self.running = 0
        self.cancelled = 0  # runs that ended by cancellation (client gone or timeout)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_concurrent, thread_name_prefix="multispec-gen")  # one sequence each

    def submit(self, job: PreparedRequest) -> Run:
        """Admit a job (call on the event loop) or raise QueueFull."""
        with self._lock:
            if self.waiting + self.running >= self.max_concurrent + self.max_queue:
                raise QueueFull()
            self.waiting += 1
        run = Run(loop=asyncio.get_running_loop())
        if self.group is not None:
            self.group.submit(self._work, job, run)
        else:
            self._pool.submit(self._work, job, run)
        return run

    def _work(self, job: PreparedRequest, run: Run) -> None:
        with self._lock:
            self.waiting -= 1
            self.running += 1
        if self.on_start is not None:
            self.on_start(time.perf_counter() - run.arrived)
        try:
            if run.cancel.is_set():
                raise Cancelled()

            def on_text(piece) -> None:  # a StreamChunk (a stand-in generate_fn may stream bare text)
                if run.cancel.is_set():
                    raise Cancelled()
                run.emit("text", piece if isinstance(piece, StreamChunk) else StreamChunk(piece))

            decoder = self._free.get()  # never waits: at most max_concurrent jobs run at once
            try:
                result = self.generate_fn(decoder, job, stream=on_text, stream_chunks=True)
            finally:
                self._free.put(decoder)
            run.emit("done", result)
        except Cancelled:
            with self._lock:
                self.cancelled += 1
            run.emit("cancelled")
        except MultispecError as e:
            run.emit("error", e)
        except Exception as e:  # noqa: BLE001 - a failed generation must answer its request, not kill the worker
            log.exception("generation failed")
            run.emit("error", e)
        finally:
            with self._lock:
                self.running -= 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.group is not None:
            self.group.close(wait=False)  # the loop ends once its runs do (each as its request ends)
