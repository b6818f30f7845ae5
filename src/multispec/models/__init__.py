"""Model backends behind one small protocol (see base.py)."""
from __future__ import annotations

import torch

from multispec.errors import check
from multispec.models.base import Backend, ForwardOut, causal_mask, forward_chain

BACKENDS = ("hf", "fast")


def make_backend(model: torch.nn.Module, kind: str = "hf") -> Backend:
    """A fresh backend (with its own empty cache) over a loaded model."""
    check(kind in BACKENDS, f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if kind == "fast":
        from multispec.models.fast_llama import FastLlamaBackend

        return FastLlamaBackend(model)
    from multispec.models.hf import HFBackend

    return HFBackend(model)


__all__ = ["Backend", "ForwardOut", "causal_mask", "forward_chain", "make_backend", "BACKENDS"]
