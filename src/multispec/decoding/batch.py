"""Many sequences at once: lanes of one Decoder that decode concurrently and share batched forwards.

    group = BatchGroup(decoder, slots=16, rows=...)     # one SlotCache per model, one StepBatcher: the loop
    group.submit(lambda: group.lanes[i].generate(prompt, ...))   # a Future; lane i: a Decoder over slot i

Each lane is a Decoder (same pair, method and trained models, its own draft policy) whose backends are
`SlotBackend`s over one slot of the group's caches. Lanes run on the group's loop (`submit`; models/batched.py):
every sequence goes through the ordinary generation loop (decoding/engine.py) with its own generator, policy,
verifier calls and accepted path, as a greenlet in the loop's one thread, and the loop runs their forward calls as
one batched forward per model. A sequence joins the batch when its run starts and leaves when it ends, so a server
admits and frees sequences between rounds (continuous batching). The output of a sequence does not depend on the
others in the batch: same law at T > 0, same tokens greedy up to near-ties of the batched arithmetic.

`auto` in a lane plans with the batch's costs: a forward of B sequences × n tokens each costs C(B, n)
(drafting/costs.py, measured once per machine). A plan of n target tokens is charged its share of the one-token
forward, C(B, 1) / B, plus what its n - 1 more tokens add to it; a draft forward is shared by as many sequences as
drafted together last time. So each sequence speculates only where its extra tokens come cheaper than the batch's
own rate, and with many sequences, where a wider forward costs nearly in proportion, speculation turns itself off.

`generate_batch` (decoding/batch_offline.py) is the offline entry point: validates every prompt first, then decodes them `batch_size` at a time
(a finished sequence's slot is taken by the next prompt at once), reporting each result as it finishes. An
interrupt cancels the group: each lane stops after its current round, and every prompt's result so far is kept.
"""
from __future__ import annotations

import threading

from multispec.decoding.decoder import Decoder, GenerationResult
from multispec.decoding.engine import generate_ids
from multispec.errors import MultispecError, check
from multispec.models.batched import Role, SlotBackend, SlotCache, StepBatcher

MAX_BATCH = 256
SEQUENTIAL_NOTE = ("the transformers backend runs a batch's sequences one at a time (its cache holds one sequence's "
                   "rows); --backend fast batches them")


CROSS_VOCAB_NOTE = ("a draft with another tokenizer drafts one sequence at a time (batched slots hold one "
                    "vocabulary's rows)")


def batchable(decoder: Decoder) -> bool:
    """Whether the decoder can batch: the fast backend (compiled code runs batches eagerly), with a draft of the
    target's own vocabulary."""
    return decoder.backend in ("fast", "compiled") and decoder.pair.cross_vocab is None \
        and not decoder.entry.drafts_with_own(decoder.config)  # a head drafts one sequence at a time


def batch_backend(pair) -> str:
    """The backend a batch runs on by default: the fast one where both models have it (compiled for a pair loaded
    with compile=True), else the transformers backend (one sequence at a time)."""
    if pair.compile:
        return "compiled"
    try:
        for model in (pair.target, pair.draft):
            if model is not None:
                pair.sidecar(model).fast_net()
    except MultispecError:
        return "hf"
    return "fast"


class BatchGroup:
    """`slots` lanes over one pair and method, sharing one SlotCache per model of `rows` rows per sequence."""

    def __init__(self, decoder: Decoder, slots: int, rows: int):
        check(decoder.pair.cross_vocab is None, f"batched decoding: {CROSS_VOCAB_NOTE}; use one slot per worker "
                                                "(serve --max-concurrent)")
        check(batchable(decoder), f"batched decoding runs on the fast backend, not {decoder.backend!r}")
        self.decoder, self.slots, self.rows = decoder, slots, rows
        self.batcher = StepBatcher(slots)  # at most one generation per slot runs; later ones wait their turn
        pair = decoder.pair
        self.target_cache = SlotCache(pair.sidecar(pair.target), slots, rows, Role.TARGET)
        draft_model = decoder.draft_model  # set exactly when the decoder drafts with it (uses_draft)
        self.draft_cache = SlotCache(pair.sidecar(draft_model), slots, rows, Role.DRAFT) \
            if draft_model is not None else None
        self.batch_costs = _batch_costs(self) if decoder.config.name == "auto" else None
        self.lanes = [Lane(decoder, self, slot) for slot in range(slots)]
        self.cancelled = threading.Event()  # set: every lane stops after its current round (generate_batch)

    def submit(self, fn, *args):
        """Run fn(*args) (code that generates on lanes, one lane per running call) on the group's loop; returns
        its concurrent.futures.Future. At most `slots` calls run at once; later ones start as earlier ones end."""
        return self.batcher.submit_task(fn, *args)

    def close(self, wait: bool = True) -> None:
        """Stop the loop once its running calls end (those not started are cancelled); wait: for that."""
        self.batcher.close(wait)

    def release(self) -> None:
        """After close(): the caches' buffers go to the next group over these models and shapes (SlotCache.release)."""
        for cache in (self.target_cache, self.draft_cache):
            if cache is not None:
                cache.release()

    def stats(self) -> dict:
        """Batched forwards so far and the mean sequences per forward, per model."""
        b = self.batcher
        return {name: {"forwards": b.forwards[p], "mean_batch": b.sequences[p] / b.forwards[p] if b.forwards[p]
                       else None} for name, p in (("target", Role.TARGET), ("draft", Role.DRAFT))}


class Lane(Decoder):
    """One slot of a BatchGroup, as a Decoder (see the module docstring). Built by BatchGroup only."""

    def __init__(self, decoder: Decoder, group: BatchGroup, slot: int):  # noqa: D107 - the parts are resolved
        self.machine = decoder.machine  # the decoder's profile, auto's view of it, its record of observations
        self._start(decoder.parts, warm_up=False)  # the decoder's shared parts; its own policy
        self.group, self.slot = group, slot
        self.slot_target = SlotBackend(group.batcher, group.target_cache, slot, decoder.pair.target)
        self.target = decoder.wrap_target(self.slot_target) if decoder.wrap_target is not None else self.slot_target
        self.draft = SlotBackend(group.batcher, group.draft_cache, slot, decoder.draft_model) \
            if group.draft_cache is not None else None

    def run(self, prompt_ids, sampling, max_new_tokens, seed, stop=None, on_tokens=None, reproducible=False,
            eos_ids=None, logprobs=None):
        need = self.cache_rows(len(prompt_ids) + max_new_tokens)
        check(need <= self.group.rows, f"prompt + max_new_tokens + a round's tree need {need} cache rows, and this "
                                       f"batch has {self.group.rows} per sequence")
        if self.draft is not None and self.cheap.vocab is not None:
            self.draft.set_vocab_subset(self.cheap.subset(self.token_freq, prompt_ids))
        self.slot_target.argmax = sampling.greedy and not sampling.adjusts  # the batch takes the greedy argmaxes
        if self.group.batch_costs is not None:
            self.policy.join_batch(self.group.batcher, self.group.batch_costs, not sampling.greedy)
        self.group.batcher.join()
        try:
            return generate_ids(self.target, self.draft, prompt_ids, self.config, sampling, max_new_tokens, seed,
                                self.eos_ids if eos_ids is None else eos_ids, stop, self._checked(on_tokens),
                                self.policy, reproducible, logprobs)
        finally:
            self.group.batcher.leave()
            self.observations.add(self.policy.observation(), self.profile)

    def _checked(self, on_tokens):
        """on_tokens, then Cancelled once the group is cancelled: a lane stops between rounds, with its tokens so
        far recorded (Decoder.generate's partial result)."""
        def after_round(new: list[int]) -> None:
            if on_tokens is not None:
                on_tokens(new)
            if self.group.cancelled.is_set():
                raise Cancelled("the batch was interrupted")
        return after_round

    def spawn(self):
        raise MultispecError("a batch lane cannot be spawned; build another BatchGroup")


def _batch_costs(group: BatchGroup):
    from multispec.drafting.batch_costs import get_batch_costs

    d = group.decoder
    table, measured = get_batch_costs(group.target_cache, d.pair.target, group.draft_cache, d.draft_model, d.profile)
    d.machine.measured("batch_costs", measured)  # before any lane starts: the lanes' stats name the profile with it
    return table


class Cancelled(Exception):
    """Raised in a lane between rounds once its batch is interrupted: the lane's sequence stops there."""

    partial: GenerationResult  # the tokens so far: set by Decoder.generate as the exception leaves it
