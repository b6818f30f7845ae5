"""Tree verification (design §4.7) on a small explicit tree with tabulated p/q per node.

A first-order toy model: p(x_t | x_{t-1}) = P[x_{t-1}], q(x_t | x_{t-1}) = Q[x_{t-1}] over V = 3 tokens. Every
drafted tree of shape (k1, k2) is enumerated with its exact probability (the verifier's own draft law), the walk's
exact law (`walk_tree_law`, the production plans with coins -> probabilities) is pushed through, and the law of
the first two committed tokens must equal P[r0, a] P[a, b]. When a round commits a single token, the second one
comes from the next round, enumerated the same way. `walk_tree` (the sampling path) is chi-squared against
`walk_tree_law` on one fixed drafted tree.
"""
from __future__ import annotations

import dataclasses
import itertools
from functools import lru_cache

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from multispec.tree import Tree
from multispec.verify import REGISTRY
from multispec.verify.base import Plan
from multispec.verify.tree_walk import walk_tree, walk_tree_law

V = 3
ROOT = 0
_RNG = np.random.default_rng(5)
P = torch.tensor(_RNG.dirichlet([0.7] * V, size=V), dtype=torch.float64)  # [V, V]: P[prev] = p(.|prev)
P[1] = torch.tensor([0.0, 0.6, 0.4], dtype=torch.float64)  # a target with a zero
Q = torch.tensor(_RNG.dirichlet([0.7] * V, size=V), dtype=torch.float64)  # [V, V]
Q[2] = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)  # a draft with a zero
P_GREEDY = torch.nn.functional.one_hot(torch.tensor([2, 0, 1]), V).double()  # processed greedy target



def widths(name: str) -> tuple[int, int]:
    return {"sd": (1, 1), "spechub": (2, 2), "greedy": (2, 1)}.get(name, (2, 2))


def drafted_trees(spec, shape: tuple[int, ...], root: int, ptab: torch.Tensor):
    """Yield (probability, tree, tokens [N], p [N, V], q [N, V]) for every drafted tree of `shape` (depth <= 2)."""
    tree = Tree.from_shape(shape)
    level1, w1 = spec.law_fn(Q[root], shape[0])
    for tuple1, weight1 in zip(level1.tolist(), w1.tolist()):
        if weight1 <= 0:
            continue
        if len(shape) == 1:
            below = [((), 1.0)]
        else:
            laws = [spec.law_fn(Q[t], shape[1]) for t in tuple1]
            below = []
            for combo in itertools.product(*[list(zip(d.tolist(), w.tolist())) for d, w in laws]):
                below.append((sum((tuple(d) for d, _ in combo), ()), float(np.prod([w for _, w in combo]))))
        for tuple2, weight2 in below:
            if weight2 <= 0:
                continue
            tokens = torch.tensor([root, *tuple1, *tuple2], dtype=torch.long)
            yield weight1 * weight2, tree, tokens, ptab[tokens], Q[tokens]


def first_two_law(spec, ptab: torch.Tensor) -> np.ndarray:
    """float [V, V]: exact law of the first two committed tokens from context ROOT."""
    k1, k2 = widths(spec.name)

    @lru_cache(maxsize=None)
    def next_round_first(context: int) -> tuple[float, ...]:
        law = np.zeros(V)
        for prob, tree, tokens, p, q in drafted_trees(spec, (k1,), context, ptab):
            for (path, nxt), mass in walk_tree_law(tree, tokens, p, q, spec).items():
                law[int(tokens[path[1]]) if len(path) > 1 else nxt] += prob * mass
        return tuple(law)

    out = np.zeros((V, V))
    for prob, tree, tokens, p, q in drafted_trees(spec, (k1, k2), ROOT, ptab):
        for (path, nxt), mass in walk_tree_law(tree, tokens, p, q, spec).items():
            committed = [int(tokens[u]) for u in path[1:]] + [nxt]
            if len(committed) >= 2:
                out[committed[0], committed[1]] += prob * mass
            else:
                out[committed[0]] += prob * mass * np.array(next_round_first(committed[0]))
    return out


@pytest.mark.parametrize("name", [n for n, s in REGISTRY.items() if s.lossless])
def test_walk_preserves_the_target_law(name):
    spec = REGISTRY[name]
    ptab = P_GREEDY if name == "greedy" else P
    law = first_two_law(spec, ptab)
    want = (ptab[ROOT][:, None] * ptab).numpy()  # [V, V]: p(a | root) p(b | a)
    assert np.abs(law - want).max() < 1e-9, f"{name}:\n{law}\n!=\n{want}"


def test_walk_of_mcns_is_lossy():
    law = first_two_law(REGISTRY["mcns"], P)
    assert np.abs(law - (P[ROOT][:, None] * P).numpy()).max() > 1e-3


def _fixed_tree(spec):
    """One drafted tree of shape widths(spec) (the most probable one), as (tree, tokens, p, q)."""
    best = max(drafted_trees(spec, widths(spec.name), ROOT, P), key=lambda item: item[0])
    return best[1:]


@pytest.mark.parametrize("name", ["rrs-wor", "kseq", "spechub", "greedy-md", "ot"])
def test_walk_sampling_matches_its_exact_law(name):
    spec = REGISTRY[name]
    tree, tokens, p, q = _fixed_tree(spec)
    law = walk_tree_law(tree, tokens, p, q, spec)
    assert abs(sum(law.values()) - 1) < 1e-12
    gen = torch.Generator().manual_seed(1)
    trials = 800
    counts = dict.fromkeys(law, 0)
    for _ in range(trials):
        outcome = walk_tree(tree, tokens, p, q, spec, gen)
        assert outcome in law, f"{outcome} has probability 0"
        counts[outcome] += 1
    keys = sorted(law, key=law.get)
    exp = np.array([trials * law[k] for k in keys])
    obs = np.array([counts[k] for k in keys], dtype=float)
    small = np.cumsum(exp) < 5  # pool the rarest outcomes
    exp = np.append(exp[~small], exp[small].sum())
    obs = np.append(obs[~small], obs[small].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    assert chi2.sf(stat, keep.sum() - 1) >= 1e-3


def test_new_token_equal_to_a_child_is_routed_into_the_first_such_child():
    def plan_always_token_2(p, q, drafts):  # no accept step; the residual is one-hot on token 2
        residual = torch.nn.functional.one_hot(torch.full((p.shape[0],), 2), p.shape[1]).to(p.dtype)
        return Plan((), p[:, :0], p[:, :0], residual)

    spec = dataclasses.replace(REGISTRY["rrs"], plan_fn=plan_always_token_2)
    tree = Tree.from_shape((3, 1))  # children of the root: nodes 1, 2, 3; node 3's child: node 6
    tokens = torch.tensor([0, 1, 2, 2, 0, 0, 0])
    p = torch.full((7, V), 1 / V, dtype=torch.float64)
    law = walk_tree_law(tree, tokens, p, p, spec)
    assert set(path for path, _ in law) == {(0, 2)}  # node 2 has token 2: routed there, then its child (token 0)
    assert law == {((0, 2), 2): 1.0}
    assert walk_tree(tree, tokens, p, p, spec, torch.Generator().manual_seed(0)) == ((0, 2), 2)


def test_leaf_root_draws_the_bonus_from_p():
    tree = Tree.chain(0)
    p = torch.tensor([[0.0, 0.0, 1.0]])
    assert walk_tree(tree, torch.tensor([1]), p, p, REGISTRY["sd"], torch.Generator()) == ((0,), 2)
    assert walk_tree_law(tree, torch.tensor([1]), p, p, REGISTRY["sd"]) == {((0,), 2): 1.0}
