"""Verification of a whole round batch in tensor operations on the model's device.

The per-sequence verifiers (tree_walk, naive, block) take one drafted tree and read p and q on the CPU. Here every
sequence of a round is verified at once, as vLLM's rejection sampler does: the trees are flattened into one ragged
batch (`RoundBatch`: each sequence's nodes in their Tree order, root first, `cu_num_tokens` [B+1] delimiting them),
p and q stay where the target's forward left them, and the only host copy is the small result at the end
(`Verified.outcomes`).

- `greedy_batch`: temperature 0, any trees: the outcome of `walk_tree_greedy` on every sequence.
- `chain_batch`: sampled chains, kind "sd" (the node walk of sd, what the engine runs for an `sd` chain), "naive"
  (sd's formula on point masses: child x is accepted with p(x), a rejection draws from p without x; the law of
  `verify_naive` on a chain) or "block" (`verify_block`).
- `chain_batch_law`: the exact law of `chain_batch`, its coins replaced by their probabilities (the same plan), which
  the tests compare with the per-sequence verifiers' `*_law` by enumeration.

Randomness: a sequence's uniforms come from its own generator, drawn up front in a fixed layout (the only Python loop
over sequences: one `torch.rand` per generator), so its outcome does not depend on the other sequences of the batch.
The layout of "sd" and "block" is the per-sequence verifier's, so with float64 p the first round draws what
`walk_tree` (sd) and `verify_block` draw from the same generator state; the generator then stands further on (all of
a chain's coins are drawn, not only those the walk reaches). "naive" draws differently from `verify_naive` (one coin
per draft, not one token per node): same law, other draws.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from multispec.errors import MultispecError, check
from multispec.sampling import NAN_LOGITS
from multispec.tree import Tree
from multispec.verify.base import accept_probability, normalize_or

Outcome = tuple[tuple[int, ...], int]
KINDS = ("sd", "naive", "block")
# one generator per sequence (each sequence's draws its own), or one (or None: the global one) for the whole batch
Generators = torch.Generator | Sequence[torch.Generator | None] | None


@dataclass(frozen=True)
class RoundBatch:
    """A round's drafted trees, flattened: N nodes over B sequences, each sequence's nodes contiguous, root first,
    in its Tree's (breadth-first, drafting) order. Built once per round by `of`.

    tokens: long [N]; cu_num_tokens: long [B+1], sequence b's nodes are cu[b]..cu[b+1]-1; parent: long [N], the flat
    index of each node's parent (-1 at a root); depth: long [N]; seq: long [N], each node's sequence.
    Host side: sizes (N_b per sequence), max_depth, chains (every tree a chain).
    """

    tokens: torch.Tensor
    cu_num_tokens: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    seq: torch.Tensor
    sizes: tuple[int, ...]
    max_depth: int
    chains: bool

    @staticmethod
    def of(trees: Sequence[Tree], tokens_list: Sequence[torch.Tensor | list[int]],
           device: torch.device | str | None = None) -> "RoundBatch":
        """trees[b] and tokens_list[b] (long [N_b] or ints; the root's token is not read) of every sequence."""
        check(len(trees) >= 1 and len(trees) == len(tokens_list),
              f"a round batch needs one token list per tree, got {len(trees)} trees and {len(tokens_list)} lists")
        toks = [torch.as_tensor(t, dtype=torch.long) for t in tokens_list]
        parents: list[int] = []
        depths: list[int] = []
        seqs: list[int] = []
        cu = [0]
        for b, (tree, t) in enumerate(zip(trees, toks)):
            check(t.shape == (len(tree),), f"sequence {b}: a tree of {len(tree)} nodes needs tokens [{len(tree)}], "
                                           f"got {tuple(t.shape)}")
            off = cu[-1]
            parents.extend(-1 if par < 0 else par + off for par in tree.parents)
            depths.extend(tree.depths)
            seqs.extend([b] * len(tree))
            cu.append(off + len(tree))
        device = torch.device(device) if device is not None else toks[0].device
        meta = torch.tensor([parents, depths, seqs], dtype=torch.long).to(device)  # [3, N]: one copy
        tokens = torch.cat(toks).to(device) if len({t.device for t in toks}) == 1 else \
            torch.cat([t.to(device) for t in toks])
        return RoundBatch(tokens=tokens, cu_num_tokens=torch.tensor(cu, dtype=torch.long).to(device),
                          parent=meta[0], depth=meta[1], seq=meta[2], sizes=tuple(len(t) for t in trees),
                          max_depth=max(t.max_depth for t in trees),
                          chains=all(len(kids) <= 1 for t in trees for kids in t.children))

    @property
    def start(self) -> torch.Tensor:
        """long [B]: each sequence's root, a flat index."""
        return self.cu_num_tokens[:-1]

    @property
    def size(self) -> torch.Tensor:
        """long [B]: N_b."""
        return self.cu_num_tokens[1:] - self.cu_num_tokens[:-1]


@dataclass(frozen=True)
class Verified:
    """A round batch's outcome, on the device.

    path: long [B, D+1], sequence b's accepted nodes (relative to its root 0), -1 after them (D: the batch's max depth);
    path_len: long [B], nodes on the path, root included (>= 1); next_token: long [B], the token that ends the round;
    bad: long [B], 0, or 1 where the law drawn from had no finite positive mass, 2 where it was NaN.
    """

    path: torch.Tensor
    path_len: torch.Tensor
    next_token: torch.Tensor
    bad: torch.Tensor

    def outcomes(self, errors: bool = False) -> list:
        """[(path, next token)] per sequence, as the per-sequence verifiers return it: one host copy for the batch.
        MultispecError if a sequence drew from a law with no mass (as sampling.sample_rows raises); errors: that
        sequence's entry is the error instead (the others' outcomes stand)."""
        rows = torch.cat([self.path, self.path_len[:, None], self.next_token[:, None], self.bad[:, None]], 1).tolist()
        out: list = []
        for row in rows:
            *path, n, nxt, bad = row
            if bad:
                error = MultispecError(NAN_LOGITS if bad == 2 else "internal: a sampling law has no finite positive "
                                                                   "mass (a row of zeros or infinities)")
                if not errors:
                    raise error
                out.append(error)
                continue
            out.append((tuple(path[:n]), nxt))
        return out


# ----------------------------------------------------------------------------------- shared steps
def _path_of(batch: RoundBatch, on: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """on: bool [N], the nodes on each sequence's path (one per depth 0..L_b). Returns path long [B, D+1] (-1 padded),
    path_len long [B] and last long [B], each path's last node (flat)."""
    b, width = len(batch.sizes), batch.max_depth + 2  # the last column takes every node off the path
    idx = torch.arange(batch.tokens.shape[0], device=on.device)
    path_len = torch.zeros(b, dtype=torch.long, device=on.device).index_add_(0, batch.seq, on.long())  # [B]
    slot = batch.seq * width + torch.where(on, batch.depth, torch.full_like(batch.depth, width - 1))  # [N]
    local = idx - batch.start[batch.seq]  # [N]
    path = torch.full((b * width,), -1, dtype=torch.long, device=on.device).scatter_(0, slot, local)
    path = path.view(b, width)[:, :-1]  # [B, D+1]
    last = batch.start + path.gather(1, (path_len - 1)[:, None])[:, 0]  # [B]
    return path, path_len, last


def _first_matching_child(parent: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
    """parent: long [N] (roots clamped to 0), match: bool [N]. Returns long [N]: per node, its first child (in flat,
    i.e. drafting, order) with match set, N where none."""
    n = parent.shape[0]
    idx = torch.arange(n, device=parent.device)
    none = torch.full_like(idx, n)
    return none.scatter_reduce(0, parent, torch.where(match, idx, none), reduce="amin")


def _inverse_cdf(rows: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of rows: float [B, V] (any positive scale) from u: float64 [B], with sampling.sample_rows's
    arithmetic (float64 cdf, u * total kept below total). Returns tokens long [B] and bad long [B] (Verified.bad),
    without a host check: the flag travels with the result."""
    cdf = rows.double().cumsum(-1)  # [B, V]
    total = cdf[:, -1:]  # [B, 1]
    bad = torch.where(total.isnan(), 2, torch.where((total > 0) & total.isfinite(), 0, 1))[:, 0]  # [B]
    x = u.to(rows.device)[:, None] * total
    x = torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True)[:, 0].clamp_max(rows.shape[-1] - 1), bad.long()


# ----------------------------------------------------------------------------------- greedy
def greedy_batch(batch: RoundBatch, best: torch.Tensor) -> Verified:
    """Greedy verification of every sequence. best: long [N], the target's argmax at each node (lowest index on ties).

    A child is accepted when its token is best[parent] (the first such child in drafting order) and its parent is on
    the path; the next token is best at the path's last node: walk_tree_greedy on each sequence."""
    par = batch.parent.clamp_min(0)  # [N]; a root's own "parent" is never read as one (match is False there)
    match = (batch.parent >= 0) & (batch.tokens == best[par])  # [N]
    idx = torch.arange(match.shape[0], device=match.device)
    chosen = match & (_first_matching_child(par, match)[par] == idx)  # [N]
    on = batch.parent < 0  # [N], the roots; then one level per pass
    for _ in range(batch.max_depth):
        on = on | (chosen & on[par])
    path, path_len, last = _path_of(batch, on)
    return Verified(path, path_len, best[last], torch.zeros_like(path_len))


# ----------------------------------------------------------------------------------- sampled chains
@dataclass(frozen=True)
class ChainPlan:
    """A chain batch's decisions before any coin is thrown (as base.Plan is for a node).

    num, den: float64 [N]; the coin of node j (a draft, depth >= 1) succeeds iff u * den < num (roots: unused).
    rule: "first" (sd, naive: the path runs to the first failed coin) or "last" (block: the path runs to the last
        successful coin).
    law_at(node long [B], bonus bool [B]) -> float [B, V]: the law of the next token when the path ends at node
        (bonus: the whole chain was accepted), any positive scale.
    """

    num: torch.Tensor
    den: torch.Tensor
    rule: str
    law_at: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _sd_residual(p_rows: torch.Tensor, q_rows: torch.Tensor) -> torch.Tensor:
    """norm((p - q)_+) (p where it has no mass), as sd.plan_sd. p_rows, q_rows: float [B, V]."""
    return normalize_or((p_rows - q_rows).clamp_min(0), p_rows)


def _naive_residual(p_rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sd's residual norm((p - q)_+) for q a point mass at the rejected draft x: long [B]: p without x, normalized.
    p_rows: float [B, V]."""
    return normalize_or(p_rows.scatter(1, x[:, None], 0.0), p_rows)


def _block_residual(w: torch.Tensor, p_rows: torch.Tensor, q_rows: torch.Tensor) -> torch.Tensor:
    """norm((w p - q)_+) (p where it has no mass), as block._residual. w: float64 [B]; p_rows, q_rows: float [B, V]."""
    return normalize_or((w.to(p_rows.dtype)[:, None] * p_rows - q_rows).clamp_min(0), p_rows)


def _block_weights(batch: RoundBatch, px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
    """float64 [N]: block's w at each node (1 at a root; w = min(1, w_parent p(x) / q(x)), 0 where q(x) = 0)."""
    par = batch.parent.clamp_min(0)
    pos = qx > 0
    safe = torch.where(pos, qx, torch.ones_like(qx))
    w = torch.ones_like(px)
    for d in range(1, batch.max_depth + 1):  # one level per pass: a parent's weight is final before its child's
        step = torch.where(pos, (w[par] * px / safe).clamp_max(1.0), torch.zeros_like(px))
        w = torch.where(batch.depth == d, step, w)
    return w


def chain_plan(batch: RoundBatch, p: torch.Tensor, q: torch.Tensor | None, kind: str) -> ChainPlan:
    """The plan of `chain_batch` (shapes there)."""
    check(kind in KINDS, f"unknown batched chain verifier {kind!r}; valid: {', '.join(KINDS)}")
    check(batch.chains, "chain_batch verifies chains (one draft per level); this batch has a branching tree")
    check(p.dim() == 2 and p.shape[0] == batch.tokens.shape[0],
          f"p must be [N, V] with N = {batch.tokens.shape[0]}, got {tuple(p.shape)}")
    check(kind == "naive" or (q is not None and q.shape == p.shape),
          f"kind {kind!r} needs q [N, V] like p {tuple(p.shape)}")
    par, tok = batch.parent.clamp_min(0), batch.tokens
    px = p[par, tok].double()  # [N]: p at the parent of the draft each node holds
    if kind == "naive":  # q a point mass at each draft: q(x) = 1
        num, den = px, torch.ones_like(px)
        nxt = torch.cat([tok[1:], tok[:1]])  # [N]: the token of each chain node's child (read where it has one)
        return ChainPlan(num, den, "first", lambda node, bonus: torch.where(
            bonus[:, None], p[node], _naive_residual(p[node], nxt[node])))
    assert q is not None
    qx = q[par, tok].double()
    if kind == "sd":
        return ChainPlan(px, qx, "first", lambda node, bonus: torch.where(
            bonus[:, None], p[node], _sd_residual(p[node], q[node])))
    w = _block_weights(batch, px, qx)  # [N]
    # a leaf's coin stops with probability w (num = w, den = 1); an inner draft's is R / S from its own row
    idx = torch.arange(tok.shape[0], device=tok.device)
    is_inner = (batch.depth > 0) & (idx < batch.cu_num_tokens[1:][batch.seq] - 1)  # [N]
    m = sum(max(n - 2, 0) for n in batch.sizes)  # their number, known on the host: no sync to gather them
    inner = torch.argsort((~is_inner).int(), stable=True)[:m]  # [M], in flat order
    diff = w[inner].to(p.dtype)[:, None] * p[inner] - q[inner]  # [M, V]
    num = w.index_copy(0, inner, diff.clamp_min(0).sum(-1).double())  # [N]
    den = torch.ones_like(w).index_copy(0, inner, (-diff).clamp_min(0).sum(-1).double())
    return ChainPlan(num, den, "last", lambda node, bonus: torch.where(
        bonus[:, None], p[node], _block_residual(w[node], p[node], q[node])))


def _uniforms(generators: Generators, counts: list[int], device: torch.device) -> torch.Tensor:
    """float64 [sum(counts)]: counts[b] uniforms for sequence b, from generators[b] (a list, one per sequence: the
    loop over sequences) or from one generator (or the global one) for the whole batch, in sequence order."""
    if not isinstance(generators, Sequence):
        where = generators.device if generators is not None else device
        return torch.rand(sum(counts), generator=generators, dtype=torch.float64, device=where).to(device)
    check(len(generators) == len(counts), f"{len(counts)} sequences need {len(counts)} generators, "
                                          f"got {len(generators)}")
    parts = [torch.rand(k, generator=g, dtype=torch.float64, device=g.device if g is not None else device)
             for g, k in zip(generators, counts)]
    if len({t.device for t in parts}) == 1:  # CPU generators: one copy to the device for the whole batch
        return torch.cat(parts).to(device)
    return torch.cat([t.to(device) for t in parts])


def chain_batch(batch: RoundBatch, p: torch.Tensor, q: torch.Tensor | None, generators: Generators,
                kind: str) -> Verified:
    """Sampled verification of a batch of chains (each sequence's tree a chain, possibly the root alone).

    p: target float [N, V], p[j] = p(.|c, path to j); q: draft float [N, V], q[j] = the law j's child was drawn
    from (unused, may be None, for "naive"); generators: one torch.Generator (or None) per sequence, or one for the
    whole batch. kind: "sd" | "naive" | "block". Returns Verified (one host copy: `outcomes()`).
    """
    plan = chain_plan(batch, p, q, kind)
    g = [n - 1 for n in batch.sizes]
    # uniforms per sequence: sd's node walk draws a coin and a residual token per node, then the bonus (2g + 1);
    # block draws g coins then the token (g + 1); naive takes block's layout
    sd = kind == "sd"
    u = _uniforms(generators, [2 * k + 1 if sd else k + 1 for k in g], p.device)
    cu, seq, depth = batch.cu_num_tokens, batch.seq, batch.depth
    b_idx = torch.arange(len(g), device=p.device)
    base = 2 * cu[:-1] - b_idx if sd else cu[:-1]  # [B]: each sequence's first uniform
    coin_at = base[seq] + (2 if sd else 1) * (depth - 1).clamp_min(0)  # [N]
    hit = (u[coin_at] * plan.den < plan.num) & (depth > 0)  # [N]
    size = batch.size
    if plan.rule == "first":
        miss = ((~hit) & (depth > 0)).long().cumsum(0)  # [N]
        on = miss == miss[cu[:-1]][seq]  # no failed coin from the root to the node
    else:
        tau = torch.zeros(len(g), dtype=torch.long, device=p.device).scatter_reduce(
            0, seq, torch.where(hit, depth, 0), reduce="amax")  # [B]: the last stop, 0 when none
        on = depth <= tau[seq]
    path, path_len, last = _path_of(batch, on)
    bonus = path_len == size  # [B]
    if sd:  # the bonus' uniform, or the residual's of the failed node's step
        final = base + torch.where(bonus, 2 * (size - 1), 2 * (path_len - 1) + 1)
    else:
        final = cu[1:] - 1
    token, bad = _inverse_cdf(plan.law_at(last, bonus), u[final])
    return Verified(path, path_len, token, bad)


def chain_batch_law(batch: RoundBatch, p: torch.Tensor, q: torch.Tensor | None, kind: str) -> list[dict[Outcome,
                                                                                                         float]]:
    """Exact law of `chain_batch` (same arguments, no generators): per sequence {(path, next token): probability},
    from the same plan, each coin replaced by its probability."""
    plan = chain_plan(batch, p, q, kind)
    acc = accept_probability(plan.num, plan.den).tolist()  # [N]
    ends: list[tuple[int, int, float, bool]] = []  # (sequence, path end L, probability, bonus)
    for b, (start, n) in enumerate(zip(batch.cu_num_tokens.tolist(), batch.sizes)):
        g = n - 1
        if plan.rule == "first":
            reach = 1.0
            for length in range(g + 1):
                if length < g:
                    ends.append((b, length, reach * (1 - acc[start + length + 1]), False))
                    reach *= acc[start + length + 1]
                else:
                    ends.append((b, g, reach, True))
        else:
            later_fail = 1.0
            for tau in range(g, -1, -1):
                ends.append((b, tau, later_fail * (acc[start + tau] if tau else 1.0), tau == g))
                if tau:
                    later_fail *= 1 - acc[start + tau]
    starts = batch.cu_num_tokens.tolist()
    nodes = torch.tensor([starts[b] + length for b, length, _, _ in ends], device=p.device)
    rows = plan.law_at(nodes, torch.tensor([e[3] for e in ends], device=p.device)).double()  # [len(ends), V]
    out: list[dict[Outcome, float]] = [{} for _ in batch.sizes]
    for (b, length, mass, _), row in zip(ends, (rows / rows.sum(-1, keepdim=True)).tolist()):
        for y, py in enumerate(row):
            if mass * py > 0:
                key = (tuple(range(length + 1)), y)
                out[b][key] = out[b].get(key, 0.0) + mass * py
    return out


__all__ = ["KINDS", "ChainPlan", "RoundBatch", "Verified", "chain_batch", "chain_batch_law", "chain_plan",
           "greedy_batch"]
