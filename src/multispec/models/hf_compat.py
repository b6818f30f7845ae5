"""The two spellings of a transformers model's KV cache argument across the 5.x releases multispec supports.

transformers <= 5.23 takes and returns `past_key_values`; 5.24 renamed it `cache` (the old name still works there but
warns, and is announced for removal in 5.40). Every call site that drives a model's forward itself reads the name
once with `cache_argument`, passes the cache under it and reads it back with `output_cache`, so neither release
warns and neither breaks."""
from __future__ import annotations

import inspect
from typing import Any

import torch

OLD, NEW = "past_key_values", "cache"


def cache_argument(model: torch.nn.Module) -> str:
    """The name under which `model.forward` takes its KV cache: "cache" (transformers >= 5.24) or
    "past_key_values" (earlier releases, and custom code that kept the old name)."""
    forward = getattr(model, "forward", model)  # a module, or any callable standing in for one
    return NEW if NEW in inspect.signature(forward).parameters else OLD


def output_cache(out: Any) -> Any:
    """The cache a forward returned (`out.cache` from 5.24 on, `out.past_key_values` before)."""
    cache = getattr(out, NEW, None)
    return cache if cache is not None else getattr(out, OLD, None)


def passed_cache(kwargs: dict[str, Any]) -> Any:
    """The cache a caller passed to a forward (a hook's view of its keyword arguments), under either name."""
    cache = kwargs.get(NEW)
    return cache if cache is not None else kwargs.get(OLD)
