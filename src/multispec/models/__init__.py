"""Model backends behind one small protocol (see base.py)."""
from __future__ import annotations

import torch

from multispec.errors import check
from multispec.models.base import Backend, ForwardOut, causal_mask, forward_chain
from multispec.models.sidecar import ModelSidecar

BACKENDS = ("hf", "fast", "compiled")  # compiled: the fast backend, its steps torch.compile'd


def make_backend(model: torch.nn.Module, kind: str = "hf", max_len: int | None = None,
                 sidecar: ModelSidecar | None = None) -> Backend:
    """A fresh backend (with its own empty cache) over a loaded model. max_len: the fast backend's cache rows
    (size it to prompt + max_new_tokens + one round's tree; default the model's position limit, at most 4096, plus
    256); the transformers backend's cache grows as needed and ignores it. "compiled" is the fast backend with its
    steps of up to 64 tokens compiled (models/fast_compile.py; each step size compiles on first use). sidecar: what
    is prepared for the model (models/sidecar.py: the fast backend's step and its few-row table; pass the pair's,
    `pair.sidecar(model)`, so that it is built once; default a fresh one). The transformers backend runs the model
    as transformers does; the fast backend takes the few-row product where the table says so (models/rows.py)."""
    check(kind in BACKENDS, f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    if kind in ("fast", "compiled"):
        from multispec.models.fast import FastBackend

        return FastBackend(model, max_len=max_len, compile=kind == "compiled", sidecar=sidecar)
    from multispec.models.hf import HFBackend

    return HFBackend(model, sidecar=sidecar)


def tree_refusal(model: torch.nn.Module, sidecar: ModelSidecar | None = None) -> str | None:
    """Why tree methods cannot run on this model (attention by cache row, e.g. ALiBi), or None: for refusing a tree
    method before generation starts. Only chain methods (ar, sd) run on such a model. sidecar: the model's, which
    keeps the answer (default: read from the config now)."""
    return (sidecar if sidecar is not None else ModelSidecar(model)).tree_refusal()


__all__ = ["Backend", "ForwardOut", "ModelSidecar", "causal_mask", "forward_chain", "make_backend", "tree_refusal",
           "BACKENDS"]
