"""Per-node histories for history-dependent sampling processors (penalties, min_tokens) in a drafted tree.

Plain decoding processes the logits after a prefix with that prefix's own token counts. A speculative round scores
a whole tree in one forward, and node u's row continues the committed text *plus u's own path*: so u's counts are
the committed counts plus the tokens on the path from the root to u (the root is the newest committed token,
already counted). Building each row's history this way makes every node's processed law the one plain decoding
would use after that path, which is what the (lossless) verifiers then preserve.
"""
from __future__ import annotations

import torch

from multispec.sampling import History
from multispec.tree import Tree


class CommittedHistory:
    """The prompt and the committed output, as the processors read them: seen bool [V] (prompt or output),
    counts float32 [V] (output occurrences), out_len (output length). V: the largest vocabulary a row may have
    (target and draft); rows of a smaller vocabulary read the first columns. stop_ids: what min_tokens holds back.
    grammar: a structured.Grammar, whose state follows the committed output and masks each node along its path."""

    def __init__(self, prompt: list[int], vocab: int, stop_ids, grammar=None, counts: bool = True) -> None:
        self.vocab, self.track_counts = vocab, counts  # counts False: nothing reads seen / counts (a grammar alone)
        self.grammar = grammar.start() if grammar is not None else None
        self.seen = torch.zeros(vocab, dtype=torch.bool)
        self.seen[torch.tensor(prompt, dtype=torch.long)] = True
        self.counts = torch.zeros(vocab)
        self.out_len = 0
        self.stop_ids = tuple(sorted(stop_ids))

    def commit(self, tokens: list[int]) -> None:
        self._count(tokens)
        if tokens and self.grammar is not None:
            self.grammar.commit(tokens)

    def forced(self, limit: int) -> list[int]:
        """Tokens the grammar allows one at a time from here (probability 1 under the constrained law), at most
        `limit`, committed here (GrammarState.forced advances the grammar over them); [] without a grammar."""
        if self.grammar is None or limit <= 0:
            return []
        tokens = self.grammar.forced(self.vocab, limit)
        self._count(tokens)
        return tokens

    def _count(self, tokens: list[int]) -> None:
        if tokens:
            ids = torch.tensor(tokens, dtype=torch.long)
            self.counts.index_add_(0, ids, torch.ones(len(tokens)))
            self.seen[ids] = True
            self.out_len += len(tokens)

    def at_root(self, vocab: int) -> History:
        """One row: the history after the committed tokens."""
        allowed = self.grammar.mask(vocab)[None] if self.grammar is not None else None
        return History(seen=self.seen[None, :vocab], counts=self.counts[None, :vocab],
                       out_len=torch.tensor([self.out_len]), stop_ids=self.stop_ids, allowed=allowed)

    def for_nodes(self, tree: Tree, tokens: torch.Tensor, rows: range | list[int], vocab: int) -> History:
        """One row per node in `rows` of `tree` (tokens: long [N], tokens[0] the root): each node's history is the
        committed one plus the tokens of its own path below the root."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        n = len(tokens)
        allowed = self.grammar.node_masks(tree, tokens[:n].tolist(), idx.tolist(), vocab) \
            if self.grammar is not None else None
        if not self.track_counts:
            r = len(idx)
            return History(seen=self.seen[None, :vocab].expand(r, -1), counts=self.counts[None, :vocab].expand(r, -1),
                           out_len=self.out_len + tree.depth_tensor[:n][idx], stop_ids=self.stop_ids, allowed=allowed)
        below_root = tree.ancestor_mask[:n, :n][idx][:, 1:].float()  # [R, N-1]: u's path nodes below the root
        path_counts = below_root @ torch.nn.functional.one_hot(tokens[1:n], self.vocab).float()  # [R, V]
        counts = self.counts[None] + path_counts
        return History(seen=(self.seen[None] | (path_counts > 0))[:, :vocab], counts=counts[:, :vocab],
                       out_len=self.out_len + tree.depth_tensor[:n][idx], stop_ids=self.stop_ids, allowed=allowed)
