"""The scheduler: the one owner of generation state in the server.

Admitted requests wait in a bounded queue for one of `max_concurrent` places. Two kinds:
- continuous batching (`max_batch` > 1, the fast backend): one BatchEngine (decoding/batch.py) with a slot of
  shared batched caches per place, driven by one loop thread (`while live: engine.step()`, no thread per request):
  each step runs one round of every generation in flight, their forwards of one model as one batched forward; a
  request takes a slot between steps and frees it when it ends — finished, stopped, cancelled or timed out.
  max_concurrent = max_batch.
- one sequence per forward (`max_batch` 1): one Decoder per worker thread, built at start-up (`Decoder.spawn`:
  trained models read once and shared), each owning its caches; the generations interleave round by round (torch
  releases the GIL inside its ops).
Memory is bounded by max_concurrent caches of at most max_model_len tokens (serve/memory.py). Beyond
max_concurrent + max_queue requests, `submit` raises QueueFull (HTTP 429).

Events flow from a generation to its request handler through an asyncio queue:
("text", text.StreamChunk) as text is committed (the delta, the tokens it covers and their logprobs), then exactly
one of ("done", GenerationResult), ("cancelled", None), ("error", exception). Cancelling a run (client gone,
timeout) sets its event; the stream callback then raises Cancelled inside the generation at the next
committed text (the batch loop also cancels it before its next step), which ends it and frees its caches.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
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
    PreparedRequest, stream=, stream_chunks=True) -> GenerationResult (stream gets text.StreamChunks; a stand-in may
    stream bare text, and ignore stream_chunks; one sequence per forward only). max_model_len: the most tokens
    (prompt + output) a generation holds; batch slots are sized for it."""

    def __init__(self, decoder, max_concurrent: int, max_queue: int, generate_fn: Callable = decoder_generate,
                 max_batch: int = 1, *, max_model_len: int):
        self.decoder = decoder
        self.generate_fn = generate_fn
        self.max_model_len = max_model_len
        self.batch = None
        if max_batch > 1:
            from multispec.decoding.batch import BatchEngine

            self.batch = BatchEngine(decoder, max_batch, decoder.cache_rows(max_model_len))
            max_concurrent = max_batch
            self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # (job, run) from the event loop; None: shut down
            self._loop_thread = threading.Thread(target=self._batch_loop, name="multispec-batch-loop", daemon=True)
            self._loop_thread.start()
        else:
            self.decoders = [decoder] + [decoder.spawn() for _ in range(max_concurrent - 1)]  # one per worker
            self._free: queue.SimpleQueue = queue.SimpleQueue()
            for d in self.decoders:
                self._free.put(d)
            self._pool = ThreadPoolExecutor(max_concurrent, thread_name_prefix="multispec-gen")  # one sequence each
        self.on_start: Callable[[float], None] | None = None  # seconds queued, when a generation starts
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.waiting = 0
        self.running = 0
        self.cancelled = 0  # runs that ended by cancellation (client gone or timeout)
        self._lock = threading.Lock()

    def submit(self, job: PreparedRequest) -> Run:
        """Admit a job (call on the event loop) or raise QueueFull."""
        with self._lock:
            if self.waiting + self.running >= self.max_concurrent + self.max_queue:
                raise QueueFull()
            self.waiting += 1
        run = Run(loop=asyncio.get_running_loop())
        if self.batch is not None:
            self._inbox.put((job, run))
        else:
            self._pool.submit(self._work, job, run)
        return run

    def alive(self) -> bool:
        """False once the batch loop thread has died (a replica's health check); worker threads are per job."""
        return self.batch is None or self._loop_thread.is_alive()

    def cache_usage(self) -> float:
        """The share of the cache slots in use, in [0, 1]: batch slots holding a sequence, or, one sequence per
        worker, busy workers (each owns its caches). Read from any thread (a gauge's scrape)."""
        if self.batch is not None:
            return (self.batch.slots - self.batch.free) / self.batch.slots
        return min(1.0, max(0, self.running) / self.max_concurrent)

    def _started(self, run: Run) -> None:
        with self._lock:
            self.waiting -= 1
            self.running += 1
        if self.on_start is not None:
            self.on_start(time.perf_counter() - run.arrived)

    def _ended(self, run: Run, kind: str, payload=None) -> None:
        """A started run's one final event."""
        if kind == "cancelled":
            with self._lock:
                self.cancelled += 1
        elif kind == "error" and not isinstance(payload, MultispecError):
            log.error("generation failed", exc_info=payload)
        with self._lock:
            self.running -= 1
        run.emit(kind, payload)

    @staticmethod
    def _streamer(run: Run):
        def on_text(piece) -> None:  # a StreamChunk (a stand-in generate_fn may stream bare text)
            if run.cancel.is_set():
                raise Cancelled()
            run.emit("text", piece if isinstance(piece, StreamChunk) else StreamChunk(piece))
        return on_text

    # ---------------------------------------------------------------- one sequence per forward: worker threads
    def _work(self, job: PreparedRequest, run: Run) -> None:
        self._started(run)
        try:
            if run.cancel.is_set():
                raise Cancelled()
            decoder = self._free.get()  # never waits: at most max_concurrent jobs run at once
            try:
                result = self.generate_fn(decoder, job, stream=self._streamer(run), stream_chunks=True)
            finally:
                self._free.put(decoder)
        except Cancelled:
            self._ended(run, "cancelled")
        except Exception as e:  # noqa: BLE001 - a failed generation must answer its request, not kill the worker
            self._ended(run, "error", e)
        else:
            self._ended(run, "done", result)

    # ---------------------------------------------------------------- continuous batching: the loop thread
    def _batch_loop(self) -> None:
        """`while live: engine.step()`, admitting waiting jobs into free slots and ending cancelled runs between
        steps. A failure of the loop itself fails every run in it and is logged; the loop goes on."""
        batch = self.batch
        assert batch is not None
        waiting: deque = deque()
        running: dict[int, Run] = {}  # sequence id -> its run
        closing = False
        while not (closing and not running):
            idle = not running and not waiting
            while True:
                try:
                    item = self._inbox.get(block=idle and not closing)
                except queue.Empty:
                    break
                idle = False
                if item is None:
                    closing = True
                else:
                    waiting.append(item)
            if closing:
                for job, run in waiting:
                    self._started(run)
                    self._ended(run, "cancelled")
                waiting.clear()
            while waiting and batch.free:
                job, run = waiting.popleft()
                self._started(run)
                if run.cancel.is_set():
                    self._ended(run, "cancelled")
                    continue
                try:
                    running[batch.add(job, stream=self._streamer(run), stream_chunks=True)] = run
                except Exception as e:  # noqa: BLE001 - this request fails, the others go on
                    self._ended(run, "error", e)
            for seq_id, run in list(running.items()):
                if run.cancel.is_set():
                    batch.cancel(seq_id)
                    del running[seq_id]
                    self._ended(run, "cancelled")
            if not running:
                continue
            try:
                ended = batch.step()
            except Exception as e:  # noqa: BLE001 - a bug of the loop's own: every run in it gets the error
                log.exception("the batch loop failed; every request in it gets the error")
                batch.cancel_all()
                for run in running.values():
                    self._ended(run, "error", e)
                running.clear()
                continue
            for seq_id, out in ended:
                run = running.pop(seq_id)
                if isinstance(out, Cancelled) or run.cancel.is_set() and isinstance(out, BaseException):
                    self._ended(run, "cancelled")
                elif isinstance(out, BaseException):
                    self._ended(run, "error", out)
                else:
                    self._ended(run, "done", out)

    def shutdown(self) -> None:
        if self.batch is not None:
            self._inbox.put(None)  # the loop ends once its runs do (each as its request ends)
        else:
            self._pool.shutdown(wait=False, cancel_futures=True)
