"""Traversal verification of a drafted token tree (Weng et al., "Traversal Verification for Speculative Tree
Decoding", NeurIPS 2025, arXiv 2505.12398): leaf to root, with sequence-level acceptance.

Siblings are drafted without replacement from their parent's q, in drafting order (`rrs-wor`'s law). Every node
u carries a state: a weight w_u, a target law P_u (initially p[u]) and a draft law Q_u (initially q[u]) over the
drafts still pending below u. The tree is traversed in post-order, children in drafting order:

- entering child c of u (token x):  w_c = min(1, w_u P_u(x) / Q_u(x))          (w_root = 1)
- once every child of u is deleted, u is a leaf: accept the path root..u iff a fresh coin u' < w_u; the next
  token is drawn from P_u (the target p[u] when u had no children). The root is always accepted.
- when child c (token x) of u is deleted (rejected with its whole subtree), u's state becomes
      R = sum (w_u P_u - Q_u)_+,  S = sum (Q_u - w_u P_u)_+,
      P_u <- norm((w_u P_u - Q_u)_+),  w_u <- R / S,  Q_u <- norm(Q_u with x removed)
  (Q_u is renormalised because the next sibling was drawn without replacement).
Induction on the subtree gives P(accepted node in subtree(u), stream after u starts with s | state of u)
= w_u * P_u(s_1) p(s_2.. | ..), which at the root (w = 1) is losslessness. On a chain this is exactly block
verification (`block`): h_i = R_i / S_i. A child whose draft has no mass under Q_u (a padding draft, drawn
after the support of q ran out) is never accepted and leaves u's state unchanged.

`verify_traversal` samples (production); `traversal_law` enumerates every outcome with its exact probability,
visiting the same states with coins replaced by their probabilities.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from multispec.sampling import sample
from multispec.tree import Tree
from multispec.verify.base import normalize_or


@dataclass(frozen=True)
class _State:
    """A node's verification state: weight w, target law P [V], draft law Q [V] of its pending children."""

    w: float
    P: torch.Tensor
    Q: torch.Tensor


def _initial(node: int, w: float, p: torch.Tensor, q: torch.Tensor) -> _State:
    mass = float(q[node].sum())
    return _State(w, p[node], q[node] / mass if mass > 0 else q[node])


def _child_weight(state: _State, x: int) -> float:
    """w_c of a child with token x: min(1, w P(x) / Q(x)); 0 for a padding draft (Q(x) = 0)."""
    qx = float(state.Q[x])
    return min(1.0, state.w * float(state.P[x]) / qx) if qx > 0 else 0.0


def _drop_draft(Q: torch.Tensor, x: int) -> torch.Tensor:
    """Q with token x removed and renormalised (the law of the next sibling, drafted without replacement)."""
    Q = Q.clone()
    Q[x] = 0.0
    mass = float(Q.sum())
    return Q / mass if mass > 0 else Q


def _after_delete(state: _State, x: int) -> _State:
    """The parent's state once its child with token x has been deleted (see the module docstring)."""
    if float(state.Q[x]) <= 0:  # a padding draft carries no information
        return state
    diff = state.w * state.P - state.Q  # [V]
    r = float(diff.clamp_min(0).sum())
    s = float((-diff).clamp_min(0).sum())
    w = min(1.0, r / s) if s > 0 else state.w  # s = 0: the deletion had probability 0
    P = normalize_or(diff.clamp_min(0)[None], state.P[None])[0]
    return _State(w, P, _drop_draft(state.Q, x))


def verify_traversal(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                     generator: torch.Generator | None) -> tuple[tuple[int, ...], int]:
    """Verify a drafted tree. tokens: long [N]; p: float [N, V] target at each node; q: float [N, V], q[u] = the
    law u's children were drawn from without replacement. Returns (path from the root 0, next token)."""

    def visit(node: int, state: _State, path: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
        for child in tree.children[node]:
            x = int(tokens[child])
            found = visit(child, _initial(child, _child_weight(state, x), p, q), path + (child,))
            if found is not None:
                return found
            state = _after_delete(state, x)
        if node == 0 or float(torch.rand(1, generator=generator, dtype=torch.float64)) < state.w:
            return path, int(sample(state.P, generator))
        return None

    found = visit(0, _initial(0, 1.0, p, q), (0,))
    if found is None:  # unreachable: the walk always ends at the root at the latest
        raise RuntimeError("verify_traversal: the walk ended nowhere")
    return found


def traversal_law(tree: Tree, tokens: torch.Tensor, p: torch.Tensor,
                  q: torch.Tensor) -> dict[tuple[tuple[int, ...], int], float]:
    """Exact law of `verify_traversal` (same arguments, no generator): {(path, next_token): probability}."""
    law: dict[tuple[tuple[int, ...], int], float] = defaultdict(float)

    def visit(node: int, state: _State, path: tuple[int, ...], reach: float) -> float:
        """Add the outcomes accepted in subtree(node) to `law`; return P(reach and the subtree is deleted)."""
        for child in tree.children[node]:
            x = int(tokens[child])
            reach = visit(child, _initial(child, _child_weight(state, x), p, q), path + (child,), reach)
            state = _after_delete(state, x)
        accept = 1.0 if node == 0 else state.w
        if reach * accept > 0:
            for y, py in enumerate(state.P.tolist()):
                if py > 0:
                    law[(path, y)] += reach * accept * py
        return reach * (1 - accept)

    visit(0, _initial(0, 1.0, p, q), (0,), 1.0)
    return dict(law)
