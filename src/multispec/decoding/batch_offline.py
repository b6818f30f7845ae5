"""The offline entry point of batches (`multispec.generate` with a list of prompts, `generate --batch-size`, the
batched bench): every prompt checked first, then decoded `batch_size` at a time by one BatchEngine
(decoding/batch.py; a finished sequence's slot takes the next prompt at once), each result reported as it
finishes, and an interrupt keeping every prompt's result so far."""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

from multispec.decoding.batch import CROSS_VOCAB_NOTE, MAX_BATCH, SEQUENTIAL_NOTE, BatchEngine, batchable
from multispec.decoding.decoder import Decoder, GenerationResult
from multispec.errors import MultispecError, attach_partial, check
from multispec.params import SamplingParams
from multispec.validate import integer, seed as check_seed


def seeds_for(seed, count: int) -> list[int | None]:
    """Per-sequence seeds as given: a list (one per prompt), an int s (sequence i gets s + i, reported in its
    stats), or None (None each: the Decoder draws a fresh seed per prompt)."""
    if isinstance(seed, (list, tuple)):
        check(len(seed) == count, f"seed: got {len(seed)} seeds for {count} prompts; give one per prompt, one int "
                                  "(sequence i then uses seed + i) or none")
        return [check_seed(s) for s in seed]
    if seed is None:
        return [None] * count
    base = check_seed(seed)
    assert base is not None
    return [check_seed(base + i) for i in range(count)]


def generate_batch(decoder: Decoder, prompts, params: SamplingParams | None = None, batch_size: int | None = None,
                   on_result: Callable[[int, GenerationResult], None] | None = None, seed=None,
                   **settings) -> list[GenerationResult]:
    """Decode every prompt (a list of str or of token-id lists) with `decoder`'s pair and method, batch_size at a
    time (default: all of them, at most MAX_BATCH), and return one GenerationResult per prompt, in order, each with
    its own stats and seed. params: the request's SamplingParams (or its fields as keywords), the same for every
    prompt but the seed: seed (or params.seed) None draws a fresh one per prompt, an int s gives prompt i s + i, a
    list gives one per prompt. On the transformers backend the sequences run one at a time (stats warn so).

    on_result(i, result) is called in the caller's thread as each sequence finishes (in the order they finish).
    If any sequence fails, the error is raised after the others finish; an interrupt (Ctrl-C, SIGTERM) or an error
    from on_result stops the running sequences after their current round and is raised at once. Either way the
    exception carries `.partial`: one result per prompt, finished or not (finish_reason "abort" for a sequence cut
    short, with its tokens so far, or never started, empty)."""
    check(isinstance(prompts, (list, tuple)), f"prompts must be a list of prompts, got {type(prompts).__name__}")
    check(len(prompts) >= 1, "the list of prompts is empty; give at least one prompt")
    params = SamplingParams.of(params, settings)
    check(seed is None or params.seed is None, "give the seed in params or as seed=, not both")
    size = integer(batch_size, "batch_size")
    check(size is None or 1 <= size <= MAX_BATCH, f"batch_size must be an integer in [1, {MAX_BATCH}], got {size!r}")
    size = min(size or len(prompts), len(prompts), MAX_BATCH)
    # every prompt prepared (encoded, checked, its seed and mode decided) before any of them decodes
    prepared = decoder.prepare_many(list(prompts), params, seeds_for(seed if seed is not None else params.seed,
                                                                     len(prompts)))
    _check_one_kind(prompts)
    batch, notes = _batch_engine(decoder, [p.prompt_ids for p in prepared], size, params.max_new_tokens)
    results: list = [None] * len(prompts)
    errors: list = [None] * len(prompts)

    def done(i: int) -> None:
        if on_result is not None and errors[i] is None:
            on_result(i, results[i])

    start = time.perf_counter()
    try:
        if batch is None:
            _decode_in_turn(decoder, prepared, results, errors, notes, done)
        else:
            _decode_batched(batch, prepared, results, errors, notes, done)
    except BaseException as e:  # an interrupt or an on_result error: every prompt's result goes with it
        attach_partial(e, [r if r is not None else _empty(p.seed) for r, p in zip(results, prepared)])
        raise
    _add_batch_stats(results, batch, size, time.perf_counter() - start)
    _raise_first_error(errors, results)
    return results


def _batch_engine(decoder: Decoder, encoded: list[tuple[int, ...]], size: int,
                  max_new_tokens: int) -> tuple[BatchEngine | None, list[str]]:
    """The batch engine of `size` slots the prompts decode on (None: one at a time, on the decoder itself, at batch
    size 1 or where the decoder cannot batch), and the notes every result's stats then carry. At batch size 1 a
    slot only adds cost: the slot cache's forward and `auto` planning with the batched table instead of its own
    learned costs (pycode-v1, HumanEval 132-163, greedy: 230 tok/s on a slot against 254 alone)."""
    if size == 1:
        return None, []
    if not batchable(decoder):
        return None, [CROSS_VOCAB_NOTE if decoder.pair.cross_vocab is not None else SEQUENTIAL_NOTE]
    longest = max(len(ids) for ids in encoded)
    rows = decoder.cache_rows(min(longest + max_new_tokens, decoder.context or 1 << 30))
    return BatchEngine(decoder, size, rows), []


def _check_one_kind(prompts) -> None:
    """The prompts (each encoded by Decoder.prepare_many, its errors naming it, prompts[i]) are all str or all
    token ids."""
    first = isinstance(prompts[0], str)
    other = next((i for i, p in enumerate(prompts) if isinstance(p, str) != first), None)
    check(other is None, f"the prompts mix strings and token-id lists (prompts[0] is "
                         f"{'a str' if first else 'token ids'}, prompts[{other}] is not); give one kind")


def _decode_in_turn(decoder: Decoder, prepared: list, results: list, errors: list, notes: list[str],
                    done) -> None:
    """One sequence at a time, in this thread: an interrupt stops the running sequence where it is."""
    for i, request in enumerate(prepared):
        try:
            results[i] = decoder.run_prepared(request)
            results[i].stats["warnings"].extend(notes)
        except Exception as e:  # noqa: BLE001 - kept, raised after the others finish
            errors[i] = e
            results[i] = getattr(e, "partial", None) or _empty(request.seed)
        except BaseException as e:  # KeyboardInterrupt: Decoder.run_prepared put the tokens so far on it
            results[i] = getattr(e, "partial", None)
            raise
        done(i)


def _decode_batched(batch: BatchEngine, prepared: list, results: list, errors: list, notes: list[str],
                    done) -> None:
    """Every prompt through the batch engine, in this thread (a slot that frees takes the next prompt); results are
    reported as they finish. An exception here (an interrupt, an on_result error) stops every running sequence
    where it is, with its tokens so far; the waiting prompts never start."""
    waiting, running = deque(range(len(prepared))), dict[int, int]()  # running: sequence id -> prompt index
    try:
        while waiting or running:
            while waiting and batch.free:
                i = waiting.popleft()
                try:
                    running[batch.add(prepared[i])] = i
                except Exception as e:  # noqa: BLE001 - kept, raised after the others finish
                    errors[i], results[i] = e, getattr(e, "partial", None) or _empty(prepared[i].seed)
            for seq_id, out in batch.step():
                i = running.pop(seq_id)
                if isinstance(out, BaseException):
                    errors[i], results[i] = out, getattr(out, "partial", None) or _empty(prepared[i].seed)
                elif isinstance(out, GenerationResult):  # (add, not add_ids: always)
                    results[i] = out
                    out.stats["warnings"].extend(notes)
                done(i)
    except BaseException:
        for seq_id, partial in batch.cancel_all().items():
            results[running[seq_id]] = partial
        raise
    finally:
        batch.release()


def _empty(seed: int) -> GenerationResult:
    """The result of a sequence that never started."""
    return GenerationResult([], "", {"seed": seed, "new_tokens": 0, "warnings": []}, "abort")


def _add_batch_stats(results: list, group: BatchEngine | None, size: int, wall: float) -> None:
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
