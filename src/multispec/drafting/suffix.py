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

Data structure: both indexes are depth-bounded suffix tries with counts, with single-occurrence tails left
implicit. Every substring of length <= depth of an indexed sequence has a count (its occurrences), so "the
continuations of s ranked by frequency" are the children of s, and the subtree of s is exactly the candidate
tree. A string seen twice or more is a node; a string seen once may instead lie on the chain of a *lazy leaf*,
a count-1 node that records where its occurrence starts and so stands for the whole single-occurrence chain
below it (the tail of a suffix tree's leaf edge). Appending a token visits the plain nodes of the suffixes ending
at the previous token (the `active` list, at most depth of them): each extends to an existing child (count + 1,
splitting a lazy leaf one level when its occurrence is met a second time) or gets a new lazy leaf. That is
O(depth) per token with no rebuild, and O(1) new nodes per token of novel text: on HumanEval prompts + solutions
(33k tokens, depth 32) the store holds 1.9 nodes per token (~0.4 KB per token), where the fully materialised trie
held 26.5 (~7 KB). Removing a sequence (eviction) walks its suffixes the same way and frees nodes whose count
reaches 0; a node left at count 1 is not folded back into a lazy leaf, so the node count stays below
max_tokens * depth. Alternatives: a compacted suffix tree (Ukkonen) has O(n) nodes too, but keeping its counts
under appends and deletions is far more code; a suffix automaton finds the longest match in O(1), but its
continuation counts (endpos sizes) are only known after a pass over the suffix-link tree, so they are not
incremental. Nodes are integer ids into flat lists (`count`, `kids`, `tail`, `level`); freed ids are reused.

Every proposal is a deterministic function of the context and the store, and siblings are distinct tokens, so
its draft law is a point mass per sibling (`first_child_law` gives the per-node q the verifiers take; see the
integration notes in benchmarks/results/suffix/README.md).
"""
from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from multispec.drafting.protocol import DraftPolicyBase, RoundPlan
from multispec.errors import check
from multispec.tree import Tree


class _Trie:
    """A suffix trie of bounded depth with occurrence counts, its single-occurrence tails left implicit.

    Every substring of length <= depth of an indexed sequence has a count (its occurrences). A string seen twice
    or more is a node (`count`, `kids`: token -> child). A string seen once is either a node or lies on the
    implicit chain of a *lazy leaf*: a node of count 1 that records where its one occurrence starts, (seq,
    start); its string is seq[start:start + d] and the strings below it are seq[start:start + d + k], each of
    count 1, up to `depth` tokens and the end of seq (which for a growing context is its current end). A
    second occurrence reaching a lazy leaf turns it into a plain node with one lazy child (`_split`). So novel
    text costs O(1) nodes per token instead of O(depth). Positions inside a chain are refs (seq, start, d).
    Not thread-safe (`SuffixStore` holds a lock)."""

    def __init__(self, depth: int):
        self.depth = depth
        self.count: list[int] = [0]  # node -> occurrences of its string (node 0: the root, the empty string)
        self.kids: list[dict[int, int] | None] = [None]  # node -> {token: child node}, None when it has none
        self.tail: list[tuple[Sequence[int], int] | None] = [None]  # lazy leaf -> (seq, start); None otherwise
        self.level: list[int] = [0]  # node -> length of its string
        self.free: list[int] = []  # ids of removed nodes, reused first

    @property
    def n_nodes(self) -> int:
        return len(self.count) - len(self.free)

    def _new(self, parent: int, token: int, tail: tuple[Sequence[int], int] | None) -> int:
        """A new child of `parent` for `token`, count 0."""
        if self.free:
            node = self.free.pop()
            self.count[node], self.kids[node], self.tail[node] = 0, None, tail
            self.level[node] = self.level[parent] + 1
        else:
            node = len(self.count)
            self.count.append(0)
            self.kids.append(None)
            self.tail.append(tail)
            self.level.append(self.level[parent] + 1)
        kids = self.kids[parent]
        if kids is None:
            kids = self.kids[parent] = {}
        kids[token] = node
        return node

    def _split(self, node: int) -> None:
        """Make lazy leaf `node` a plain node: its occurrence's next token (if any) becomes a lazy child."""
        seq, start = self.tail[node]
        self.tail[node] = None
        d = self.level[node]
        if d < self.depth and start + d < len(seq):
            child = self._new(node, seq[start + d], (seq, start))
            self.count[child] = 1

    def push(self, active: list[int], seq: Sequence[int], i: int) -> list[int]:
        """Count every suffix of seq[:i + 1] of length <= depth, given `active`: the plain nodes of the suffixes
        of seq[:i] shorter than depth, shortest first. Returns the new active list. O(depth) dict operations;
        a suffix seen for the first time ends as a lazy leaf and leaves the active list."""
        token, new = seq[i], []
        count, kids_of, tail = self.count, self.kids, self.tail
        for node in [0] + active:
            kids = kids_of[node]
            child = kids.get(token) if kids is not None else None
            if child is None:  # a first occurrence (so are the longer suffixes): a lazy leaf, not active
                child = self._new(node, token, (seq, i - self.level[node]))
                count[child] = 1
                continue
            if tail[child] is not None:  # seen once before, in a chain: split it one level
                self._split(child)
            count[child] += 1
            if self.level[child] < self.depth:
                new.append(child)
        return new

    def add(self, tokens: Sequence[int]) -> None:
        """Index one sequence: every substring of length <= depth counted once per occurrence."""
        active: list[int] = []
        for i in range(len(tokens)):
            active = self.push(active, tokens, i)

    def remove(self, tokens: Sequence[int]) -> None:
        """Undo `add(tokens)`: decrement the nodes on every substring's path, free those at 0. O(len * depth)."""
        for start in range(len(tokens)):
            node, node_freed = 0, False
            for token in tokens[start : start + self.depth]:
                kids = self.kids[node]
                child = kids[token]
                if node_freed:  # `node` was freed on this walk: its dict only led here
                    self.kids[node] = None
                self.count[child] -= 1
                lazy = self.tail[child] is not None
                child_freed = self.count[child] == 0  # no other occurrence passes here
                if child_freed:
                    if not node_freed:
                        del kids[token]
                        if not kids:
                            self.kids[node] = None
                    self.tail[child] = None
                    self.free.append(child)
                if lazy:  # this occurrence's own leaf (count 1): nothing below it is a node
                    break
                node, node_freed = child, child_freed
            else:
                if node_freed:
                    self.kids[node] = None

    def children(self, ref) -> list[tuple[int, int, object]]:
        """[(count, token, child ref)] below a node or chain position, unordered."""
        if isinstance(ref, int):
            if self.tail[ref] is None:
                kids = self.kids[ref]
                return [(self.count[c], t, c) for t, c in kids.items()] if kids else []
            (seq, start), d = self.tail[ref], self.level[ref]
        else:
            seq, start, d = ref
        if d < self.depth and start + d < len(seq):
            return [(1, seq[start + d], (seq, start, d + 1))]
        return []

    def ranked(self, ref) -> list[tuple[int, int, object]]:
        """`children(ref)`, most frequent first, then by token id."""
        return sorted(self.children(ref), key=lambda e: (-e[0], e[1]))

    def walk(self, tokens: Sequence[int]):
        """The ref of the string `tokens`, or None."""
        ref = 0
        for token in tokens:
            if isinstance(ref, int) and self.tail[ref] is None:
                kids = self.kids[ref]
                ref = kids.get(token) if kids is not None else None
            else:
                below = self.children(ref)
                ref = below[0][2] if below and below[0][1] == token else None
            if ref is None:
                return None
        return ref

    def longest_match(self, context: Sequence[int], max_match: int):
        """(ref, m): the longest suffix of `context` (m <= max_match) that has a continuation, by bisection on m
        (a suffix of such a suffix has one too); (0, 0) when none. O(max_match log max_match)."""
        lo, hi, best = 1, min(max_match, len(context), self.depth - 1), (0, 0)
        while lo <= hi:
            m = (lo + hi) // 2
            ref = self.walk(context[len(context) - m :])
            if ref is not None and self.children(ref):
                best, lo = (ref, m), m + 1
            else:
                hi = m - 1
        return best


@dataclass(frozen=True)
class SuffixProposal:
    """A drafted token tree. tree: N nodes, breadth-first, children contiguous and in rank order (most frequent
    first), siblings distinct; tokens: N ids, tokens[0] = the root = the context's last token; scores: N floats,
    scores[0] = 1, scores[u] = product of conditional frequencies on the path to u; match_len: |s|; source:
    "context", "store" or "none" (an empty tree: the root alone)."""

    tree: Tree
    tokens: tuple[int, ...]
    scores: tuple[float, ...]
    match_len: int
    source: str

    @property
    def expected_accepted(self) -> float:
        """sum of the draft nodes' scores: the expected accepted draft tokens if the statistics were the target's."""
        return sum(self.scores[1:])


def _empty(root: int) -> SuffixProposal:
    return SuffixProposal(Tree.chain(0), (root,), (1.0,), 0, "none")


def expand(trie: _Trie, match, m: int, root: int, max_nodes: int, max_depth: int, min_prob: float,
           source: str) -> SuffixProposal:
    """The best `max_nodes` nodes below trie node (or chain position) `match` by score, at most `max_depth` deep, as a proposal.

    Best-first: a node is popped before its children are pushed, and a child's score never exceeds its
    parent's, so the kept nodes form a subtree. Ties keep push order (parents in pop order, children in rank
    order), so the result is deterministic."""
    # heap entries: (-score, push order, trie ref, parent's index in `kept`, token, depth, rank among siblings)
    heap: list[tuple] = []
    order = 0

    def push_kids(node, score: float, out_parent: int, depth: int) -> None:
        nonlocal order
        ranked = trie.ranked(node)
        total = sum(c for c, _, _ in ranked)
        for rank, (c, token, child) in enumerate(ranked[:max_nodes]):
            prob = c / total
            if prob < min_prob:
                break  # ranked: the rest are rarer
            heapq.heappush(heap, (-score * prob, order, child, out_parent, token, depth, rank))
            order += 1

    kept: list[tuple[int, int, float, int, int]] = [(-1, root, 1.0, 0, 0)]  # (out parent, token, score, depth, rank)
    if max_depth >= 1:
        push_kids(match, 1.0, 0, 1)
    while heap and len(kept) <= max_nodes:
        neg, _, node, out_parent, token, depth, rank = heapq.heappop(heap)
        kept.append((out_parent, token, -neg, depth, rank))
        if depth < max_depth:
            push_kids(node, -neg, len(kept) - 1, depth + 1)
    if len(kept) == 1:
        return _empty(root)
    # Breadth-first renumbering: by depth, then parent's new index, then rank (siblings contiguous, ranked).
    new_index, order_bfs, level = {0: 0}, [0], [0]
    children: dict[int, list[int]] = {}
    for i in range(1, len(kept)):
        children.setdefault(kept[i][0], []).append(i)
    while level:
        nxt = []
        for i in level:
            for kid in sorted(children.get(i, ()), key=lambda k: kept[k][4]):
                new_index[kid] = len(order_bfs)
                order_bfs.append(kid)
                nxt.append(kid)
        level = nxt
    parents = tuple(-1 if i == 0 else new_index[kept[i][0]] for i in order_bfs)
    return SuffixProposal(Tree(parents), tuple(kept[i][1] for i in order_bfs), tuple(kept[i][2] for i in order_bfs),
                          m, source)


def _depth_cap(m: int, trie_depth: int, factor: float, offset: int, max_depth: int | None) -> int:
    cap = min(trie_depth - m, int(factor * m + offset))
    return cap if max_depth is None else min(cap, max_depth)


class SuffixStore:
    """Past sequences shared across requests: a suffix trie over at most `max_tokens` tokens. Adding a sequence
    beyond the cap evicts the least recently used ones (added or `touch`ed longest ago). Thread-safe: every
    method holds the store's lock. A sequence longer than the cap keeps its last `max_tokens` tokens. Memory:
    about 0.4 KB per held token on code at depth 32 (HumanEval), so the default cap is ~80 MB."""

    def __init__(self, max_tokens: int = 200_000, depth: int = 32):
        check(max_tokens >= 1, f"suffix store: max_tokens must be >= 1, got {max_tokens}")
        check(depth >= 2, f"suffix store: depth must be >= 2, got {depth}")
        self.max_tokens, self.depth = max_tokens, depth
        self._trie = _Trie(depth)
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
                return _empty(context[-1])
            cap = _depth_cap(m, self.depth, factor, offset, max_depth)
            return expand(self._trie, node, m, context[-1], max_nodes, cap, min_prob, "store")


class ContextIndex:
    """The suffix trie of one request's context, extended incrementally: each call indexes only the tokens
    appended since the previous call (O(depth) each). One per request; not shared between threads."""

    def __init__(self, depth: int = 32):
        check(depth >= 2, f"suffix index: depth must be >= 2, got {depth}")
        self.depth = depth
        self.reset()

    def reset(self) -> None:
        self.trie = _Trie(self.depth)
        self.active: list[int] = []
        self.indexed: list[int] = []  # the tokens indexed so far

    def update(self, context: list[int]) -> None:
        """Index context[len(indexed):]. A context that does not extend the indexed one (its token at the last
        indexed position differs, or it is shorter) is indexed from scratch."""
        n = len(self.indexed)
        if len(context) < n or (n and context[n - 1] != self.indexed[-1]):
            self.reset()
            n = 0
        for token in context[n:]:
            self.indexed.append(token)
            self.active = self.trie.push(self.active, self.indexed, len(self.indexed) - 1)

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
            return _empty(context[-1])
        node, m = self.index.longest_match(self.max_match)
        best = _empty(context[-1])
        if m:
            cap = _depth_cap(m, self.depth, self.factor, self.offset, max_depth)
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
