"""Verification of a target-initialized tree (P1, design §6.1 and §6.6). LOSSY when the tree has W >= 2 first-level
tokens: choosing the chain with the longest accepted continuation biases the first token towards tokens the
draft continues well. With W = 1 it is single-draft speculative sampling with the bonus/residual draw moved to
the start of the next round, and is lossless.

Level-1 tokens come from the target and are not verified. Each root-to-leaf path is then tested on its own,
token by token (fresh uniform per token and path; greedy: equality with the target argmax); the path with the
longest accepted run wins (ties: lowest path index; all zero: path 0).

W = 1 at temperature > 0: P1's independent chain tests are lossy as soon as the level-1 node has two or more
children (taking whichever sibling passes its own single-draft test over-weights the siblings, e.g. q = (.5, .5, 0),
p = (.5, 0, .5) with 2 siblings always commits token 0). So with one level-1 token the subtree below it is verified
by the lossless tree walk with recursive rejection sampling without replacement (design §4.3, the law the engine
drafts siblings with), i.e. exactly MCSD below a target-drawn root; the walk's new token is returned as a one-hot
`residual`, which makes it the next round's single level-1 token. For a chain below level 1 this is the same
single-draft rule as before. `below` may replace that walk by another sequence verifier of the same draft law
(`traversal`, issue 13): it then verifies the subtree under the target-drawn level-1 node.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from multispec.tree import Tree
from multispec.verify.rrs_wor import SPEC as RRS_WOR
from multispec.verify.tree_walk import walk_tree


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
                  generator: torch.Generator, below: Callable | None = None) -> ChainVerdict:
    """tokens: long [N]; p: float [N, V] target distribution at each node (processed; one-hot when greedy);
    q: float [N, V] draft law of each node's children. below(tree, tokens, p, q, generator) -> (path, next_token):
    the W = 1 verifier of the subtree under level 1 (default: the rrs-wor walk). Returns the kept chain."""
    if not greedy and len(tree.children[0]) == 1:
        return _verify_single_root(tree, tokens, p, q, generator, below)
    best: tuple[int, tuple[int, ...], int, torch.Tensor | None] | None = None
    for path in tree.paths:
        length, reject_at, residual = 0, None, None
        for parent, child in zip(path[1:-1], path[2:]):
            x = int(tokens[child])
            if greedy:
                ok = int(p[parent].argmax()) == x
            else:
                u = float(torch.rand((), generator=generator, dtype=torch.float64))
                qx = float(q[parent, x])
                ok = qx > 0 and u * qx < float(p[parent, x])  # q = 0: a padding sibling, never accepted
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
    if best is None:
        raise RuntimeError("verify_chains: the tree has no root-to-leaf path")
    length, kept, next_node, residual = best
    return ChainVerdict(path=kept, accepted=length, next_node=next_node, residual=residual)



def _verify_single_root(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                        generator: torch.Generator, below: Callable | None = None) -> ChainVerdict:
    """W = 1, T > 0: the lossless RRS-without-replacement walk below node 1. Node 0 gets a one-hot p and q on
    node 1's token, so the walk accepts node 1 with probability 1 and continues as MCSD from there."""
    v = p.shape[-1]
    first = torch.nn.functional.one_hot(tokens[1], v).to(p.dtype)  # [V]
    p0, q0 = p.clone(), q.clone()  # [N, V]
    p0[0], q0[0] = first, first
    if below is None:
        path, nxt = walk_tree(tree, tokens, p0, q0, RRS_WOR, generator)
    else:
        path, nxt = below(tree, tokens, p0, q0, generator)
    residual = torch.nn.functional.one_hot(torch.tensor(nxt), v).to(p.dtype)  # the next (single) level-1 token
    return ChainVerdict(path=path, accepted=len(path) - 2, next_node=path[-1], residual=residual)
