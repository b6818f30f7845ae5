"""Tree verification (design §4.7): apply a node verifier from the root down.

At node u with children, the verifier sees p[u] (target) and q[u] (the draft law of u's children) and the
children's tokens in drafting order. An accepted child is descended into. A new token equal to a child's token
(greedy-md's residual on T, a K-SEQ residual on a drafted token) is routed into the first child with that
token: lossless, because the subtree was drafted independently of the verifier's coins. Otherwise the new
token ends the round. At a leaf the bonus token is drawn from p[leaf].

`walk_tree` samples one outcome (production, B = 1); `walk_tree_law` enumerates every outcome with its exact
probability, using the same plans (coins -> probabilities) and the same routing rule.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from multispec.sampling import sample
from multispec.tree import Tree
from multispec.verify.base import VerifierSpec


def _child_for(kids: tuple[int, ...], tokens: torch.Tensor, accepted: int, token: int) -> int | None:
    """The child to descend into: the accepted one, else the first child whose token is `token`, else None."""
    return kids[accepted] if accepted >= 0 else child_with_token(kids, tokens, token)


def walk_tree(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, spec: VerifierSpec,
              generator: torch.Generator | None) -> tuple[tuple[int, ...], int]:
    """Verify a drafted tree.

    tokens: long [N] (tokens[0], the root, is ignored); p: float [N, V], p[u] = target p(.|c, path(u));
    q: float [N, V], q[u] = the draft law u's children were drawn from (with spec.draw).
    Returns (path, next_token): accepted node indices starting with the root 0, and the token that ends the
    round (the bonus from p[leaf] at a leaf, else the verifier's new token).
    """
    node, path = 0, [0]
    while True:
        kids = tree.children[node]
        if not kids:
            return tuple(path), int(sample(p[node], generator))
        drafts = tokens[list(kids)][None]  # [1, n]
        result = spec.verify(p[node : node + 1], q[node : node + 1], drafts, generator)
        token = int(result.token[0])
        child = _child_for(kids, tokens, int(result.accepted[0]), token)
        if child is None:
            return tuple(path), token
        path.append(child)
        node = child


def child_with_token(kids: tuple[int, ...], tokens, token: int) -> int | None:
    """The first of kids (a node's children, in drafting order) whose token is `token`, else None. tokens: the
    tree's node tokens, plain ints or a long tensor."""
    return next((kid for kid in kids if int(tokens[kid]) == token), None)


def walk_tree_greedy(tree: Tree, tokens: list[int], best: list[int]) -> tuple[tuple[int, ...], int]:
    """`walk_tree` with the greedy verifier, on plain ints (the per-round hot path at temperature 0).

    tokens: node tokens (tokens[0], the root, is ignored); best[u]: argmax of the target's logits at node u (lowest
    index on ties: the argmax of the one-hot processed p). A child whose token is best[u] is accepted (the first
    such, in drafting order); else best[u] ends the round, as does the bonus best[leaf] at a leaf. Same outcome as
    `walk_tree(tree, tokens, p, q, greedy, generator)` without building p, q, plans or one-hots."""
    node, path = 0, [0]
    while True:
        want = best[node]
        child = child_with_token(tree.children[node], tokens, want)
        if child is None:
            return tuple(path), want
        path.append(child)
        node = child


def walk_tree_law(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                  spec: VerifierSpec) -> dict[tuple[tuple[int, ...], int], float]:
    """Exact law of `walk_tree` (same arguments, no generator): {(path, next_token): probability}."""
    law: dict[tuple[tuple[int, ...], int], float] = defaultdict(float)

    def visit(node: int, path: tuple[int, ...], prob: float) -> None:
        kids = tree.children[node]
        if not kids:
            for y, py in enumerate(p[node].tolist()):
                if py > 0:
                    law[(path, y)] += prob * py
            return
        drafts = tokens[list(kids)][None]  # [1, n]
        node_law = spec.law(p[node : node + 1], q[node : node + 1], drafts)
        for j, mass in enumerate(node_law.accept[0].tolist()):
            if mass > 0:
                visit(kids[j], path + (kids[j],), prob * mass)
        for y, mass in enumerate(node_law.residual[0].tolist()):
            if mass > 0:
                child = _child_for(kids, tokens, -1, y)
                if child is None:
                    law[(path, y)] += prob * mass
                else:
                    visit(child, path + (child,), prob * mass)

    visit(0, (0,), 1.0)
    return dict(law)
