"""Position-keyed randomness (issue 26, "a seed is a promise"): noise that is a pure function of
(seed, absolute position, slot), whatever was drafted, batched or threaded.

The token at absolute position t of a sequence (its index in prompt + output, which is also its position id in
the model) is sampled with the noise of key (seed, t, slot 0). A key is mixed into one 64-bit integer by a fixed
function (splitmix64, Steele et al. 2014, applied in turn to a domain tag, the seed, the position and the slot),
which seeds a CPU torch.Generator (Mersenne Twister) that draws V float64 uniforms. So:

- the noise of (seed, t, slot) depends on nothing else: not on how many tokens a round drafted, the tree shape,
  the batch, the thread count or the process (a CPU generator seeded with an integer is reproducible; uniform
  kernels draw serially on CPU);
- token x's value depends only on x, not on V (the stream is consumed in token order: a prefix of V' < V tokens
  sees the same first V' values);
- distinct keys give independent noise (up to 64-bit hash collisions).

Noise is always drawn on the CPU in float64 and moved to the caller's device, so a GPU run uses the same numbers.
Nothing here touches the global RNG. Gumbel noise is G = -log(-log U); `gumbel_max(p, G)` = argmax(log p + G) is a
draw from p (the Gumbel-max trick), the sampler whose draws the `gumbel` and `gls` verifiers reproduce.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from multispec.errors import check

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_DOMAIN = 0x6D756C7469737065  # "multispe": the tag of this scheme; a new scheme gets a new tag
_U_MIN = 2.0 ** -60  # the smallest uniform: U = 0 (probability 2^-53) is read as this, so that G stays finite
_PAD_KEY = -1e6  # below any finite log q + G: tokens with q = 0 follow the support, in index order


def splitmix64(x: int) -> int:
    """One step of splitmix64 (Steele, Lea, Flood 2014) on an unsigned 64-bit integer; returns one."""
    z = (x + _GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def position_key(seed: int, position: int, slot: int = 0) -> int:
    """The 64-bit key of (seed, absolute position, slot): chained splitmix64 mixing. Pure; any int inputs
    (negative ones are taken modulo 2**64)."""
    h = splitmix64(_DOMAIN)
    for part in (seed, position, slot):
        h = splitmix64(h ^ (part & MASK64))
    return h


def keyed_uniform(seed: int | Sequence[int], positions: Sequence[int], vocab: int, slot: int = 0,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """float64 [K, V] uniforms in (0, 1), row k keyed by (seed[k] or seed, positions[k], slot).

    seed: one int for every row, or one per row (per-request seeds in a batch). positions: K absolute positions.
    """
    positions = [int(t) for t in positions]
    seeds = [int(seed)] * len(positions) if isinstance(seed, int) else [int(s) for s in seed]
    check(len(seeds) == len(positions), f"{len(seeds)} seeds for {len(positions)} positions")
    check(vocab >= 1, f"vocabulary size must be >= 1, got {vocab}")
    out = torch.empty(len(positions), vocab, dtype=torch.float64)
    gen = torch.Generator()
    for k, (s, t) in enumerate(zip(seeds, positions)):
        _fill_uniform(out[k], gen, s, t, slot)
    return out if device is None else out.to(device)


def _fill_uniform(out: torch.Tensor, gen: torch.Generator, seed: int, position: int, slot: int,
                  clamp: bool = True) -> None:
    """out: float64 [V], filled with the uniforms of key (seed, position, slot). clamp=False leaves U = 0 as drawn,
    for a caller that clamps only the values it reads."""
    gen.manual_seed(position_key(seed, position, slot))
    torch.rand(out.shape[0], generator=gen, dtype=torch.float64, out=out)
    if clamp:
        out.clamp_(min=_U_MIN)  # U = 0 has probability 2^-53: map it into (0, 1) so G stays finite


def keyed_gumbel(seed: int | Sequence[int], positions: Sequence[int], vocab: int, slot: int = 0,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """float64 [K, V] standard Gumbel noise -log(-log U), row k keyed as in `keyed_uniform`. Rows are memoised
    (a round draws the same positions when drafting and when verifying; ~0.25 ms a row at V = 8k)."""
    positions = [int(t) for t in positions]
    seeds = [int(seed)] * len(positions) if isinstance(seed, int) else [int(s) for s in seed]
    check(len(seeds) == len(positions), f"{len(seeds)} seeds for {len(positions)} positions")
    out = torch.stack([_gumbel_row(s, t, vocab, slot) for s, t in zip(seeds, positions)]) if positions else \
        torch.empty(0, vocab, dtype=torch.float64)
    return out if device is None else out.to(device)


_MEMO: OrderedDict = OrderedDict()  # (seed, position, vocab, slot) -> a Gumbel row: the 32 latest
_MEMO_SIZE = 32
_MEMO_LOCK = threading.Lock()  # the server's workers draw at once


def _gumbel_row(seed: int, position: int, vocab: int, slot: int) -> torch.Tensor:
    """One row of keyed Gumbel noise, float64 [V]; a pure function of its arguments, so memoising it changes no
    result (callers never write into it)."""
    key = (seed, position, vocab, slot)
    with _MEMO_LOCK:
        row = _MEMO.get(key)
        if row is not None:
            _MEMO.move_to_end(key)
            return row
    row = _gumbel(keyed_uniform(seed, [position], vocab, slot)[0])
    with _MEMO_LOCK:
        _MEMO[key] = row
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return row


_SLACK = 1e-9  # log-space margin of keyed_max's bound: float64 scores are off by ~1e-13 at most


def keyed_max(p: torch.Tensor, seed: int, position: int, slot: int = 0) -> int:
    """int(gumbel_max(p[None], keyed_gumbel(seed, [position], V, slot))): the same token, bit for bit, at a
    third of the cost when the noise row is not memoised (a plain step in the reproducible mode, which nothing
    drafted: 5.7 ms of noise at V = 262k against 1.2 ms of uniforms here; 52 against 72 µs at V = 4,096 for the
    runner-up check and the clamp left to the few values read). p: float [V].

    Why it is the same: the score of x is log p_x + G_x with G_x = -log E_x, E_x = -log U_x >= 1 - U_x, so
    log(p_x / (1 - U_x)) bounds it from above. Every token whose score can reach the score of the token with the
    largest bound has its bound within _SLACK of that score (rounding is ~1e-13): these candidates hold every
    maximum. Usually that token is the only one; else their scores, computed as gumbel_max computes them, decide,
    the first of the largest winning as argmax does."""
    vocab = p.shape[-1]
    with _MEMO_LOCK:
        row = _MEMO.get((seed, position, vocab, slot))
    if row is not None:
        return int(gumbel_max(p[None], row[None]))
    p = p.detach().cpu()
    gen, u, bound = _scratch(vocab)  # this thread's: no 2 MB allocations (page faults) per call at V = 262k
    _fill_uniform(u, gen, seed, position, slot, clamp=False)  # clamped only where read (ref, _scores)
    torch.div(p, torch.sub(1.0, u, out=bound), out=bound)  # float64 p / (1 - U): [V] (U = 0 or 2^-60: the same)
    top = bound.topk(min(2, vocab))  # the largest bound and the runner-up in one pass
    best = int(top.indices[0])  # p > 0 there (a law has mass), so its score is finite
    ref = math.log(float(p[best])) - math.log(-math.log(max(float(u[best]), _U_MIN)))  # its score, to ~1e-15
    limit = math.exp(ref - _SLACK)  # a threshold only: every maximum's bound reaches it
    if vocab == 1 or float(top.values[1]) < limit:
        return best  # the usual case: no other token comes near
    candidates = (bound >= limit).nonzero()[:, 0]  # increasing ids; every maximum
    return int(candidates[int(_scores(p, u, candidates).argmax())])  # the first of the largest, in token order


def _scores(p: torch.Tensor, u: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """float64 log p + G of tokens `ids`: the noise of _gumbel_row, the scores of gumbel_max (the same ops)."""
    return _log_scores(p[ids], _gumbel(u[ids].clamp_(min=_U_MIN)))  # u[ids]: a copy, transformed in place


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    """-log(-log U), in place on u (float64)."""
    return u.log_().neg_().log_().neg_()


_LOCAL = threading.local()


def _scratch(vocab: int) -> tuple[torch.Generator, torch.Tensor, torch.Tensor]:
    """This thread's generator and two float64 [vocab] buffers, kept for the latest vocabulary size."""
    kept = getattr(_LOCAL, "scratch", None)
    if kept is None or kept[1].shape[0] != vocab:
        kept = _LOCAL.scratch = (torch.Generator(), torch.empty(vocab, dtype=torch.float64),
                                 torch.empty(vocab, dtype=torch.float64))
    return kept


@dataclass(frozen=True)
class PositionKeys:
    """The keys of B rows: seed (one for all rows) and positions (B absolute positions, ints), slot.

    Row b's noise is keyed by (seed, positions[b], slot). For a drafted tree, positions[u] is the absolute
    position of the token chosen AT node u, i.e. of u's children: root position + depth(u) + 1.
    """

    seed: int
    positions: tuple[int, ...]
    slot: int = 0

    def __post_init__(self) -> None:
        check(isinstance(self.seed, int) and not isinstance(self.seed, bool),
              f"seed must be an int, got {self.seed!r}")
        object.__setattr__(self, "positions", tuple(int(t) for t in self.positions))

    def __len__(self) -> int:
        return len(self.positions)

    def row(self, b: int) -> "PositionKeys":
        """The keys of row b alone (one position)."""
        return PositionKeys(self.seed, (self.positions[b],), self.slot)

    def gumbel(self, vocab: int, device: torch.device | str | None = None) -> torch.Tensor:
        """float64 [B, V] Gumbel noise of every row (rows with equal positions get equal noise)."""
        return keyed_gumbel(self.seed, self.positions, vocab, self.slot, device)


def node_keys(tree, seed: int, root_position: int) -> PositionKeys:
    """Per-node keys of a drafted tree (multispec.tree.Tree) whose root, the newest committed token, sits at
    absolute position root_position: node u draws the token at root_position + depth(u) + 1, so siblings and
    cousins share the noise of their depth."""
    return PositionKeys(seed, tuple(root_position + d + 1 for d in tree.depths))


def gumbel_max(p: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """argmax(log p + G), a draw from p when G is standard Gumbel. p: float [B, V] (target or draft, processed);
    gumbel: float64 [B, V]. Tokens with p = 0 are never chosen. Returns long [B]."""
    return _log_scores(p, gumbel).argmax(-1)


def _log_scores(p: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """float64 log p + G (-inf where p = 0)."""
    return torch.where(p > 0, torch.log(p.double()), -torch.inf) + gumbel.to(p.device)


def gumbel_top(q: torch.Tensor, n: int, gumbel: torch.Tensor) -> torch.Tensor:
    """The n tokens of largest log q + G, best first (top-n Gumbel: marginally n draws from q without
    replacement). Tokens with q = 0 come after q's support, lowest index first. q: float [B, V];
    gumbel: float64 [B, V]. Returns long [B, n]."""
    v = q.shape[-1]
    check(1 <= n <= v, f"cannot take {n} distinct drafts from a vocabulary of {v} tokens")
    pad = _PAD_KEY - torch.arange(v, dtype=torch.float64, device=q.device)  # [V]
    scores = torch.where(q > 0, torch.log(q.double()) + gumbel.to(q.device), pad)
    return scores.topk(n, dim=-1).indices


def keyed_sample(p: torch.Tensor, keys: PositionKeys) -> torch.Tensor:
    """Autoregressive sampling with position keys: row b draws argmax(log p[b] + G(seed, positions[b])).
    p: float [B, V]. Returns long [B]. This is the sampler whose output `gumbel` and `gls` reproduce exactly."""
    check(p.dim() == 2 and p.shape[0] == len(keys), f"p must be [B, V] with B = {len(keys)}, got {tuple(p.shape)}")
    return gumbel_max(p, keys.gumbel(p.shape[-1], p.device))


__all__ = ["PositionKeys", "gumbel_max", "gumbel_top", "keyed_gumbel", "keyed_max", "keyed_sample", "keyed_uniform",
           "node_keys", "position_key", "splitmix64"]
