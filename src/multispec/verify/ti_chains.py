"""Verification of a target-initialized tree (P1, SPEC §6.1 and §6.6). LOSSY when the tree has W >= 2 first-level
tokens: choosing the chain with the longest accepted continuation biases the first token towards tokens the
draft continues well. With W = 1 it is single-draft speculative sampling with the bonus/residual draw moved to
the start of the next round, and is lossless.

Level-1 tokens come from the target and are not verified. Each root-to-leaf path is then tested on its own,
token by token (fresh uniform per token and path; greedy: equality with the target argmax); the path with the
longest accepted run wins (ties: lowest path index; all zero: path 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multispec.tree import Tree


@dataclass
class ChainVerdict:
    """path: accepted node indices, root (0) first, level-1 node second. accepted: draft tokens accepted after the
    level-1 token. next_node: node whose target distribution gives the next level 1. residual: float [V] to draw
    the next level 1 from instead (rejection at T > 0), or None."""

    path: tuple[int, ...]
    accepted: int
    next_node: int
    residual: torch.Tensor | None


def verify_chains(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, greedy: bool,
                  generator: torch.Generator) -> ChainVerdict:
    """tokens: long [N]; p: float [N, V] target distribution at each node (processed; one-hot when greedy);
    q: float [N, V] draft law of each node's children. Returns the kept chain."""
    best: tuple[int, tuple[int, ...], int, torch.Tensor | None] | None = None
    for path in tree.paths:
        length, reject_at, residual = 0, None, None
        for parent, child in zip(path[1:-1], path[2:]):
            x = int(tokens[child])
            if greedy:
                ok = int(p[parent].argmax()) == x
            else:
                u = float(torch.rand((), generator=generator, dtype=torch.float64))
                ok = u * float(q[parent, x]) < float(p[parent, x])
            if not ok:
                reject_at = parent
                break
            length += 1
        if best is None or length > best[0]:
            if reject_at is not None and not greedy:
                r = (p[reject_at] - q[reject_at]).clamp_min(0)
                residual = r / r.sum() if float(r.sum()) > 1e-12 else p[reject_at]
            kept = path[: 2 + length]
            best = (length, kept, kept[-1] if reject_at is None else reject_at, residual)
    length, kept, next_node, residual = best
    return ChainVerdict(path=kept, accepted=length, next_node=next_node, residual=residual)
