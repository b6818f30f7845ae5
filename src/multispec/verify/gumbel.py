"""Drafter-invariant verification (issue 26): `gumbel` for chains, `gls` for trees.

p is ALWAYS the target and q the draft (processed, design §1). Daliri, Musco, Suresh, "Coupling without
Communication and Drafter-Invariant Speculative Decoding" (arXiv 2408.07978): the target and the draft share the
noise of each position. With G_t the position-keyed Gumbel noise of absolute position t (`verify.keyed`,
key (seed, t, slot 0)):

- the target's token at t is  y_t = argmax_x (log p_t(x) + G_t(x))   (Gumbel-max: y_t ~ p_t exactly);
- the draft proposes          d_t = argmax_x (log q_t(x) + G_t(x))   (`gumbel`: one draft per position), or the
  top n of log q_t + G_t, best first (`gls`: n siblings; marginally n draws from q without replacement);
- verification walks from the root: at node u (drawing position t = position of u's children) it computes y_t
  from p[u] and the noise of t, descends into the child whose token is y_t, and ends the round with y_t when no
  child has it (at a leaf y_t is the bonus token). A draft is accepted iff it IS the target's Gumbel-max token.

Invariance. Every committed token is y_t = argmax(log p(.|committed prefix) + G_t): a deterministic function of
the target's distributions along the committed path and the seed, which does not involve the drafts at all. So
for a fixed seed the committed text is the same whatever the draft model, draft length, tree shape or batch, and
it equals plain autoregressive sampling with `keyed.keyed_sample` (Gumbel-max with the same position keys).
Losslessness follows: G_t is independent of G_{<t}, hence of the prefix, so y_t | prefix ~ p_t (Gumbel-max
trick). The drafts only decide how many of those tokens one target call reveals.

About `gls`. Gumbel-max List Sampling (GLS, NeurIPS 2025) gives draft k its own noise slot G^k and takes the
target's token as argmax(log p + max_k G^k); that target token depends on the list size K, so the text would
depend on the tree's width. Here the target's token is always the slot-0 Gumbel-max y_t, and the list is the top
n of log q + G_t under the same noise: distinct drafts, the first is the chain draft d_t, and the committed token
at each position is identical whatever the tree (a node with n children contains y_t with probability
sum_x A_n(x) below, which grows with n and is 1 when q = p). `acceptance_mc(..., mode="slots")` measures the
paper's K-slot list for comparison.

Exact laws. With E_x = exp(-G_x) i.i.d. Exp(1), y = argmin E_x / p_x and the draft list orders E_x / q_x.
- `coupled_ranks(p, q, n)[x, r]` = P(y = x and x is draft number r): conditioning on E_x = e, each other token j
  is independently ahead of x in the list and behind it for the target with probability
  (exp(-e a_j) - exp(-e b_j))_+, else behind in both with probability exp(-e max(a_j, b_j)), a_j = p_j/p_x,
  b_j = q_j/q_x; the generating polynomial's z^r coefficient integrated against e^-e gives a finite sum of
  weight/(1 + rate) terms. For n = 1: P(y = d = x) = 1 / sum_j max(p_j/p_x, q_j/q_x).
- `coupled_joint(p, q)[y, d]` = P(target y, single draft d): for y != d, substituting E_d = r E_y,
  integral over r in (p_d/p_y, q_d/q_y) of dr / (1 + r + sum_{j != y, d} max(a_j, r b_j))^2 (a_j = p_j/p_y,
  b_j = q_j/q_d), piecewise rational, summed exactly.
- `gumbel`'s `law` (the twin of `verify` for a fixed drafted chain) is then exact: positions have independent
  noise, and given its draft d_t the target's token at t has law joint[:, d_t] / q_t(d_t).
- `gls` has no such law for a fixed drafted tree (cousins share their depth's noise, so the tree's tokens
  constrain it jointly); `round_law` gives instead the exact law of a whole round, drafting included, from the
  target and draft laws of every prefix: the accepted path's levels use independent noise, so its probability is
  the product of coupled_ranks along the path times the stop factor p - sum_r ranks.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np
import torch

from multispec.errors import MultispecError, check
from multispec.tree import Tree
from multispec.verify.keyed import PositionKeys, gumbel_max, gumbel_top, keyed_max

Outcome = tuple[tuple[int, ...], int]
_ROUNDING = 1e-15  # round_law drops stop masses below this (p - ranks when the draft always has the token)


# ----------------------------------------------------------------------------------- the verifier
def check_keys(tree: Tree, keys) -> None:
    """MultispecError unless keys is a PositionKeys with one position per node, each node's position one more
    than its parent's (keys by absolute position: depth d of a round draws position root + d + 1)."""
    check(isinstance(keys, PositionKeys),
          "the gumbel/gls verifiers need position keys (multispec.verify.keyed.PositionKeys: seed and the absolute "
          f"position each node draws), not {type(keys).__name__}: build them with keyed.node_keys(tree, seed, "
          "root_position) and draft with multispec.drafting.coupled.coupled_draw")
    check(len(keys) == len(tree), f"{len(keys)} position keys for a tree of {len(tree)} nodes")
    start = keys.positions[0]
    check(all(t == start + d for t, d in zip(keys.positions, tree.depths)),
          "position keys must follow the tree: node u draws position keys.positions[0] + depth(u)")


def verify_gumbel(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                  keys: PositionKeys) -> Outcome:
    """Verify a drafted chain or tree with the position's Gumbel-max token (module docstring).

    tree: the drafted topology; tokens: long [N] (tokens[0], the root, is ignored); p: float [N, V], p[u] = target
    p(.|c, path(u)); q: float [N, V], the draft laws (unused: the decision needs none); keys: PositionKeys, one
    position per node (`keyed.node_keys`). Returns (path, next_token): accepted nodes from the root 0, and the
    target's Gumbel-max token that ends the round (the bonus at a leaf). Deterministic; no generator.
    """
    check_keys(tree, keys)
    node, path = 0, [0]
    while True:
        want = keyed_max(p[node], keys.seed, keys.positions[node], keys.slot)  # gumbel_max, cheaper
        child = next((kid for kid in tree.children[node] if int(tokens[kid]) == want), None)
        if child is None:
            return tuple(path), want
        path.append(child)
        node = child


# ----------------------------------------------------------------------------------- exact laws at one node
def _as_np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def coupled_ranks(p, q, n: int) -> np.ndarray:
    """float64 [V, n]: P(the target's Gumbel-max token is x and x is draft number r of the top-n list of
    log q + G under the same noise). p: target [V]; q: draft [V] (numpy or torch). Sum over r: the probability
    that the target's token is x and is drafted; p(x) minus it: that it is x and not drafted.

    Exact (module docstring). Cost grows like V * sum_{r<n} C(V-1, r) 2^r terms: meant for V up to a few dozen.
    """
    p, q = _as_np(p), _as_np(q)
    v = p.shape[0]
    check(q.shape == (v,) and 1 <= n <= v, f"p, q must be [V] alike and 1 <= n <= V, got {p.shape}, {q.shape}, {n}")
    out = np.zeros((v, n))
    support = np.flatnonzero(q > 0)
    pads = [x for x in range(v) if q[x] <= 0]  # after the support, lowest index first
    for rank, pad in enumerate(pads, start=len(support)):
        if rank < n:
            out[pad, rank] = p[pad]
    for x in support:
        if p[x] <= 0:
            continue
        others = np.array([j for j in range(v) if j != x], dtype=np.int64)
        a, b = p[others] / p[x], q[others] / q[x]
        # coefficient r of prod_j (behind_j + z ahead_j): arrays of (rate, weight) for exp(-rate e) terms
        rates = [np.zeros(1)] + [np.zeros(0)] * (n - 1)
        weights = [np.ones(1)] + [np.zeros(0)] * (n - 1)
        for aj, bj in zip(a, b):
            new_r, new_w = [], []
            for r in range(n):
                parts_r, parts_w = [rates[r] + max(aj, bj)], [weights[r]]  # j behind x for both
                if r and bj > aj and rates[r - 1].size:  # j ahead of x in the list, behind for the target
                    parts_r += [rates[r - 1] + aj, rates[r - 1] + bj]
                    parts_w += [weights[r - 1], -weights[r - 1]]
                new_r.append(np.concatenate(parts_r))
                new_w.append(np.concatenate(parts_w))
            rates, weights = new_r, new_w
        for r in range(n):
            out[x, r] = float(np.sum(weights[r] / (1.0 + rates[r])))  # integral of e^-e exp(-rate e)
    return np.clip(out, 0.0, None)


def coupled_joint(p, q) -> np.ndarray:
    """float64 [V, V]: P(target's Gumbel-max token = y, draft's Gumbel-max token = d) under one shared noise.
    p: target [V]; q: draft [V]. Rows sum to p, columns to q (module docstring for the formula)."""
    p, q = _as_np(p), _as_np(q)
    v = p.shape[0]
    out = np.zeros((v, v))
    for y in np.flatnonzero(p > 0):
        for d in np.flatnonzero(q > 0):
            if y == d:
                out[y, d] = 1.0 / float(np.sum(np.maximum(p / p[y], q / q[d])))
                continue
            rest = np.array([j for j in range(v) if j not in (y, d)], dtype=np.int64)
            a, b = p[rest] / p[y], q[rest] / q[d]
            lo = p[d] / p[y]
            hi = q[d] / q[y] if q[y] > 0 else np.inf
            if hi <= lo:
                continue
            cuts = sorted({float(aj / bj) for aj, bj in zip(a, b) if bj > 0 and lo < aj / bj < hi})
            edges = [lo, *cuts, hi]
            total = 0.0
            for r1, r2 in zip(edges[:-1], edges[1:]):
                mid = r1 + 1.0 if np.isinf(r2) else 0.5 * (r1 + r2)
                ahead = a < mid * b  # the j whose max is r b_j on this piece
                alpha = 1.0 + float(a[~ahead].sum())
                beta = 1.0 + float(b[ahead].sum())
                c1 = alpha + beta * r1
                total += 1.0 / (beta * c1) if np.isinf(r2) else (r2 - r1) / (c1 * (alpha + beta * r2))
            out[y, d] = total
    return out


def gumbel_chain_law(tree: Tree, tokens: torch.Tensor, p: torch.Tensor,
                     q: torch.Tensor) -> dict[Outcome, float]:
    """Exact law of `verify_gumbel` on a drafted chain, averaging the noise given the drafts (each d_i drawn by
    `coupled_draw` with the noise of its position). tokens: long [g+1]; p, q: float [g+1, V] (q[g] unused).
    Returns {(path, next_token): probability}."""
    check(all(len(kids) <= 1 for kids in tree.children), "gumbel verifies a chain; use gls for a tree")
    g = len(tree) - 1
    law: dict[Outcome, float] = defaultdict(float)
    reach = 1.0
    for i in range(g + 1):
        if i == g:  # every draft accepted: the bonus is the target's own draw at the next position
            cond = _as_np(p[g])
        else:
            d = int(tokens[i + 1])
            qd = float(q[i, d])
            if qd <= 0:  # never drafted by coupled_draw from q; the target's draw is then independent of it
                cond = _as_np(p[i])
            else:
                cond = coupled_joint(p[i], q[i])[:, d] / qd
        for y in np.flatnonzero(cond > 0):
            if i < g and y == int(tokens[i + 1]):
                continue
            law[(tuple(range(i + 1)), int(y))] += reach * float(cond[y])
        if i < g:
            reach *= float(cond[int(tokens[i + 1])])
            if reach <= 0:
                break
    return dict(law)


def round_law(tree: Tree, pq: Callable[[tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]]
              ) -> dict[tuple[int, ...], tuple[float, int]]:
    """Exact law of one coupled round (drafting with `coupled_draw` AND verifying with `verify_gumbel`).

    tree: the topology (children in drafting order: child r gets draft number r); pq(prefix) -> (p [V], q [V]):
    the target's and the draft's next-token laws after the committed prefix plus `prefix`. Returns
    {committed tokens (accepted drafts + the final token): (probability, accepted count)}.
    """
    law: dict[tuple[int, ...], list] = {}

    def visit(node: int, prefix: tuple[int, ...], prob: float) -> None:
        p, q = (_as_np(x) for x in pq(prefix))
        kids = tree.children[node]
        ranks = coupled_ranks(p, q, len(kids)) if kids else np.zeros((p.shape[0], 0))
        stop = p - ranks.sum(1)
        for y in np.flatnonzero(stop > _ROUNDING):
            key = prefix + (int(y),)
            law.setdefault(key, [0.0, len(prefix)])[0] += prob * float(stop[y])
        for x, r in zip(*np.nonzero(ranks > 0)):
            visit(kids[r], prefix + (int(x),), prob * float(ranks[x, r]))

    visit(0, (), 1.0)
    return {k: (v[0], v[1]) for k, v in law.items()}


# ----------------------------------------------------------------------------------- acceptance
def coupling_acceptance(p, q, n: int = 1) -> float:
    """Exact probability that the target's Gumbel-max token is among the n coupled drafts (top n of log q + G):
    sum of coupled_ranks. n = 1: sum_x 1 / sum_j max(p_j/p_x, q_j/q_x), any V (Daliri et al.:
    >= (1 - TV) / (1 + TV)). p: target [V]; q: draft [V]."""
    p, q = _as_np(p), _as_np(q)
    if n == 1:
        both = np.flatnonzero((p > 0) & (q > 0))
        return float(sum(1.0 / np.sum(np.maximum(p / p[x], q / q[x])) for x in both))
    return float(coupled_ranks(p, q, n).sum())


def acceptance_mc(p, q, n: int = 1, samples: int = 100_000, seed: int = 0, mode: str = "list") -> tuple[float, float]:
    """Monte Carlo acceptance (value, standard error) with `samples` i.i.d. noises from a seeded generator.

    mode "list": the top n of log q + G with the target's slot-0 Gumbel-max (what `gls` does; n = 1 is `gumbel`).
    mode "slots": GLS as published: draft k = argmax(log q + G^k) for n independent slots and the target's token
    argmax(log p + max_k G^k) (a draw from p too, but one that depends on n).
    mode "independent": one draft from q with noise independent of the target's (acceptance sum_x p_x q_x).
    p: target [V]; q: draft [V].
    """
    p = torch.as_tensor(_as_np(p))
    q = torch.as_tensor(_as_np(q))
    gen = torch.Generator().manual_seed(seed)
    v = p.shape[0]

    def noise(k: int) -> torch.Tensor:
        return -torch.log(-torch.log(torch.rand(samples, k, v, generator=gen, dtype=torch.float64).clamp_min(1e-300)))

    if mode == "list":
        g = noise(1)[:, 0]
        hit = (gumbel_top(q.expand(samples, v), n, g) == gumbel_max(p.expand(samples, v), g)[:, None]).any(-1)
    elif mode == "slots":
        g = noise(n)  # [S, n, V]
        drafts = gumbel_max(q.expand(samples, n, v).reshape(-1, v), g.reshape(-1, v)).reshape(samples, n)
        hit = (drafts == gumbel_max(p.expand(samples, v), g.amax(1))[:, None]).any(-1)
    elif mode == "independent":
        g = noise(2)
        hit = gumbel_max(q.expand(samples, v), g[:, 1]) == gumbel_max(p.expand(samples, v), g[:, 0])
    else:
        raise MultispecError(f"unknown mode {mode!r}: list, slots or independent")
    rate = float(hit.double().mean())
    return rate, (rate * (1 - rate) / samples) ** 0.5


__all__ = ["acceptance_mc", "check_keys", "coupled_joint", "coupled_ranks", "coupling_acceptance",
           "gumbel_chain_law", "round_law", "verify_gumbel"]
