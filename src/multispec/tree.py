"""The token tree: topology only (tokens live with the proposer). design §3.

Nodes are stored breadth-first (level-major). Node 0 is the root: the last committed token, which the target
has not consumed yet. Every other node has a parent with a smaller index, siblings are contiguous and kept
in drafting order, and depths never decrease along the order, so the first `level_end(d)` nodes form the
tree truncated at depth d. That prefix property is what makes the dynamic sliced mask (design §3.5) a plain
top-left block of the full mask.

Terms used below, for a tree of N nodes placed after `prefix_len` cached tokens:
- ancestor mask: bool [N, N], row i admits exactly the ancestors of i and i itself;
- attention mask: bool [N, prefix_len + N], the ancestor mask with every prefix column admitted;
- position ids: prefix_len + depth (siblings share a position).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from multispec.errors import check

MAX_TREE_NODES = 4096  # a bound on user-given shapes; a bigger tree is almost surely a typo


@dataclass(frozen=True)
class Tree:
    """An immutable token-tree topology.

    parents: parent index per node; parents[0] == -1 (the root), parents[i] < i otherwise.
    """

    parents: tuple[int, ...]
    depths: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        parents = self.parents
        check(len(parents) >= 1 and parents[0] == -1, "a tree needs a root: parents[0] must be -1")
        depths = [0]
        for i in range(1, len(parents)):
            par = parents[i]
            check(isinstance(par, int) and 0 <= par < i, f"node {i}: parent {par!r} must be an earlier node")
            check(par >= parents[i - 1], f"node {i}: siblings must be contiguous and parents in breadth-first order")
            depths.append(depths[par] + 1)
            check(depths[i] >= depths[i - 1], f"node {i}: nodes must be stored level by level (breadth-first)")
        check(len(parents) <= MAX_TREE_NODES, f"tree has {len(parents)} nodes, more than {MAX_TREE_NODES}")
        object.__setattr__(self, "depths", tuple(depths))

    # ----------------------------------------------------------------- construction
    @staticmethod
    def from_shape(shape: tuple[int, ...] | list[int]) -> "Tree":
        """Expansion tree (k_1, ..., k_D): every node at depth d-1 gets k_d children. (4,2,2,1) has 44 non-root nodes."""
        shape = tuple(shape)
        check(len(shape) >= 1, "a tree shape needs at least one level, e.g. 4,2,2,1")
        for k in shape:
            check(isinstance(k, int) and not isinstance(k, bool) and k >= 1,
                  f"invalid tree shape {shape}: every level needs an integer width >= 1")
        total = 1
        width = 1
        for k in shape:
            width *= k
            total += width
            check(total <= MAX_TREE_NODES, f"tree shape {shape} has more than {MAX_TREE_NODES} nodes")
        parents = [-1]
        level = [0]
        for k in shape:
            nxt = []
            for par in level:
                for _ in range(k):
                    parents.append(par)
                    nxt.append(len(parents) - 1)
            level = nxt
        return Tree(tuple(parents))

    @staticmethod
    def chain(length: int) -> "Tree":
        """A single chain of `length` draft tokens below the root."""
        check(isinstance(length, int) and length >= 0, f"chain length must be >= 0, got {length!r}")
        return Tree(tuple([-1] + list(range(length))))

    def add_children(self, parent: int, count: int) -> "Tree":
        """Grow node by node: a new tree with `count` children appended under `parent`.

        The result must still be breadth-first: `parent` must not precede the parent of the last node.
        """
        check(0 <= parent < len(self.parents), f"parent {parent} is not a node of this tree")
        return Tree(self.parents + (parent,) * count)

    # ----------------------------------------------------------------- topology
    def __len__(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return self.depths[-1]

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, par in enumerate(self.parents[1:], start=1):
            kids[par].append(i)
        return tuple(tuple(k) for k in kids)

    def level(self, depth: int) -> range:
        """Node indices at `depth` (a contiguous range)."""
        return range(self.level_end(depth - 1) if depth > 0 else 0, self.level_end(depth))

    def level_end(self, depth: int) -> int:
        """Number of nodes with depth <= `depth` (N_d of design §3.5)."""
        return sum(1 for d in self.depths if d <= depth)

    def truncate(self, depth: int) -> "Tree":
        """The tree cut after `depth`: its first level_end(depth) nodes. Its ancestor mask is the top-left block
        of this tree's (design §3.5), shared rather than rebuilt."""
        n = self.level_end(depth)
        if n == len(self.parents):
            return self
        tree = Tree(self.parents[:n])
        object.__setattr__(tree, "ancestor_mask", self.ancestor_mask[:n, :n])  # cached_property's slot (a frozen dataclass)
        return tree

    def path_to(self, node: int) -> tuple[int, ...]:
        """Node indices from the root to `node`, both included."""
        path = [node]
        while self.parents[path[-1]] != -1:
            path.append(self.parents[path[-1]])
        return tuple(reversed(path))

    @cached_property
    def leaves(self) -> tuple[int, ...]:
        return tuple(i for i, kids in enumerate(self.children) if not kids)

    @cached_property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        """Root-to-leaf paths, in leaf order."""
        return tuple(self.path_to(leaf) for leaf in self.leaves)

    # ----------------------------------------------------------------- tensors
    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """bool [N, N]: M[i, j] iff j is an ancestor of i or j == i. Built by BFS: row(child) = row(parent) + diag."""
        n = len(self.parents)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i, par in enumerate(self.parents):
            if par >= 0:
                mask[i] = mask[par]
            mask[i, i] = True
        return mask

    @cached_property
    def depth_tensor(self) -> torch.Tensor:
        """long [N]."""
        return torch.tensor(self.depths, dtype=torch.long)

    def position_ids(self, prefix_len: int) -> torch.Tensor:
        """long [N]: prefix_len + depth. The root sits right after the prefix."""
        return self.depth_tensor + prefix_len

    def attention_mask(self, prefix_len: int, rows: range | None = None, cols: int | None = None) -> torch.Tensor:
        """bool [R, prefix_len + C] topology-aware causal mask: prefix columns admitted, tree columns by ancestry.

        rows: the node rows to return (default all); cols: how many tree columns (default N). Slicing both to the
        first N_d nodes gives the mask of the truncated tree (design §3.5).
        """
        rows = range(len(self)) if rows is None else rows
        cols = len(self) if cols is None else cols
        out = torch.ones(len(rows), prefix_len + cols, dtype=torch.bool)  # one allocation per step, no cat
        out[:, prefix_len:] = self.ancestor_mask[rows.start : rows.stop, :cols]
        return out

    def keep_indices(self, path: tuple[int, ...] | list[int], prefix_len: int) -> torch.Tensor:
        """long [prefix_len + len(path)]: cache rows to keep after accepting `path` (node indices, root first),
        when the tree's nodes were appended in order right after `prefix_len` cached tokens."""
        return torch.cat([torch.arange(prefix_len), torch.tensor(list(path), dtype=torch.long) + prefix_len])


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask -> additive float mask: 0 where admitted, the dtype's most negative value elsewhere."""
    return torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)  # one pass; .to is free for float32


def parse_shape(text: str) -> tuple[int, ...]:
    """'4,2,2,1' -> (4, 2, 2, 1), with a clear error for anything else."""
    parts = str(text).split(",")
    check(all(part.strip().isdigit() for part in parts),
          f"invalid tree shape {text!r}: expected comma-separated positive integers such as 4,2,2,1")
    shape = tuple(int(part) for part in parts)
    Tree.from_shape(shape)  # validates
    return shape
