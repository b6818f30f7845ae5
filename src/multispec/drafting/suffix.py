"""Suffix speculation (issue 30; SuffixDecoding, Oliaro et al., NeurIPS 2025, as in Arctic Inference): a token tree
drafted from text seen before, without a draft model.

Two indexes are matched against the context (prompt + committed tokens):
- `ContextIndex`, one per request, over the context itself, extended by the tokens committed since the last call;
- `SuffixStore`, one per decoder, shared by requests (threads): earlier requests' prompts and outputs, at most
  `max_tokens` tokens, evicting the least recently used sequence first, guarded by a lock.
Each finds the longest suffix s of the context (|s| <= max_match) that occurred before with a continuation and
expands the continuations below s best-first: a child's conditional frequency is count(s x) / sum_y count(s y),
a node's score is the product of the frequencies on its path (the empirical probability that the whole path is
the continuation), and the best `max_nodes` nodes are kept, children ranked by count. The depth is capped at
max_spec_factor * |s| + max_spec_offset (a long match earns a deep tree), and a child whose conditional frequency
is below min_prob is not drafted. The index with the higher total score (expected accepted tokens under that
empirical model) gives the round's tree.

The tries themselves (depth-bounded, counted, with lazy single-occurrence tails) are in drafting/suffix_trie.py.

Every proposal is a deterministic function of the context and the store, and siblings are distinct tokens, so
its draft law is a point mass per sibling (`first_child_law` gives the per-node q the verifiers take; see the
integration notes in benchmarks/results/suffix/README.md).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable

import torch

from multispec.drafting.protocol import DraftPolicyBase, RoundPlan
from multispec.drafting.suffix_trie import SuffixProposal, Trie, depth_cap, empty_proposal, expand
from multispec.errors import check
from multispec.tree import Tree


class SuffixStore:
    """Past sequences shared across requests: a suffix trie over at most `max_tokens` tokens. Adding a sequence
    beyond the cap evicts the least recently used ones (added or `touch`ed longest ago). Thread-safe: every
    method holds the store's lock. A sequence longer than the cap keeps its last `max_tokens` tokens. Memory:
    about 0.4 KB per held token on code at depth 32 (HumanEval), so the default cap is ~80 MB."""

    def __init__(self, max_tokens: int = 200_000, depth: int = 32):
        check(max_tokens >= 1, f"suffix store: max_tokens must be >= 1, got {max_tokens}")
        check(depth >= 2, f"suffix store: depth must be >= 2, got {depth}")
        self.max_tokens, self.depth = max_tokens, depth
        self._trie = Trie(depth)
        self._seqs: OrderedDict[Hashable, tuple[int, ...]] = OrderedDict()  # least recently used first
        self._tokens = 0
        self._next_key = 0
        self._lock = threading.Lock()

    @property
    def n_tokens(self) -> int:
        return self._tokens

    @property
    def n_nodes(self) -> int:
        return self._trie.n_nodes

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._seqs

    def add(self, key: Hashable | None, tokens: list[int] | tuple[int, ...]) -> Hashable:
        """Store `tokens` under `key` (replacing what `key` held; None: a new key from the store's counter) as the
        most recently used sequence, then evict least recently used sequences until at most max_tokens tokens are
        held. Returns the key. O(len(tokens) * depth)."""
        tokens = tuple(tokens[-self.max_tokens :]) if tokens else ()
        with self._lock:
            if key is None:
                key, self._next_key = ("seq", self._next_key), self._next_key + 1
            old = self._seqs.pop(key, None)
            if old is not None:
                self._trie.remove(old)
                self._tokens -= len(old)
            if not tokens:
                return key
            while self._seqs and self._tokens + len(tokens) > self.max_tokens:
                _, evicted = self._seqs.popitem(last=False)
                self._trie.remove(evicted)
                self._tokens -= len(evicted)
            self._trie.add(tokens)
            self._seqs[key] = tokens
            self._tokens += len(tokens)
        return key

    def touch(self, key: Hashable) -> None:
        """Mark `key` most recently used (no-op if absent)."""
        with self._lock:
            if key in self._seqs:
                self._seqs.move_to_end(key)

    def clear(self) -> None:
        """Forget every stored sequence (bench: what its untimed warm-up generated)."""
        with self._lock:
            self._trie, self._tokens = Trie(self.depth), 0
            self._seqs.clear()

    def remove(self, key: Hashable) -> None:
        with self._lock:
            old = self._seqs.pop(key, None)
            if old is not None:
                self._trie.remove(old)
                self._tokens -= len(old)

    def propose(self, context: list[int], max_nodes: int, max_match: int, factor: float, offset: int,
                min_prob: float, max_depth: int | None = None) -> SuffixProposal:
        """The proposal from the stored sequences (see `SuffixProposer.propose`)."""
        with self._lock:
            node, m = self._trie.longest_match(context, max_match)
            if m == 0:
                return empty_proposal(context[-1])
            cap = depth_cap(m, self.depth, factor, offset, max_depth)
            return expand(self._trie, node, m, context[-1], max_nodes, cap, min_prob, "store")


class ContextIndex:
    """The suffix trie of one request's context, extended incrementally: each call indexes only the tokens
    appended since the previous call (O(depth) each). One per request; not shared between threads."""

    def __init__(self, depth: int = 32):
        check(depth >= 2, f"suffix index: depth must be >= 2, got {depth}")
        self.depth = depth
        self.reset()

    def reset(self) -> None:
        self.trie = Trie(self.depth)
        self.active: list[int] = []
        self.indexed: list[int] = []  # the tokens indexed so far

    def update(self, context: list[int]) -> None:
        """Index context[len(indexed):]. A context that does not extend the indexed one (its token at the last
        indexed position differs, or it is shorter) is indexed from scratch."""
        n = len(self.indexed)
        if len(context) < n or (n and context[n - 1] != self.indexed[-1]):
            self.reset()
            n = 0
        indexed, push, active = self.indexed, self.trie.push, self.active
        for token in context[n:]:
            indexed.append(token)
            active = push(active, indexed, len(indexed) - 1)
        self.active = active

    def longest_match(self, max_match: int) -> tuple[int, int]:
        """(node, m): the longest suffix of the indexed context (m <= max_match) that occurred earlier with a
        continuation, read off the active nodes (a string seen twice is a plain node); (0, 0) when none.
        O(depth)."""
        for node in reversed(self.active):  # longest first
            m = self.trie.level[node]
            if m <= max_match and self.trie.kids[node]:
                return node, m
        return 0, 0


class SuffixProposer:
    """Suffix speculation for one request: its `ContextIndex` plus an optional shared `SuffixStore`.

    depth: trie depth D (longest indexed substring); max_match <= D - 1: longest suffix matched;
    factor, offset: the tree depth is at most factor * match_len + offset (SuffixDecoding's max_spec_factor and
    max_spec_offset), and at most D - match_len; min_prob: children rarer than this (conditional frequency)
    are not drafted (SuffixDecoding's min_token_prob).
    """

    def __init__(self, store: SuffixStore | None = None, depth: int = 32, max_match: int = 16,
                 factor: float = 2.0, offset: int = 0, min_prob: float = 0.1):
        check(1 <= max_match <= depth - 1, f"suffix: max_match must be in [1, depth - 1], got {max_match}")
        check(store is None or store.depth == depth, "suffix: the store's depth must equal the proposer's")
        check(factor >= 0 and 0.0 <= min_prob <= 1.0, "suffix: factor must be >= 0 and min_prob in [0, 1]")
        self.store, self.depth, self.max_match = store, depth, max_match
        self.factor, self.offset, self.min_prob = factor, offset, min_prob
        self.index = ContextIndex(depth)

    def reset(self) -> None:
        """Forget the request (the store is kept)."""
        self.index.reset()

    def propose(self, context: list[int], max_nodes: int, max_depth: int | None = None) -> SuffixProposal:
        """A token tree of at most `max_nodes` draft nodes (N <= max_nodes + 1 with the root) for the tokens after
        `context` (token ids, oldest first, non-empty; the root is context[-1]). The context index is updated
        with the tokens appended since the last call first. Of the two candidate trees (context, store), the
        one with the larger `expected_accepted` is returned (the context's on a tie)."""
        check(len(context) >= 1, "suffix: the context must hold at least one token")
        self.index.update(context)
        if max_nodes <= 0:
            return empty_proposal(context[-1])
        node, m = self.index.longest_match(self.max_match)
        best = empty_proposal(context[-1])
        if m:
            cap = depth_cap(m, self.depth, self.factor, self.offset, max_depth)
            best = expand(self.index.trie, node, m, context[-1], max_nodes, cap, self.min_prob, "context")
        if self.store is not None:
            other = self.store.propose(context, max_nodes, self.max_match, self.factor, self.offset,
                                       self.min_prob, max_depth)
            if other.expected_accepted > best.expected_accepted:
                best = other
        return best


class SuffixPolicy(DraftPolicyBase):
    """Suffix speculation as a draft policy (no draft model): each round, the `SuffixProposer` tree for the
    history, at most `max_nodes` draft nodes; a plain target step when nothing matches.

    plan_round returns RoundPlan(tree, "suffix", tokens) with tokens[i] the token of node i + 1 (the root, the
    last committed token, is not repeated: as for "lookup"). The shared `store` (None: context only) is built once
    per decoder family (the registry's `load`, shared by spawned decoders); the engine calls `finish(ids)` after
    each generation, which adds its prompt + output to the store."""

    def __init__(self, max_nodes: int = 16, store: SuffixStore | None = None, depth: int = 32, max_match: int = 16,
                 factor: float = 2.0, offset: int = 0, min_prob: float = 0.1):
        check(max_nodes >= 1, f"suffix: max_nodes must be >= 1, got {max_nodes}")
        self.max_nodes, self.store = max_nodes, store
        self.proposer = SuffixProposer(store, depth, max_match, factor, offset, min_prob)

    def reset(self) -> None:
        self.proposer.reset()

    def finish(self, history: list[int]) -> None:
        """Store a finished request's prompt + output for later requests."""
        if self.store is not None and history:
            self.store.add(None, list(history))

    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        prop = self.proposer.propose(history, self.max_nodes)
        if len(prop.tree) == 1:
            return RoundPlan(Tree.chain(0), "none")
        return RoundPlan(prop.tree, "suffix", prop.tokens[1:], label=f"suffix:{prop.source}")


def first_child_law(tree: Tree, tokens: list[int] | tuple[int, ...] | torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 [N, V]: q[u] = one-hot of the token of u's first child (zero row at a leaf). The draft law of a
    deterministic tree with distinct siblings for the node walk (`walk_tree`) with `rrs-wor`: the first child
    is accepted with probability p(x_1); otherwise the new token comes from p without x_1, and a new token equal
    to a later sibling's is routed into that sibling (tree_walk `_child_for`). So sibling i is reached with
    probability p(x_i), the most any lossless verifier can give a deterministic draft. On a chain this is
    `lookup.one_hot_law`."""
    tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    q = torch.zeros(len(tree), vocab)
    for u, kids in enumerate(tree.children):
        if kids:
            q[u, tokens[kids[0]]] = 1.0
    return q
