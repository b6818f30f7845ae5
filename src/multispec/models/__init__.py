"""Model backends behind one small protocol (see base.py)."""
from __future__ import annotations

import torch

from multispec.errors import check
from multispec.models.base import Backend, ForwardOut, causal_mask, forward_chain

BACKENDS = ("hf", "fast", "compiled")  # compiled: the fast backend, its steps torch.compile'd


def make_backend(model: torch.nn.Module, kind: str = "hf", max_len: int | None = None) -> Backend:
    """A fresh backend (with its own empty cache) over a loaded model. max_len: the fast backend's cache rows
    (size it to prompt + max_new_tokens + one round's tree; default the model's position limit, at most 4096, plus
    256); the transformers backend's cache grows as needed and ignores it. "compiled" is the fast backend with its
    steps of up to 64 tokens compiled (models/fast_compile.py; each step size compiles on first use). The model's
    float32 CPU Linear layers take the few-row product where it measures faster (models/rows.py)."""
    check(kind in BACKENDS, f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    from multispec.models import rows

    rows.install(model)  # float32 CPU layers: the few-row product where it measures faster (models/rows.py)
    if kind in ("fast", "compiled"):
        from multispec.models.fast import FastBackend

        return FastBackend(model, max_len=max_len, compile=kind == "compiled")
    from multispec.models.hf import HFBackend

    return HFBackend(model)


def tree_refusal(model: torch.nn.Module) -> str | None:
    """Why tree methods cannot run on this model (attention by cache row, e.g. ALiBi), or None: for refusing a tree
    method before generation starts. Only chain methods (ar, sd) run on such a model."""
    from multispec.models.layout import attention_layout

    cached = model.__dict__.get("_multispec_tree_refusal")  # ~4 ms of config reads, asked by every auto lane
    if cached is None or cached[0] is not model.config:
        cached = (model.config, attention_layout(model.config).tree_refusal)
        model.__dict__["_multispec_tree_refusal"] = cached
    return cached[1]


__all__ = ["Backend", "ForwardOut", "causal_mask", "forward_chain", "make_backend", "tree_refusal", "BACKENDS"]
