"""The server's KV-cache budget: the longest sequence it admits (`--max-model-len`, vLLM's name) and the memory
its caches take.

Each generation in flight (a batch slot with --max-batch, else a worker) holds up to max_model_len tokens in the
target's cache and in the draft's. Batch slots are allocated at start-up for max_model_len whatever the requests
ask, so the default is not the model's position limit (Gemma 3's 32,768 positions × 8 slots took 9.5 GB) but the
longest that fits CACHE_MEMORY_FRACTION of the memory available at start-up (free GPU memory on CUDA, the
system's available RAM otherwise), rounded down to ROUND_TO tokens and never more than the models' positions.
That length is computed as if every layer held every row; batch slots' sliding-window layers hold only their
window and a slack (models/batched.py SlotCache), so their caches take less than the budget (Gemma 3: 5 of 6
layers), and the start-up line reports what they take.
"""
from __future__ import annotations

from multispec.errors import check
from multispec.threads import available_ram

CACHE_MEMORY_FRACTION = {"cuda": 0.5, "cpu": 0.05}  # the CPU's RAM is shared with everything else on the machine
ROUND_TO = 256
FALLBACK_LEN = 4096  # when neither the memory nor the model's positions are known


def row_bytes(model) -> int | None:
    """Bytes one token takes in `model`'s KV cache (keys and values of every layer, in its dtype), from its config;
    None when the config does not say."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers, heads = getattr(cfg, "num_hidden_layers", None), getattr(cfg, "num_attention_heads", None)
    if not layers or not heads:
        return None
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or getattr(cfg, "hidden_size", 0) // heads
    return 2 * layers * kv * head_dim * model.get_input_embeddings().weight.element_size() or None


def available_bytes(device) -> int | None:
    """Memory free for caches on `device` at start-up: free GPU memory on CUDA, else the system's available RAM
    (Linux's MemAvailable; the physical RAM where that is not known); None when neither can be read."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_ram()


def cache_models(decoder) -> list:
    """The models whose caches a generation holds: the target, and the draft where the method drafts with it."""
    return [decoder.pair.target] + ([decoder.draft_model] if decoder.uses_draft else [])


def choose_max_model_len(decoder, generations: int, requested: int | None) -> tuple[int, str]:
    """(max_model_len, why): `requested` (checked against the models' positions), else the budget's length (see
    the module docstring) for `generations` in flight."""
    limit = decoder.context  # the models' positions, or None
    if requested is not None:
        check(isinstance(requested, int) and requested >= 1, f"--max-model-len must be >= 1, got {requested!r}")
        check(limit is None or requested <= limit, f"--max-model-len {requested} is more than the model's {limit} "
                                                   "positions (max_position_embeddings); give at most that")
        return requested, "as given"
    per_row = [row_bytes(m) for m in cache_models(decoder)]
    device = decoder.pair.target.get_input_embeddings().weight.device
    free = available_bytes(device)
    if free is None or None in per_row:
        return (limit, "default: the model's positions") if limit else (FALLBACK_LEN, f"default: {FALLBACK_LEN}")
    fraction = CACHE_MEMORY_FRACTION.get(device.type, CACHE_MEMORY_FRACTION["cpu"])
    slack = decoder.cache_rows(0)  # rows a generation needs beyond its tokens (a round's tree)
    fits = int(fraction * free) // (generations * (sum(per_row) + 8 * len(per_row))) - slack  # + 8: a row's position
    n = max(ROUND_TO, fits // ROUND_TO * ROUND_TO)
    if limit is not None and n >= limit:
        return limit, "default: the model's positions"
    return n, (f"default: what fits {fraction:.0%} of the {free / 1e9:.1f} GB available"
               + (f"; the model has {limit} positions" if limit else ""))


def cache_report(scheduler, why: str) -> str:
    """One line for start-up: the caches' memory, how long a sequence they hold and why."""
    n, gen = scheduler.max_model_len, scheduler.max_concurrent
    if scheduler.batch is not None:  # batch slots: allocated now
        caches = [c for c in (scheduler.batch.target_cache, scheduler.batch.draft_cache) if c is not None]
        size = sum(c.nbytes for c in caches)
        return (f"KV caches: {gen} batch slots x {scheduler.batch.rows} rows = {size / 1e9:.2f} GB, allocated now "
                f"(--max-model-len {n}, {why})")
    per_row = [row_bytes(m) for m in cache_models(scheduler.decoder)]
    rows = scheduler.decoder.cache_rows(n)
    size = "" if None in per_row else f" = at most {gen * rows * sum(per_row) / 1e9:.2f} GB"
    return f"KV caches: up to {gen} generations x {n} tokens{size}, allocated per request (--max-model-len {n}, {why})"
