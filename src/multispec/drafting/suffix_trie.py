"""Depth-bounded suffix tries with counts, the data structure under suffix speculation (drafting/suffix.py).

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
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence, TypeAlias

from multispec.tree import Tree

# A trie position: a node id, or a point (seq, start, d) inside a lazy leaf's chain: the string seq[start:start + d]
Ref: TypeAlias = "int | tuple[Sequence[int], int, int]"


class Trie:
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

    def _split(self, node: int, tail: tuple[Sequence[int], int]) -> None:
        """Make lazy leaf `node` (its `tail`: (seq, start)) a plain node: its occurrence's next token (if any)
        becomes a lazy child."""
        seq, start = tail
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
            chain = tail[child]
            if chain is not None:  # seen once before, in a chain: split it one level
                self._split(child, chain)
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
                if kids is None:
                    raise RuntimeError(f"suffix trie: removing a sequence never added (node {node} has no children)")
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

    def children(self, ref: Ref) -> list[tuple[int, int, Ref]]:
        """[(count, token, child ref)] below a node or chain position, unordered."""
        if isinstance(ref, int):
            tail = self.tail[ref]
            if tail is None:
                kids = self.kids[ref]
                return [(self.count[c], t, c) for t, c in kids.items()] if kids else []
            (seq, start), d = tail, self.level[ref]
        else:
            seq, start, d = ref
        if d < self.depth and start + d < len(seq):
            return [(1, seq[start + d], (seq, start, d + 1))]
        return []

    def ranked(self, ref: Ref) -> list[tuple[int, int, Ref]]:
        """`children(ref)`, most frequent first, then by token id."""
        return sorted(self.children(ref), key=lambda e: (-e[0], e[1]))

    def walk(self, tokens: Sequence[int]) -> Ref | None:
        """The ref of the string `tokens`, or None."""
        ref: Ref = 0
        for token in tokens:
            step: Ref | None
            if isinstance(ref, int) and self.tail[ref] is None:
                kids = self.kids[ref]
                step = kids.get(token) if kids is not None else None
            else:
                below = self.children(ref)
                step = below[0][2] if below and below[0][1] == token else None
            if step is None:
                return None
            ref = step
        return ref

    def longest_match(self, context: Sequence[int], max_match: int) -> tuple[Ref, int]:
        """(ref, m): the longest suffix of `context` (m <= max_match) that has a continuation, by bisection on m
        (a suffix of such a suffix has one too); (0, 0) when none. O(max_match log max_match)."""
        best: tuple[Ref, int] = (0, 0)
        lo, hi = 1, min(max_match, len(context), self.depth - 1)
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


def empty_proposal(root: int) -> SuffixProposal:
    return SuffixProposal(Tree.chain(0), (root,), (1.0,), 0, "none")


def expand(trie: Trie, match, m: int, root: int, max_nodes: int, max_depth: int, min_prob: float,
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
        return empty_proposal(root)
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


def depth_cap(m: int, trie_depth: int, factor: float, offset: int, max_depth: int | None) -> int:
    cap = min(trie_depth - m, int(factor * m + offset))
    return cap if max_depth is None else min(cap, max_depth)
