"""Token-level speculative sampling of a whole chain at once: the `sd` node walk (tree_walk) on a chain, in tensor
operations. Draft i + 1 (drawn from q[i]) is accepted with probability min(1, p[i](x) / q[i](x)) while every
earlier one was; the first rejected draft ends the round with a token from norm((p[i] - q[i])_+), a fully accepted
chain with the bonus from p[leaf]. One gather and one draw of the chain's coins replace a plan per node.

Why: on a point-mass chain (prompt lookup: q[i] is one-hot at the copied token) this is also what every optimal
chain verifier (block, traversal) does: no lossless verifier commits the first k drafts with more than
prod p[i](x), and this one does with exactly that. Traversal there still computes a state for every node, leaf to
root (~0.1 ms each at V = 4k on the CPU); this costs about one node's worth for the whole chain.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from multispec.errors import check
from multispec.sampling import sample
from multispec.tree import Tree
from multispec.verify.base import accept_probability, normalize_or


def _is_chain(tree: Tree) -> bool:
    return tree.max_depth == len(tree) - 1


def _drafts(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor):
    """The chain's drafts and, for each, its target and draft probability at its parent: long [D], float [D] x 2."""
    check(_is_chain(tree), "sd-chain verifies chains only (width 1 at every level)")
    idx = torch.arange(len(tree) - 1, device=p.device)
    x = tokens[1:].to(p.device)
    return x, p[idx, x], q[idx, x]


def _residual(p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """norm((p - q)_+), or p where that has no mass (as verify/sd.py's plan)."""
    return normalize_or((p_row - q_row).clamp_min(0)[None], p_row[None])[0]


def verify_sd_chain(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                    generator: torch.Generator | None) -> tuple[tuple[int, ...], int]:
    """tokens: long [N] (node i at depth i, tokens[0] the root); p, q: float [N, V] (q[i]: the law draft i + 1
    was drawn from). Returns (path, next token)."""
    n = len(tree)
    if n == 1:
        return (0,), int(sample(p[0], generator))
    _, px, qx = _drafts(tree, tokens, p, q)  # [D] each
    coins = torch.rand(n - 1, generator=generator, dtype=torch.float64)  # one per draft, as the walk draws them
    accepted = (coins.to(px.device) * qx.double() < px.double()).tolist()  # u < min(1, p/q); q = 0: p > 0
    k = accepted.index(False) if False in accepted else n - 1  # drafts accepted
    path = tuple(range(k + 1))
    if k == n - 1:
        return path, int(sample(p[k], generator))
    return path, int(sample(_residual(p[k], q[k]), generator))


def sd_chain_law(tree: Tree, tokens: torch.Tensor, p: torch.Tensor,
                 q: torch.Tensor) -> dict[tuple[tuple[int, ...], int], float]:
    """Exact law of `verify_sd_chain` (same arguments, no generator): {(path, next token): probability}."""
    n = len(tree)
    law: dict[tuple[tuple[int, ...], int], float] = defaultdict(float)
    reach = 1.0
    if n > 1:
        _, px, qx = _drafts(tree, tokens, p, q)
        accept = accept_probability(px.double(), qx.double()).tolist()
        for k, a in enumerate(accept):
            for y, r in enumerate(_residual(p[k], q[k]).tolist()):
                if reach * (1 - a) * r > 0:
                    law[(tuple(range(k + 1)), y)] += reach * (1 - a) * r
            reach *= a
    for y, r in enumerate(p[n - 1].tolist()):
        if reach * r > 0:
            law[(tuple(range(n)), y)] += reach * r
    return dict(law)
