"""EAGLE-2's dynamic draft tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
Trees"): the head's own confidence shapes each round's tree.

    expand: depth by depth, the `width` most likely nodes of the newest level (by path probability, the product of
            the head's probabilities along the path) are fed to the head in one forward, and each proposes its
            `width` most likely children
    rerank: of every node proposed, the N most likely by path probability form the tree sent to the target (a
            child is never likelier than its parent, so the chosen nodes are a tree)

N and the depth come from the round's max tree (its node count below the root and its depth, cut to the round's
budget), `width` from the plan (RoundPlan.width). The tokens are chosen deterministically (the top ones), so q is
the point mass on each node's first child and the tree is verified by the rrs-wor walk, exact for any
deterministic tree (proposers.SuffixTreeProposer); greedy runs verify by argmax. Runs whose sampling reads each
node's own history (penalties, a grammar) or that are keyed (reproducible) draw the plan's static tree instead
(proposers.HeadProposer). The head's cache keeps its rows up to the root, as HeadProposer's does. The proposer
that drafts with it is proposers.DynamicHeadProposer ("head-dynamic").
"""
from __future__ import annotations

import math

import torch

from multispec.drafting.grow import _draft_dists, _first_forward
from multispec.tree import Tree


def budget_tree(nodes: int, depth: int) -> Tree:
    """A max tree of `nodes` nodes below the root and depth `depth` (a chain of `depth` and the other nodes as
    children of the root): the budget a dynamic round may fill, whatever shape it takes."""
    extra = nodes - depth  # root children besides the chain's first node
    parents = [-1] + [0] * (extra + 1) + [1] + list(range(extra + 2, extra + depth))
    return Tree(tuple(parents[:nodes + 1]))


def grow_dynamic(draft, pending: list[int], max_tree: Tree, width: int, sampling) -> tuple[Tree, torch.Tensor, int, int]:
    """The round's tree grown by the head's own path probabilities (module docstring): the max tree is the budget
    (node count and depth), `width` the children per expanded node and nodes expanded per level. Returns (tree,
    its tokens, the root's row in the head's cache, head forwards)."""
    nodes, depth = len(max_tree) - 1, max_tree.max_depth
    base = draft.cache_len
    root = base + len(pending) - 1  # the root's row in the head's cache
    out = _first_forward(draft, pending, max_tree, torch.tensor(pending[-1:]), base, root, False).run()
    # candidates: (log path probability, parent candidate index (-1: the root), token, depth)
    cands: list[tuple[float, int, int, int]] = []
    rows = {-1: root}  # candidate index -> its head-cache row, for the expanded ones
    q = _draft_dists(out.logits[-1:], sampling)  # [1, V]
    frontier, calls = [-1], 1
    for d in range(1, depth + 1):
        level = []
        top = torch.topk(q, min(width, q.shape[1]), dim=-1)  # one call for the whole frontier
        for par, probs, toks in zip(frontier, top.values.tolist(), top.indices.tolist()):
            score = 0.0 if par == -1 else cands[par][0]
            for p, tok in zip(probs, toks):
                if p > 0:
                    level.append(len(cands))
                    cands.append((score + math.log(p), par, tok, d))
        if d == depth or not level:
            break
        frontier = sorted(level, key=lambda c: -cands[c][0])[:width]
        q = _draft_dists(_expand(draft, frontier, cands, rows, root, d), sampling)
        calls += 1
    tree, tokens = _rerank(cands, nodes, pending[-1])
    return tree, tokens, root, calls


def _expand(draft, frontier: list[int], cands, rows: dict, root: int, d: int) -> torch.Tensor:
    """Feed the frontier's nodes (all at depth d) to the head in one forward; their logits [n, V]."""
    start, n = draft.cache_len, len(frontier)
    mask = torch.zeros(n, start + n, dtype=torch.bool)
    mask[:, :root + 1] = True  # the committed rows and the root
    for i, c in enumerate(frontier):
        mask[i, start + i] = True
        par = cands[c][1]
        while par != -1:  # its drafted ancestors' rows
            mask[i, rows[par]] = True
            par = cands[par][1]
        rows[c] = start + i
    tokens = torch.tensor([cands[c][2] for c in frontier])
    out = draft.forward(tokens, torch.full((n,), root + d), mask)
    return out.logits


def _rerank(cands, nodes: int, root_token: int) -> tuple[Tree, torch.Tensor]:
    """The `nodes` likeliest candidates (a parent before its children on ties) as a breadth-first Tree and its
    tokens (the root's first)."""
    chosen, kept = sorted(range(len(cands)), key=lambda c: (-cands[c][0], cands[c][3]))[:nodes], {-1}
    for c in sorted(chosen, key=lambda c: cands[c][3]):  # (a no-op: a parent sorts before its children)
        if cands[c][1] in kept:
            kept.add(c)
    chosen = [c for c in chosen if c in kept]
    index = {-1: 0}
    order: list[int] = []
    for d in range(1, max((cands[c][3] for c in chosen), default=0) + 1):
        level = sorted((c for c in chosen if cands[c][3] == d), key=lambda c: (index[cands[c][1]], -cands[c][0]))
        for c in level:
            index[c] = len(order) + 1
            order.append(c)
    parents = (-1,) + tuple(index[cands[c][1]] for c in order)
    tokens = torch.tensor([root_token] + [cands[c][2] for c in order], dtype=torch.long)
    return Tree(parents), tokens
