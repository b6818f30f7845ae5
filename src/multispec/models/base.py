"""The backend protocol: the only code that owns a KV cache.

The engine and proposers talk to a model through four calls:
- `forward(tokens, positions, mask, want_hidden)`: append `tokens` after the cached rows and return their logits
  (and last hidden states). `mask` is bool [N, cache_len + N]: row i says which cached rows and which of the new
  tokens token i attends to. Prefill, one-token decode, a chain and a whole token tree are all this one call.
  `mask=None` means a plain causal chain after all cached rows: the cheap path (no mask built for a 1-token decode).
- `max_positions`: the model's position limit (int), or None when it has none.
- `keep(indices)`: keep only these cache rows, in this order (a gather, then a crop): how a round keeps the prefix
  plus the accepted path and drops the rest.
- `cache_len`, `reset()`.
- optionally a `last_only` keyword of `forward`: True asks for the last token's logits only (the output layer
  skipped for the other rows where the backend can; logits[-1] is read either way) — what a prefill needs (for a
  300-token prompt the output layer is most of a small model's prefill).
Validity comes from the mask and the positions, never from zeroed memory.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Generator, Protocol, TypeGuard, TypeVar

import torch

T = TypeVar("T")


@dataclass
class ForwardOut:
    """logits: float32 [N, V]. hidden: float32 [N, H] last hidden state (after the final norm), or None. argmax:
    long [N] on the CPU, each row's argmax, where the backend took it for a whole batch at once (models/batched.py;
    a greedy verifier reads it instead of taking its own), else None. shared: the sequences the forward carried
    (> 1: a batched forward, its time the batch's)."""

    logits: torch.Tensor
    hidden: torch.Tensor | None
    argmax: torch.Tensor | None = None
    shared: int = 1


class Backend(Protocol):
    name: str
    vocab_size: int
    hidden_size: int
    device: torch.device
    max_positions: int | None

    @property
    def cache_len(self) -> int: ...

    def reset(self) -> None: ...

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
        want_hidden: bool = False
    ) -> ForwardOut: ...

    def keep(self, indices: torch.Tensor) -> None: ...


class LastOnlyBackend(Backend, Protocol):
    """A backend whose forward takes the optional `last_only` keyword (every backend in models/ does; wrappers
    and test doubles may not: `takes_last_only` tells)."""

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None = None,
        want_hidden: bool = False, last_only: bool = False
    ) -> ForwardOut: ...


def causal_mask(cache_len: int, n: int) -> torch.Tensor:
    """bool [n, cache_len + n]: every cached row, plus the new tokens causally (a chain)."""
    tail = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.cat([torch.ones(n, cache_len, dtype=torch.bool), tail], dim=1)


class VocabSubsetBackend(Backend, Protocol):
    """A backend that can restrict its output layer to a subset of the vocabulary (models/reduced_vocab.py's mixin:
    a cheap draft, models/cheap.py). vocab_subset: the restricted layer, None for the full one."""

    vocab_subset: object

    def set_vocab_subset(self, ids) -> None: ...

    def extend_vocab_subset(self, ids) -> None: ...


def sync(device) -> None:
    """Wait for a GPU's queued work, so that a timer read after a forward counts the forward, not its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def takes_last_only(backend: Backend) -> TypeGuard[LastOnlyBackend]:
    """Whether the backend's forward takes the optional `last_only` keyword (wrappers and test doubles may not)."""
    return "last_only" in inspect.signature(backend.forward).parameters


def has_vocab_subset(backend: Backend) -> TypeGuard[VocabSubsetBackend]:
    """Whether the backend's output layer is restricted to a vocabulary subset now (`vocab_subset` set)."""
    return getattr(backend, "vocab_subset", None) is not None


@dataclass
class Forward:
    """One forward a round asks for: what `Backend.forward` takes, as a value. A round written as a generator yields
    these and gets each ForwardOut back (decoding/engine.py runs a step's requests of many sequences together:
    models/batched.forward_all); `drive` runs such a generator alone, each request as it comes.
    tokens, positions: long [n]; mask: bool [n, cache_len + n] or None (a chain after every cached row)."""

    backend: Backend
    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None = None
    want_hidden: bool = False
    last_only: bool = False  # only the last row's logits are read (a backend that can skip the others does)
    chunk: bool = False  # a prefill chunk: the engine may run it a step later, under its prefill token budget

    def run(self) -> ForwardOut:
        if self.last_only and self.tokens.shape[0] > 1 and takes_last_only(self.backend):
            return self.backend.forward(self.tokens, self.positions, self.mask, self.want_hidden, last_only=True)
        return self.backend.forward(self.tokens, self.positions, self.mask, self.want_hidden)


# a round or a part of one, as a generator: yields the forwards it needs (None: its turn of the step is over),
# is sent each one's ForwardOut, returns its result
Steps = Generator[Forward | None, ForwardOut, T]  # (sent None after a None: the turn's end)


def drive(steps: Steps[T]) -> T:
    """Run a generator of forwards alone: each request as it comes, in order; its result."""
    value: ForwardOut | None = None
    while True:
        try:
            request = steps.send(value)  # type: ignore[arg-type]
        except StopIteration as done:
            return done.value
        value = request.run() if request is not None else None


def chain(backend: Backend, tokens: torch.Tensor, want_hidden: bool = False, last_only: bool = False) -> Forward:
    """The request that appends a plain chain of tokens (long [N]) after the backend's cached rows: run it before
    any other forward on that backend (its positions and mask are the cache's now)."""
    start, n = backend.cache_len, tokens.shape[0]
    return Forward(backend, tokens, torch.arange(start, start + n), causal_mask(start, n), want_hidden, last_only)


def forward_chain(backend: Backend, tokens: torch.Tensor, want_hidden: bool = False,
                  last_only: bool = False) -> ForwardOut:
    """Append a plain chain of tokens (prefill or decode). tokens: long [N]. last_only: only the last row's logits
    are read (logits[-1]); a backend that can skip the others' output layer does ([1, V]), others return all."""
    return chain(backend, tokens, want_hidden, last_only).run()
