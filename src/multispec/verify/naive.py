"""Naive sampling (SpecInfer, Miao et al., ASPLOS 2024, §4.2): walk the drafted tree from the root; at each node
draw a token from the target's p there; if it is the token of one of the node's children, move to that child (the
first such), else the round ends with it; at a leaf the drawn token is the bonus.

Every committed token is a draw from p given the tokens before it, so this is lossless whatever the drafts and
their law (q is not read). It reaches child x with probability p(x), which for deterministic drafts (point masses:
prompt lookup's chains, suffix trees' distinct siblings) is the most any lossless verifier gives: there it has the
law of block, traversal and rrs-wor (tests/test_verifiers_sequence.py), at the cost of one draw per visited node
(traversal computed a state for every node, leaf to root: ~0.55 ms for an 8-token chain at V = 4,096 on the CPU,
against ~0.05 ms). For drafts sampled from a q it accepts less than sd (p(x) against min(1, p(x) / q(x))).
"""
from __future__ import annotations

from collections import defaultdict

import torch

from multispec.sampling import sample
from multispec.tree import Tree
from multispec.verify.tree_walk import child_with_token


def _law(p: torch.Tensor, q: torch.Tensor, node: int) -> torch.Tensor:
    """The law node's token is drawn from: the target's, p[node] (float [V], any positive scale)."""
    return p[node]


def verify_naive(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                 generator: torch.Generator | None) -> tuple[tuple[int, ...], int]:
    """tokens: long [N] (tokens[0], the root, is ignored); p: float [N, V]; q: unused (any draft law). Returns
    (path from the root 0, next token)."""
    toks, node, path = tokens.tolist(), 0, [0]
    while True:
        y = int(sample(_law(p, q, node), generator))
        child = child_with_token(tree.children[node], toks, y)
        if child is None:
            return tuple(path), y
        path.append(child)
        node = child


def naive_law(tree: Tree, tokens: torch.Tensor, p: torch.Tensor,
              q: torch.Tensor) -> dict[tuple[tuple[int, ...], int], float]:
    """Exact law of `verify_naive` (same arguments, no generator): {(path, next token): probability}."""
    toks = tokens.tolist()
    law: dict[tuple[tuple[int, ...], int], float] = defaultdict(float)

    def visit(node: int, path: tuple[int, ...], reach: float) -> None:
        row = _law(p, q, node).double()
        for y, py in enumerate((row / row.sum()).tolist()):  # (sample draws from any positive scale)
            if reach * py > 0:
                child = child_with_token(tree.children[node], toks, y)
                if child is None:
                    law[(path, y)] += reach * py
                else:
                    visit(child, path + (child,), reach * py)

    visit(0, (0,), 1.0)
    return dict(law)
