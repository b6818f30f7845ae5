"""UniVer-style tree verification (Weng, Hu, Yairi, "UniVer: A Unified Perspective for Multi-step and Multi-draft
Speculative Decoding", arXiv 2605.04543): local optimal-transport plans composed under prefix acceptance.

The paper's full text was not reachable here; this is the construction its abstract and summaries describe
("prefix acceptance probabilities as dynamic scaling factors", "top-down mass allocation", "post-order
decision"), built on traversal verification (its authors' NeurIPS 2025 paper, verify/traversal.py) and on this
project's exact multi-draft optimal transport (`ot`, verify/ot.py). docs/verifiers.md states what is ours.

A node u is visited with a scaling a(u) in [0, 1], the probability that its subtree must succeed (a(root) = 1).
Its local problem is single-position multi-draft OT towards the *conditional* target pi_u = (a p[u], 1 - a) on
V + {bottom}, where bottom ("u is rejected") is never drafted. A local plan gives, for the realised children S,
the probability acc_j that child j is matched, and the residual on V (the rest is bottom). Two plans, one per
draft law:

- `univer` (`greedy_plan`): siblings drafted as `greedy-md` drafts them (the top k - 1 tokens of q, then one
  draw from q off them; the scheme the paper analyses): the sampled x matched first with min(1, a p(x) / q'(x)),
  the tuple's leftover shared between T (a p(t) each, over the draws of x) and the residual (a p - q')_+ off T
  (bottom 1 - a). At a = 1 it has the `greedy-md` node verifier's law, optimal for that draft law (P3).
- `univer-ot` (`ot_plan`): siblings drafted i.i.d.; `ot`'s exact optimal plan (verify/ot.py) towards pi_u.

Then, in post-order (children in drafting order, the first success ends the round):

- child j is visited with scaling a_j = acc_j / (1 - acc_1 - ... - acc_{j-1})  (so P(child j wins | S) = acc_j);
- once every child failed (probability 1 - sum acc), u's path is accepted with probability
  residual(V) / (1 - sum acc) and the next token drawn from the residual on V; otherwise u fails (its parent
  goes on).

By induction on the subtree (each child's draws are independent of its siblings'), subtree(u) succeeds with
probability a(u) and, when it does, the committed stream after u follows p: at the root (a = 1) the output law is
the target's. With a = 1 at every node (no bottom) it is the token-level walk of the node verifier; the prefix
scaling is what lets a rejected leaf hand its mass back to its parent, as in traversal. A leaf (no children) is
accepted with probability a and draws the next token from p. On a chain both plans are block verification.

`verify_univer` samples (production); `univer_law` enumerates the same plans with coins replaced by their
probabilities. Cost per internal node the walk visits: O(V) (greedy plan) or one `ot` selection over V + 1.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np
import torch

from multispec.sampling import sample
from multispec.tree import Tree
from multispec.verify.base import EPS
from multispec.verify.ot import ot_selection

LocalPlan = Callable[[np.ndarray, np.ndarray, float, list[int]], tuple[np.ndarray, np.ndarray]]


def ot_plan(p: np.ndarray, q: np.ndarray, a: float, drafts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Local plan for drafts i.i.d. from q: `ot`'s optimal plan towards (a p, 1 - a) on V + {bottom}.
    Returns (acc float64 [k]: P(child j is matched), residual float64 [V]: P(the node's path is accepted with next
    token y)); 1 - sum acc - sum residual is the probability that the node fails. p, q: float64 [V]."""
    if not drafts:  # a leaf: accepted with probability a, the next token from p
        return np.zeros(0), a * p
    target = np.append(a * p, 1.0 - a)
    acc, residual = ot_selection(target, np.append(q, 0.0), len(drafts)).node_law(np.asarray(drafts))
    return acc, residual[:-1]


def greedy_plan(p: np.ndarray, q: np.ndarray, a: float, drafts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Local plan for `greedy-md` drafts (T = the top k - 1 of q, then x ~ q' = norm(q off T)), as ot_plan, and
    optimal for that draft law: x is matched first, with min(1, a p(x) / q'(x)); what the tuple has left goes to T
    and to the residual R = (a p - q')_+ off T (bottom: 1 - a) in proportion, so that each t in T is matched
    with a p(t) over the draws of x. At a = 1 this is the `greedy-md` node verifier's law. When q has no mass off
    T, x is `greedy-md`'s padding token, fixed like T, and matched likewise with a p(x)."""
    if not drafts:
        return np.zeros(0), a * p
    top, x = drafts[:-1], drafts[-1]
    q_off = q.copy()
    q_off[top] = 0.0
    rest = float(q_off.sum())
    if rest <= 0:  # x is the padding token: every draft is fixed, each matched with a p(token)
        return a * p[drafts], _zero(a * p, drafts)
    q_off = q_off / rest
    matched_x = min(1.0, a * p[x] / q_off[x]) if q_off[x] > 0 else 0.0
    excess = _zero(np.maximum(a * p - q_off, 0.0), top)
    leftover = float(excess.sum()) + (1.0 - a) + a * float(p[top].sum())  # = 1 - sum min(q', a p) off T
    share = (1.0 - matched_x) / leftover if leftover > EPS else 0.0
    return np.append(a * p[top] * share, matched_x), excess * share


def _zero(x: np.ndarray, ids: list[int]) -> np.ndarray:
    x[ids] = 0.0
    return x


def child_scalings(acc: np.ndarray) -> list[float]:
    """a_j = acc_j / (1 - acc_1 - ... - acc_{j-1}): the scaling child j is visited with (0 where nothing is left)."""
    out, left = [], 1.0
    for x in acc.tolist():
        out.append(min(1.0, x / left) if left > EPS else 0.0)
        left -= x
    return out


def _terminal(acc: np.ndarray, residual: np.ndarray) -> float:
    """P(a node's path is accepted | every child failed) = residual(V) / (1 - sum acc)."""
    left = 1.0 - float(acc.sum())
    return min(1.0, float(residual.sum()) / left) if left > EPS else 0.0


def _next_law(residual: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The law of the token after an accepted node: its residual normalised (p itself when it has no mass)."""
    mass = float(residual.sum())
    return residual / mass if mass > EPS else p


class _Rows:
    """float64 numpy rows of a [N, V] tensor, converted when first read (a walk reads few of them)."""

    def __init__(self, t: torch.Tensor):
        self.t = t.detach()
        self.rows: dict[int, np.ndarray] = {}

    def __getitem__(self, u: int) -> np.ndarray:
        if u not in self.rows:
            self.rows[u] = self.t[u].cpu().double().numpy()
        return self.rows[u]


def verify_univer(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None,
                  local_plan: LocalPlan = greedy_plan) -> tuple[tuple[int, ...], int]:
    """(accepted path of node indices from the root, next token) for a drafted tree: tokens long [N], p and q
    float [N, V] (q[u] = the law u's children were drawn from, by local_plan's draft law)."""
    P, Q = _Rows(p), _Rows(q)
    toks = tokens.tolist()

    def coin() -> float:
        return float(torch.rand((), generator=generator, dtype=torch.float64))

    def visit(u: int, a: float) -> tuple[tuple[int, ...], int] | None:
        if a <= 0.0:
            return None
        kids = tree.children[u]
        acc, residual = local_plan(P[u], Q[u], a, [toks[c] for c in kids])
        for c, a_c in zip(kids, child_scalings(acc)):
            found = visit(c, a_c)
            if found is not None:
                return found
        if u != 0 and coin() >= _terminal(acc, residual):  # the root (a = 1) has no bottom: it always ends here
            return None
        return tuple(tree.path_to(u)), int(sample(torch.from_numpy(_next_law(residual, P[u])), generator))

    found = visit(0, 1.0)
    assert found is not None  # the root always ends the walk
    return found


def univer_law(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
               local_plan: LocalPlan = greedy_plan) -> dict:
    """Exact law of `verify_univer` for this drafted tree: {(path, next_token): probability} (the same plans and
    coins; a child's failure has its realised probability here, which is 1 - a_j only on average over its
    subtree's draws)."""
    P, Q = _Rows(p), _Rows(q)
    toks = tokens.tolist()
    law: dict = defaultdict(float)

    def visit(u: int, a: float, weight: float) -> float:
        """Add weight x (the outcomes of subtree u visited with scaling a) to law; returns P(subtree u ends the
        round)."""
        if a <= 0.0:
            return 0.0
        kids = tree.children[u]
        acc, residual = local_plan(P[u], Q[u], a, [toks[c] for c in kids])
        reach = 1.0  # P(every child visited so far failed)
        for c, a_c in zip(kids, child_scalings(acc)):
            reach *= 1.0 - visit(c, a_c, weight * reach)
        h, out = 1.0 if u == 0 else _terminal(acc, residual), _next_law(residual, P[u])
        path = tuple(tree.path_to(u))
        for y in np.flatnonzero(out > 0).tolist():
            law[(path, y)] += weight * reach * h * float(out[y])
        return 1.0 - reach + reach * h

    visit(0, 1.0, 1.0)
    return dict(law)
