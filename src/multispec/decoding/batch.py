"""Many sequences at once: lanes of one Decoder that decode concurrently and share batched forwards.

    group = BatchGroup(decoder, slots=16, rows=...)     # one SlotCache per model, one StepBatcher
    group.lanes[i].generate(prompt, ...)                # a Decoder whose backends are slot i of the caches

Each lane is a Decoder (same pair, method and trained models, its own draft policy) whose backends are
`SlotBackend`s over one slot of the group's caches. Run lanes in threads: every sequence goes through the ordinary
generation loop (decoding/engine.py) with its own generator, policy, verifier calls and accepted path, and the
group's StepBatcher turns their forward calls into one batched forward per model (models/batched.py). A sequence
joins the batch when its run starts and leaves when it ends, so a server admits and frees sequences between rounds
(continuous batching) with no scheduler of its own. The output of a sequence does not depend on the others in the
batch: same law at T > 0, same tokens greedy up to near-ties of the batched arithmetic.

`auto` in a lane plans with the batch's costs: a forward of B sequences × n tokens each costs C(B, n)
(drafting/costs.py, measured once per machine). A plan of n target tokens is charged its share of the one-token
forward, C(B, 1) / B, plus what its n - 1 more tokens add to it; a draft forward is shared by as many sequences as
drafted together last time. So each sequence speculates only where its extra tokens come cheaper than the batch's
own rate, and with many sequences, where a wider forward costs nearly in proportion, speculation turns itself off.

`generate_batch` is the offline entry point: validates every prompt first, then decodes them `batch_size` at a time
(a finished sequence's slot is taken by the next prompt at once), reporting each result as it finishes. An
interrupt cancels the group: each lane stops after its current round, and every prompt's result so far is kept.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable

from multispec.decoding.decoder import Decoder, GenerationResult
from multispec.decoding.engine import generate_ids
from multispec.errors import MultispecError, attach_partial, check
from multispec.models.batched import SlotBackend, SlotCache, StepBatcher
from multispec.validate import integer, seed_or_fresh

MAX_BATCH = 256
SEQUENTIAL_NOTE = ("the transformers backend runs a batch's sequences one at a time (its cache holds one sequence's "
                   "rows); --backend fast batches them")


CROSS_VOCAB_NOTE = ("a draft with another tokenizer drafts one sequence at a time (batched slots hold one "
                    "vocabulary's rows)")


def batchable(decoder: Decoder) -> bool:
    """Whether the decoder can batch: the fast backend (compiled code runs batches eagerly), with a draft of the
    target's own vocabulary."""
    return decoder.backend in ("fast", "compiled") and decoder.pair.cross_vocab is None


def batch_backend(pair) -> str:
    """The backend a batch runs on by default: the fast one where both models have it (compiled for a pair loaded
    with compile=True), else the transformers backend (one sequence at a time)."""
    from multispec.models.fast import FastNet

    if pair.compile:
        return "compiled"
    try:
        for model in (pair.target, pair.draft):
            if model is not None:
                FastNet.of(model)
    except MultispecError:
        return "hf"
    return "fast"


class BatchGroup:
    """`slots` lanes over one pair and method, sharing one SlotCache per model of `rows` rows per sequence."""

    def __init__(self, decoder: Decoder, slots: int, rows: int):
        from multispec.models.fast import FastNet

        check(decoder.pair.cross_vocab is None, f"batched decoding: {CROSS_VOCAB_NOTE}; use one slot per worker "
                                                "(serve --max-concurrent)")
        check(batchable(decoder), f"batched decoding runs on the fast backend, not {decoder.backend!r}")
        self.decoder, self.slots, self.rows = decoder, slots, rows
        self.batcher = StepBatcher()
        self.target_cache = SlotCache(FastNet.of(decoder.pair.target), slots, rows, priority=1)
        draft_model = decoder.draft_model  # set exactly when the decoder drafts with it (uses_draft)
        self.draft_cache = SlotCache(FastNet.of(draft_model), slots, rows, priority=0) \
            if draft_model is not None else None
        self.batch_costs = _batch_costs(self) if decoder.config.name == "auto" else None
        self.lanes = [Lane(decoder, self, slot) for slot in range(slots)]
        self.cancelled = threading.Event()  # set: every lane stops after its current round (generate_batch)

    def stats(self) -> dict:
        """Batched forwards so far and the mean sequences per forward, per model."""
        b = self.batcher
        return {name: {"forwards": b.forwards[p], "mean_batch": b.sequences[p] / b.forwards[p] if b.forwards[p]
                       else None} for name, p in (("target", 1), ("draft", 0))}


class Lane(Decoder):
    """One slot of a BatchGroup, as a Decoder (see the module docstring). Built by BatchGroup only."""

    def __init__(self, decoder: Decoder, group: BatchGroup, slot: int):  # noqa: D107 - no Decoder.__init__: shared
        self.__dict__.update({k: v for k, v in decoder.__dict__.items() if not k.startswith("_")})
        self.policy = decoder.entry.make_policy(decoder.config, decoder.pair, decoder.loaded)  # its own state
        self.group, self.slot = group, slot
        self.target = SlotBackend(group.batcher, group.target_cache, slot, decoder.pair.target)
        self.target = decoder.wrap_target(self.target) if decoder.wrap_target is not None else self.target
        self.draft = SlotBackend(group.batcher, group.draft_cache, slot, decoder.draft_model) \
            if group.draft_cache is not None else None
        self._target = self._draft = None

    def run(self, prompt_ids, sampling, max_new_tokens, seed, stop=None, on_tokens=None, reproducible=False,
            eos_ids=None, logprobs=None):
        need = self.cache_rows(len(prompt_ids) + max_new_tokens)
        check(need <= self.group.rows, f"prompt + max_new_tokens + a round's tree need {need} cache rows, and this "
                                       f"batch has {self.group.rows} per sequence")
        if self.draft is not None and self.cheap.vocab is not None:
            self.draft.set_vocab_subset(self.cheap.subset(self.token_freq, prompt_ids))
        if self.group.batch_costs is not None:
            self.policy.join_batch(self.group.batcher, self.group.batch_costs, not sampling.greedy)
        self.group.batcher.join()
        try:
            return generate_ids(self.target, self.draft, prompt_ids, self.config, sampling, max_new_tokens, seed,
                                self.eos_ids if eos_ids is None else eos_ids, stop, self._checked(on_tokens),
                                self.policy, reproducible, logprobs)
        finally:
            self.group.batcher.leave()

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
    return get_batch_costs(group.target_cache, d.pair.target, group.draft_cache, d.draft_model)


def seeds_for(seed, count: int) -> list[int]:
    """Per-sequence seeds: a list (one per prompt), an int s (sequence i gets s + i, reported in its stats), or
    None (a fresh seed each)."""
    if isinstance(seed, (list, tuple)):
        check(len(seed) == count, f"seed: got {len(seed)} seeds for {count} prompts; give one per prompt, one int "
                                  "(sequence i then uses seed + i) or none")
        return [seed_or_fresh(s) for s in seed]
    if seed is None:
        return [seed_or_fresh(None) for _ in range(count)]
    base = seed_or_fresh(seed)
    return [seed_or_fresh(base + i) for i in range(count)]


def generate_batch(decoder: Decoder, prompts, batch_size: int | None = None, max_new_tokens: int = 128,
                   seed=None, on_result: Callable[[int, GenerationResult], None] | None = None,
                   **kwargs) -> list[GenerationResult]:
    """Decode every prompt (a list of str or of token-id lists) with `decoder`'s pair and method, batch_size at a
    time (default: all of them, at most MAX_BATCH), and return one GenerationResult per prompt, in order, each with
    its own stats and seed. kwargs: as Decoder.generate (temperature, top_k, top_p, stop, reproducible). On the
    transformers backend the sequences run one at a time (stats warn so).

    on_result(i, result) is called in the caller's thread as each sequence finishes (in the order they finish).
    If any sequence fails, the error is raised after the others finish; an interrupt (Ctrl-C, SIGTERM) or an error
    from on_result stops the running sequences after their current round and is raised at once. Either way the
    exception carries `.partial`: one result per prompt, finished or not (finish_reason "abort" for a sequence cut
    short, with its tokens so far, or never started, empty)."""
    encoded = _check_prompts(decoder, prompts)
    n_new = integer(max_new_tokens, "max_new_tokens")
    if n_new is None or n_new < 1:
        raise MultispecError(f"max_new_tokens must be an integer >= 1, got {n_new!r}")
    max_new_tokens = n_new
    size = integer(batch_size, "batch_size")
    check(size is None or 1 <= size <= MAX_BATCH, f"batch_size must be an integer in [1, {MAX_BATCH}], got {size!r}")
    size = min(size or len(prompts), len(prompts), MAX_BATCH)
    seeds = seeds_for(seed, len(prompts))
    decoder.sampling(kwargs.get("temperature"), kwargs.get("top_k"), kwargs.get("top_p"))  # checked before work
    group = None
    if batchable(decoder):
        longest = max(len(ids) for ids in encoded)
        rows = decoder.cache_rows(min(longest + max_new_tokens, decoder.context or 1 << 30))
        group = BatchGroup(decoder, size, rows)
        notes = []
    else:
        notes = [CROSS_VOCAB_NOTE if decoder.pair.cross_vocab is not None else SEQUENTIAL_NOTE]
    results: list = [None] * len(prompts)
    errors: list = [None] * len(prompts)

    def one(lane: Decoder, i: int) -> None:
        try:
            results[i] = lane.generate(prompts[i], max_new_tokens=max_new_tokens, seed=seeds[i], **kwargs)
            results[i].stats["warnings"].extend(notes)
        except Cancelled as e:  # the batch was interrupted: keep this sequence's tokens so far
            results[i] = e.partial
        except Exception as e:  # noqa: BLE001 - kept, raised after the others finish
            errors[i] = e
            results[i] = getattr(e, "partial", None) or _empty(seeds[i])

    def done(i: int) -> None:
        if on_result is not None and errors[i] is None:
            on_result(i, results[i])

    start = time.perf_counter()
    try:
        if group is None:
            _decode_in_turn(decoder, len(prompts), one, done, results)
        else:
            _decode_in_lanes(group, len(prompts), one, done)
    except BaseException as e:  # an interrupt or an on_result error: every prompt's result goes with it
        attach_partial(e, [r if r is not None else _empty(s) for r, s in zip(results, seeds)])
        raise
    _add_batch_stats(results, group, size, time.perf_counter() - start)
    _raise_first_error(errors, results)
    return results


class Cancelled(Exception):
    """Raised in a lane between rounds once its batch is interrupted: the lane's sequence stops there."""

    partial: GenerationResult  # the tokens so far: set by Decoder.generate as the exception leaves it


def _check_prompts(decoder: Decoder, prompts) -> list[list[int]]:
    """Each prompt a str or token ids (as `encode_prompt` takes them), all of one kind; returns their token ids.
    Errors name the prompt by its index, prompts[i], as the results and the CLI's JSON lines do."""
    from multispec.text import encode_prompt

    check(isinstance(prompts, (list, tuple)), f"prompts must be a list of prompts, got {type(prompts).__name__}")
    check(len(prompts) >= 1, "the list of prompts is empty; give at least one prompt")
    encoded = []
    for i, p in enumerate(prompts):
        try:
            encoded.append(encode_prompt(decoder.pair.tokenizer, decoder.vocab_size, p))
        except MultispecError as e:
            raise MultispecError(f"prompts[{i}]: {e}") from None
    first = isinstance(prompts[0], str)
    other = next((i for i, p in enumerate(prompts) if isinstance(p, str) != first), None)
    check(other is None, f"the prompts mix strings and token-id lists (prompts[0] is "
                         f"{'a str' if first else 'token ids'}, prompts[{other}] is not); give one kind")
    return encoded


def _decode_in_turn(decoder: Decoder, count: int, one, done, results: list) -> None:
    """One sequence at a time, in this thread: an interrupt stops the running sequence where it is."""
    for i in range(count):
        try:
            one(decoder, i)
        except BaseException as e:  # KeyboardInterrupt: Decoder.generate put the tokens so far on it
            results[i] = getattr(e, "partial", None)
            raise
        done(i)


def _decode_in_lanes(group: BatchGroup, count: int, one, done) -> None:
    """Every sequence on the group's lanes, each lane in a worker thread; results are reported here as they
    finish. An exception here (an interrupt: signals reach this thread only) cancels the batch: the running lanes
    stop after their current round (Lane.run), the waiting prompts never start."""
    free: queue.SimpleQueue = queue.SimpleQueue()
    for lane in group.lanes:
        free.put(lane)

    def task(i: int) -> None:
        if group.cancelled.is_set():
            return
        lane = free.get()
        try:
            one(lane, i)
        finally:
            free.put(lane)

    pool = ThreadPoolExecutor(len(group.lanes), thread_name_prefix="multispec-batch")
    futures = {pool.submit(task, i): i for i in range(count)}
    try:
        for future in as_completed(futures):
            done(futures[future])
    except BaseException:
        group.cancelled.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _empty(seed: int) -> GenerationResult:
    """The result of a sequence that never started."""
    return GenerationResult([], "", {"seed": seed, "new_tokens": 0, "warnings": []}, "abort")


def _add_batch_stats(results: list, group: BatchGroup | None, size: int, wall: float) -> None:
    tokens = sum(len(r.token_ids) for r in results)
    batch = {"size": size if group is not None else 1, "prompts": len(results), "seconds": wall,
             "new_tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else None,
             **({"forwards": group.stats()} if group is not None else {})}
    for r in results:
        r.stats["batch"] = batch


def _raise_first_error(errors: list, results: list) -> None:
    """The first failed sequence's error, carrying every prompt's result as `.partial`."""
    failed = [(i, e) for i, e in enumerate(errors) if e is not None]
    if not failed:
        return
    i, e = failed[0]
    attach_partial(e, results)
    if isinstance(e, MultispecError):
        error = MultispecError(f"prompts[{i}]: {e}")
        attach_partial(error, results)
        raise error from e
    raise e
