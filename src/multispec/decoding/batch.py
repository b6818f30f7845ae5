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
(a finished sequence's slot is taken by the next prompt at once).
"""
from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor

from multispec.decoding.decoder import Decoder, GenerationResult
from multispec.decoding.engine import generate_ids
from multispec.errors import MultispecError, check
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
        self.draft_cache = SlotCache(FastNet.of(decoder.draft_model), slots, rows, priority=0) \
            if decoder.uses_draft else None
        self.batch_costs = _batch_costs(self) if decoder.config.name == "auto" else None
        self.lanes = [Lane(decoder, self, slot) for slot in range(slots)]

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
                                self.eos_ids if eos_ids is None else eos_ids, stop, on_tokens, self.policy,
                                reproducible, logprobs)
        finally:
            self.group.batcher.leave()

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
                   seed=None, **kwargs) -> list[GenerationResult]:
    """Decode every prompt (a list of str or of token-id lists) with `decoder`'s pair and method, batch_size at a
    time (default: all of them, at most MAX_BATCH), and return one GenerationResult per prompt, in order, each with
    its own stats and seed. kwargs: as Decoder.generate (temperature, top_k, top_p, stop, reproducible). On the
    transformers backend the sequences run one at a time (stats warn so). If any sequence fails, the error is raised
    after the others finish, carrying `.partial`: every prompt's result (finish_reason "abort" for the failed)."""
    from multispec.text import encode_prompt

    check(isinstance(prompts, (list, tuple)), f"prompts must be a list of prompts, got {type(prompts).__name__}")
    check(len(prompts) >= 1, "the list of prompts is empty; give at least one prompt")
    kinds = {"text" if isinstance(p, str) else "ids" for p in prompts}
    check(len(kinds) == 1, "the prompts mix strings and token-id lists; give one kind")
    encoded = []
    for i, p in enumerate(prompts):
        try:
            encoded.append(encode_prompt(decoder.pair.tokenizer, decoder.vocab_size, p))
        except MultispecError as e:
            raise MultispecError(f"prompt {i}: {e}") from None
    max_new_tokens = integer(max_new_tokens, "max_new_tokens")
    check(max_new_tokens is not None and max_new_tokens >= 1,
          f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
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
        lanes, notes = group.lanes, []
    else:
        lanes, size = [decoder], 1
        notes = [CROSS_VOCAB_NOTE if decoder.pair.cross_vocab is not None else SEQUENTIAL_NOTE]
    free: queue.SimpleQueue = queue.SimpleQueue()
    for lane in lanes:
        free.put(lane)
    results: list = [None] * len(prompts)
    errors: list = [None] * len(prompts)

    def one(i: int) -> None:
        lane = free.get()
        try:
            results[i] = lane.generate(prompts[i], max_new_tokens=max_new_tokens, seed=seeds[i], **kwargs)
            results[i].stats["warnings"].extend(notes)
        except BaseException as e:  # noqa: BLE001 - kept, raised after the others finish
            errors[i] = e
            results[i] = getattr(e, "partial", None) or GenerationResult([], "", {"seed": seeds[i]}, "abort")
        finally:
            free.put(lane)

    start = time.perf_counter()
    with ThreadPoolExecutor(size, thread_name_prefix="multispec-batch") as pool:
        list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    batch = {"size": size, "prompts": len(prompts), "seconds": wall, "new_tokens": tokens,
             "tokens_per_s": tokens / wall if wall > 0 else None,
             **({"forwards": group.stats()} if group is not None else {})}
    for r in results:
        r.stats["batch"] = batch
    failed = [(i, e) for i, e in enumerate(errors) if e is not None]
    if failed:
        i, e = failed[0]
        e.partial = results
        if isinstance(e, MultispecError):
            error = MultispecError(f"prompt {i}: {e}")
            error.partial = results
            raise error from e
        raise e
    return results
