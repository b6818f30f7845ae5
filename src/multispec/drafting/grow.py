"""Grow a token tree with the draft model, level by level (design §3.3), one draft forward per level.

The draft cache holds every committed token except `pending` (tokens committed but not yet consumed by the
draft: the root, and the last accepted node when it sat on the deepest drafted level). The first forward feeds
`pending` as a chain together with any tree levels whose tokens are already known (level 1 of a
target-initialized tree); each further forward feeds the newest level. The deepest level is sampled but never
fed, so the draft cache covers depths 0..d-1 of a tree drafted to depth d.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from multispec.drafting.coupled import coupled_draw
from multispec.models.base import Backend, Forward, Steps, chain, drive, takes_last_only
from multispec.sampling import SamplingConfig, adjust_logits, process_logits
from multispec.tree import Tree
from multispec.verify.keyed import PositionKeys

# draw(q [B, V], n, generator) -> long [B, n]: the draft law of the verifier in use
DrawFn = Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]


class StopPolicy(Protocol):
    """Decides, after each drafted level, whether to draft another one. Reads draft-side state only."""

    needs_hidden: bool  # keep_drafting reads the draft's hidden states (the draft forwards then return them)

    def start_round(self) -> None: ...

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        """depth: levels drafted so far (>= 1). parent_hidden: float [n, H] draft hidden states at the nodes that
        produced the newest level (hidden of the consumed token; None unless hidden states were asked for:
        needs_hidden or want_hidden); parent_q: float [n, V] their distributions;
        new_tokens: long [m] the newest level's tokens."""
        ...


CATCH_UP_ALONE = 16  # more pending tokens than this are fed as a chain of their own first (last_only), so that the
# draft's output layer runs on the round's rows, not on every caught-up one (a deferred prefill of a 400-token chat
# prompt through the SmolLM2 head's output layer and widening: ~130 ms)


@dataclass
class Draft:
    """One round's drafted tree. tree: the topology actually drafted (a truncation of the max tree).
    tokens: long [N] (tokens[0] = root). q: float32 [N, V]: the draft law each node's children were drawn
    from (zeros at nodes that have no children). fed: number of nodes whose tokens the draft consumed, counted
    from node 0 (a prefix of the BFS order). root_index: draft-cache row of node 0."""

    tree: Tree
    tokens: torch.Tensor
    q: torch.Tensor
    fed: int
    root_index: int
    draft_calls: int


def grow_tree(draft: Backend, pending: list[int], max_tree: Tree, known_tokens: list[int], known_depth: int,
              sampling: SamplingConfig, draw: DrawFn, generator: torch.Generator, policy: StopPolicy | None = None,
              want_hidden: bool = False, keys: PositionKeys | None = None, history: Callable | None = None) -> Draft:
    """`grow_steps` run alone (same arguments): each draft forward as it comes."""
    return drive(grow_steps(draft, pending, max_tree, known_tokens, known_depth, sampling, draw, generator, policy,
                            want_hidden, keys, history))


def grow_steps(draft: Backend, pending: list[int], max_tree: Tree, known_tokens: list[int], known_depth: int,
               sampling: SamplingConfig, draw: DrawFn, generator: torch.Generator, policy: StopPolicy | None = None,
               want_hidden: bool = False, keys: PositionKeys | None = None, history: Callable | None = None) -> Steps[Draft]:
    """Draft `max_tree` (or a depth-truncation of it chosen by `policy`), as a generator of its draft forwards
    (models/base.Steps: the engine runs them with other sequences' forwards of the same depth).
    pending: committed tokens the draft has not consumed; pending[-1] is the root (node 0).
    known_tokens: tokens of nodes 1..level_end(known_depth)-1, already chosen (e.g. by the target); [] if none.
    draw: the verifier's draft law. The drafted depth is at least known_depth + 1 when the max tree is deeper.
    keys: position keys of max_tree's nodes (keyed.node_keys) for a keyed verifier (gumbel, gls): the children of
    node u are then the top-n of log q + the noise of their position (coupled_draw), and `draw` is not used.
    history(rows, tokens, logits) -> sampling.History: the processors' history of those max_tree nodes (penalties,
    min_tokens: each node's own path; engine._draft_history), or None when the sampling reads none."""
    n_nodes, alone = len(max_tree), len(pending) > CATCH_UP_ALONE and takes_last_only(draft)
    if alone:  # a long catch-up (a deferred prefill) as a chain of its own, whose rows' laws are not needed
        yield _catch_up(draft, pending)
        pending = pending[-1:]
    tokens = torch.zeros(n_nodes, dtype=torch.long)
    tokens[0] = pending[-1]
    n_known = max_tree.level_end(known_depth)
    if n_known > 1:
        tokens[1:n_known] = torch.tensor(known_tokens, dtype=torch.long)
    q = torch.zeros(n_nodes, draft.vocab_size)
    base = draft.cache_len
    root_index = base + len(pending) - 1
    if policy is not None:
        policy.start_round()
    want = want_hidden or (policy is not None and policy.needs_hidden)
    out = yield _first_forward(draft, pending, max_tree, tokens[:n_known], base, root_index, want)
    m, calls = len(pending) - 1, 1 + int(alone)  # m: pending tokens before the root
    rows = range(known_depth and max_tree.level(known_depth).start, n_known)  # nodes whose children come next
    logits, hidden = out.logits[m:][rows.start:], out.hidden[m:][rows.start:] if want and out.hidden is not None else None
    depth, fed = known_depth, n_known
    while True:
        parent_q = _draft_dists(logits, sampling, None if history is None else history(rows, tokens, logits))
        q[rows.start:rows.stop] = parent_q
        child_level = max_tree.level(depth + 1)
        _draw_children(max_tree, rows, q, tokens, draw, generator, keys)
        depth += 1
        if depth >= max_tree.max_depth or (policy is not None and not policy.keep_drafting(
                depth, hidden, parent_q, tokens[child_level.start:child_level.stop])):
            break
        rows = child_level
        mask = max_tree.attention_mask(root_index, rows=rows, cols=rows.stop)
        out = yield Forward(draft, tokens[rows.start:rows.stop],
                            root_index + max_tree.depth_tensor[rows.start:rows.stop], mask, want_hidden=want)
        calls += 1
        logits, hidden = out.logits, out.hidden
        fed = rows.stop
    tree = max_tree.truncate(depth) if depth < max_tree.max_depth else max_tree
    return Draft(tree=tree, tokens=tokens[:len(tree)], q=q[:len(tree)], fed=fed, root_index=root_index,
                 draft_calls=calls)


def _catch_up(draft: Backend, pending: list[int]) -> Forward:
    """The pending tokens before the root as a chain of their own (last_only: their rows' laws are not needed)."""
    return chain(draft, torch.tensor(pending[:-1], dtype=torch.long), last_only=True)


def _draw_children(max_tree: Tree, rows: range, q: torch.Tensor, tokens: torch.Tensor, draw: DrawFn,
                   generator: torch.Generator, keys: PositionKeys | None) -> None:
    """Draw the children of the nodes in `rows` from their laws q [N, V] into tokens [N] (coupled to the position
    noise in a keyed run)."""
    for parent in rows:
        kids = max_tree.children[parent]
        if kids:
            drafted = coupled_draw(q[parent][None], len(kids), keys.row(parent)) if keys is not None \
                else draw(q[parent][None], len(kids), generator)
            tokens[kids[0]:kids[-1] + 1] = drafted[0]


def _first_forward(draft: Backend, pending: list[int], max_tree: Tree, known: torch.Tensor, base: int,
                   root_index: int, want_hidden: bool) -> Forward:
    """The round's first draft forward: the pending chain (causal) and the known nodes (the root and any levels
    already chosen; known: long [n_known]) under the tree mask below the root."""
    n_known = len(known)
    m = len(pending) - 1  # pending tokens before the root
    n_first = m + n_known
    mask = torch.zeros(n_first, base + n_first, dtype=torch.bool)
    mask[:, :base] = True
    mask[:m + 1, base:base + m + 1] = torch.ones(m + 1, m + 1, dtype=torch.bool).tril()
    mask[m:, base:base + m] = True  # the root and known nodes see the pending chain
    mask[m:, base + m:] = max_tree.ancestor_mask[:n_known, :n_known]
    positions = torch.cat([torch.arange(base, base + m), root_index + max_tree.depth_tensor[:n_known]])
    feed = torch.cat([torch.tensor(pending[:-1], dtype=torch.long), known])
    return Forward(draft, feed, positions, mask, want_hidden=want_hidden)


def _draft_dists(logits: torch.Tensor, sampling: SamplingConfig, history=None) -> torch.Tensor:
    """The draft law at each parent. Greedy: softmax of the (adjusted) logits, so that top-n drafting has a ranking
    (the greedy verifier never reads q's values). A row where the draft gives no mass to anything the processors
    allow (a head's reduced vocabulary under a grammar that allows only other tokens: every logit -inf, a NaN law)
    draws from the processed law of all-equal logits instead: the uniform law over what is allowed. Any law the
    draft draws from keeps the round lossless, as the verifier reads this q."""
    def dists(x: torch.Tensor) -> torch.Tensor:
        if sampling.greedy:
            return torch.softmax(adjust_logits(x, sampling, history) if sampling.adjusts else x.float(), dim=-1)
        return process_logits(x, sampling, history)

    q = dists(logits)
    dead = q.isnan().any(-1)  # (NaN logits are refused by process_logits: a NaN here is a row with no mass)
    if bool(dead.any()):
        q[dead] = dists(torch.zeros_like(logits))[dead].to(q.dtype)
    return q
