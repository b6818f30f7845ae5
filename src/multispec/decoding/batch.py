"""Many sequences at once: one engine over slots of shared batched caches.

    batch = BatchEngine(decoder, slots=16, rows=...)     # one SlotCache per model
    i = batch.add(decoder.prepare(prompt, ...))           # a free slot takes the request; it starts next step
    while batch.live:
        for seq_id, result in batch.step():               # one round of every live sequence
            ...                                           # a GenerationResult, or the exception it failed with
    batch.cancel(i)                                       # between steps: its result so far

Each sequence decodes on its own slot (`SlotBackend`s of the group's caches; with a feature head, eagle or auto with
a head: the head's slot cache and each slot's feature tap, models/eagle_batched.py) with its own draft policy,
generator and verifier calls, through the one round implementation (decoding/engine.py): every `step` runs one round of
every live sequence, its forwards of one model as one batched forward. A sequence takes a slot when it is added
and frees it when it ends, so a server admits and frees sequences between steps (continuous batching). The output
of a sequence does not depend on the others in the batch: same law at T > 0, same tokens greedy up to near-ties of
the batched arithmetic.

`auto`'s sequences plan alone; the engine prices each step whole with the batch's costs (a forward of B sequences ×
n tokens each costs C(B, n), drafting/batch_costs.py, measured once per machine and corrected by the batch's own
forwards) and keeps the speculation that raises the step's tokens per second (decoding/batch_plan.py): with many
sequences, where a wider forward costs nearly in proportion, the batch decodes plainly.

`generate_batch` (decoding/batch_offline.py) is the offline entry point: validates every prompt first, then decodes
them `batch_size` at a time (a finished sequence's slot is taken by the next prompt at once), reporting each result
as it finishes. An interrupt stops every sequence where it is, and every prompt's result so far is kept.
"""
from __future__ import annotations

from typing import Any, Callable

from multispec.decoding.decoder import Decoder, GenerationResult
from multispec.decoding.job import Job
from multispec.decoding.pair_checks import default_backend
from multispec.decoding.engine import Cancelled, Engine
from multispec.decoding.request import PreparedRequest
from multispec.errors import attach_partial, check
from multispec.models.batched import Role, SlotBackend, SlotCache

__all__ = ["BatchEngine", "Cancelled", "MAX_BATCH", "batch_backend", "batchable"]

MAX_BATCH = 256
SEQUENTIAL_NOTE = ("the transformers backend runs a batch's sequences one at a time (its cache holds one sequence's "
                   "rows); --backend fast batches them")


CROSS_VOCAB_NOTE = ("a draft with another tokenizer drafts one sequence at a time (batched slots hold one "
                    "vocabulary's rows)")


def batchable(decoder: Decoder) -> bool:
    """Whether the decoder can batch: the fast backend (compiled code runs batches eagerly), with a draft of the
    target's own vocabulary, or a trained drafter of the method's own (a feature head) that has a batched form."""
    return decoder.backend in ("fast", "compiled") and decoder.pair.cross_vocab is None \
        and (not decoder.entry.drafts_with_own(decoder.config) or decoder.entry.batch_draft is not None)


def batch_backend(pair) -> str:
    """The backend a batch runs on by default: the single-sequence rule (pair_checks.default_backend) with both
    models counted: the fast one where both have it, else the transformers backend (one sequence at a time)."""
    return default_backend(pair, uses_draft=True)


class BatchEngine:
    """`slots` sequences at once over one pair and method (see the module docstring), sharing one SlotCache per
    model of `rows` rows per sequence."""

    def __init__(self, decoder: Decoder, slots: int, rows: int):
        check(decoder.pair.cross_vocab is None, f"batched decoding: {CROSS_VOCAB_NOTE}; use one slot per worker "
                                                "(serve --max-concurrent)")
        check(batchable(decoder), f"batched decoding runs on the fast backend, not {decoder.backend!r}")
        self.decoder, self.slots, self.rows = decoder, slots, rows
        pair = decoder.pair
        self.target_cache = SlotCache(pair.sidecar(pair.target), slots, rows, Role.TARGET)
        draft_model = decoder.draft_model  # set exactly when the decoder drafts with it (uses_draft)
        own = decoder.entry.batch_draft if decoder.entry.drafts_with_own(decoder.config) else None
        made: Any = own(decoder.config, decoder.loaded, pair, slots, rows) if own is not None else None  # a head's
        self.own = made
        self.draft_cache = SlotCache(pair.sidecar(draft_model), slots, rows, Role.DRAFT) \
            if draft_model is not None else made.cache if made is not None else None
        self.batch_costs = _batch_costs(self) if decoder.config.name == "auto" else None
        view = decoder.machine.auto_view
        self.engine = Engine(self.batch_costs, view.costs.overhead if view is not None and view.costs is not None
                             else None)
        self._policies = [decoder.new_policy() for _ in range(slots)]  # each slot's own adaptive state
        self._free = list(range(slots))[::-1]
        self._jobs: dict[int, tuple[int, Job | None]] = {}  # sequence id -> (slot, job; None: add_ids)

    @property
    def live(self) -> int:
        """Sequences decoding now."""
        return len(self._jobs)

    @property
    def free(self) -> int:
        """Slots free for `add`."""
        return len(self._free)

    def add(self, prepared: PreparedRequest, stream: Callable | None = None, stream_chunks: bool = False) -> int:
        """Start a request `Decoder.prepare` checked on a free slot (at the next `step`); its id. stream,
        stream_chunks: as Decoder.generate's. `step` reports its GenerationResult."""
        job = Job.begin(self.decoder.pair.tokenizer, prepared, stream, stream_chunks,
                        profile=self.decoder.profile.digest)
        return self._add(job.ids, job.sampling, prepared.max_new_tokens, job.seed, set(prepared.eos_ids), job.stop,
                         job.streamer.on_tokens, prepared.reproducible, job.recorder, job)

    def add_ids(self, prompt_ids: list[int], sampling, max_new_tokens: int, seed: int, reproducible: bool = False,
                stop=None, on_tokens=None) -> int:
        """`add` at the level of token ids, as Decoder.run (checked by the caller); `step` reports its (new ids,
        metrics) instead of a GenerationResult."""
        return self._add(list(prompt_ids), sampling, max_new_tokens, seed, self.decoder.eos_ids, stop, on_tokens,
                         reproducible, None, None)

    def _add(self, ids, sampling, max_new_tokens, seed, eos_ids, stop, on_tokens, reproducible, recorder,
             job: Job | None) -> int:
        check(bool(self._free), f"every one of the batch's {self.slots} slots is busy")
        d = self.decoder
        need = d.cache_rows(len(ids) + max_new_tokens)
        check(need <= self.rows, f"prompt + max_new_tokens + a round's tree need {need} cache rows, and this "
                                 f"batch has {self.rows} per sequence")
        slot = self._free.pop()
        try:
            target, draft, policy = self._slot(slot, ids, sampling)
            i = self.engine.add(target, draft, ids, d.config, sampling, max_new_tokens, seed, eos_ids, stop,
                                on_tokens, policy, reproducible, recorder)
        except BaseException:
            self._free.append(slot)
            raise
        self._jobs[i] = (slot, job)
        return i

    def _slot(self, slot: int, ids: list[int], sampling):
        """The slot's backends and policy, set for this request."""
        d = self.decoder
        slot_target = SlotBackend(self.target_cache, slot, d.pair.target)
        slot_target.argmax = sampling.greedy and not sampling.adjusts  # the batch takes the greedy argmaxes
        target = d.wrap_target(slot_target) if d.wrap_target is not None else slot_target
        if self.own is not None:  # a feature head: the target wrapped to keep its features, the slot's head
            target, head = self.own.backends(slot, target)
            return target, head, self._policies[slot]
        draft = SlotBackend(self.draft_cache, slot, d.draft_model) if self.draft_cache is not None else None
        if draft is not None and d.cheap.vocab is not None:
            draft.set_vocab_subset(d.cheap.subset(d.token_freq, ids))
        return target, draft, self._policies[slot]

    def step(self) -> list[tuple[int, GenerationResult | tuple | BaseException]]:
        """One round of every live sequence; the sequences that ended in it, each with its GenerationResult ((new
        ids, metrics) for `add_ids`) or the exception it failed with (carrying `.partial`, its result so far, for
        `add`). An interrupt propagates; `cancel_all`
        then keeps every sequence's result so far."""
        return [(i, self._end(i)) for i in self.engine.step()]

    def cancel(self, seq_id: int, error: BaseException | None = None) -> GenerationResult | None:
        """Stop a sequence between steps; its result so far (finish_reason "abort"; None for `add_ids`)."""
        self.engine.cancel(seq_id, error)
        out = self._end(seq_id)
        return getattr(out, "partial", None) if isinstance(out, BaseException) else out

    def cancel_all(self) -> dict[int, GenerationResult | None]:
        """Stop every live sequence (after an interrupt): each one's result so far."""
        return {i: self.cancel(i) for i in list(self._jobs)}

    def _end(self, seq_id: int):
        slot, job = self._jobs.pop(seq_id)
        self._free.append(slot)
        d = self.decoder
        observation = self._policies[slot].observation()
        try:
            new, metrics = self.engine.pop(seq_id)
        except BaseException as e:  # noqa: BLE001 - handed to the caller with the sequence's result so far
            if job is not None:
                attach_partial(e, job.partial())
            return e
        finally:
            d.machine.observe(observation)  # (a learning server's next requests plan from the newer profile)
        return job.finish(d.stats, new, metrics) if job is not None else (new, metrics)

    def release(self) -> None:
        """Once the batch is done: the caches' buffers go to the next batch over these models and shapes
        (SlotCache.release)."""
        for cache in (self.target_cache, self.draft_cache):
            if cache is not None:
                cache.release()

    def stats(self) -> dict:
        """Batched forwards so far and the mean sequences per forward, per model ("target", and "draft" or "head");
        with a batch plan (auto), the plans it kept and answered with a plain step (of which the gate's), the table's
        corrections and the gate's measured tokens per second per batch size."""
        e, drafter = self.engine, "head" if self.own is not None else "draft"
        out: dict = {name: {"forwards": e.forwards[r], "mean_batch": e.sequences[r] / e.forwards[r] if e.forwards[r]
                            else None} for name, r in (("target", Role.TARGET), (drafter, Role.DRAFT))}
        if self.batch_costs is not None:
            out["plans"] = {"kept": e.plans["kept"], "plain": e.plans["plain"], "gated": e.plans["gated"],
                            "cost_correction": dict(self.batch_costs.scale), "gate": e.gate.report() if e.gate is not None else None}
        return out


def _batch_costs(group: BatchEngine):
    from multispec.drafting.batch_costs import get_batch_costs

    d = group.decoder
    drafter = group.own.model if group.own is not None else d.draft_model
    table, measured = get_batch_costs(group.target_cache, d.pair.target, group.draft_cache, drafter, d.profile)
    d.machine.measured("batch_costs", measured)  # before any sequence starts: their stats name the profile with it
    return table
