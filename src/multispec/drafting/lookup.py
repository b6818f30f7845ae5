"""Prompt lookup (n-gram) proposals: draft tokens copied from earlier in the context, no draft model.

Like transformers' `PromptLookupCandidateGenerator` (`prompt_lookup_num_tokens`, `max_matching_ngram_size`): the
last n tokens of the context (n from `max_ngram` down to 1) are searched for earlier in prompt + output, and the
tokens that followed the match are proposed. We take the most recent match (transformers takes the first), since
nearby text predicts better. The proposal is deterministic given the context, so its draft law is a point mass:
verification with q = one-hot accepts token x with probability p(x) and otherwise draws from p with x removed,
which is exactly single-draft speculative sampling and lossless.
"""
from __future__ import annotations

import torch


def lookup_with_n(context: list[int], max_tokens: int, max_ngram: int = 3,
                  min_ngram: int = 1) -> tuple[list[int], int]:
    """Up to `max_tokens` tokens that followed the latest earlier occurrence of the context's last n-gram (longest
    n first, n >= min_ngram), and that n; ([], 0) when nothing matches. context: token ids, oldest first."""
    n_ctx = len(context)
    if max_tokens <= 0 or n_ctx < 2:
        return [], 0
    ids = torch.tensor(context, dtype=torch.long)
    head = ids[:n_ctx - 1]  # a match must end before the last token, so that something follows it
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        hits = head[: n_ctx - n].eq(ids[n_ctx - n])  # candidate starts whose first token matches
        for j in range(1, n):
            hits &= head[j: n_ctx - n + j].eq(ids[n_ctx - n + j])
        starts = hits.nonzero()
        if starts.numel():
            follow = int(starts[-1]) + n  # the latest match
            return context[follow:follow + max_tokens], n
    return [], 0


class NgramIndex:
    """Incremental prompt lookup: for n = 1..max_ngram, the latest position that followed each n-gram of the
    context. `propose` returns the same tokens as `lookup_with_n` in O(max_ngram) per call once the index has
    caught up (each new context token is indexed once), instead of a scan of the whole context."""

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram
        self.follow: list[dict[tuple[int, ...], int]] = [dict() for _ in range(max_ngram + 1)]
        self.indexed = 1  # positions < indexed have been entered as followers

    def propose(self, context: list[int], max_tokens: int, min_ngram: int = 1) -> tuple[list[int], int]:
        while self.indexed < len(context):  # n-grams ending right before position `indexed` are followed by it
            i = self.indexed
            for n in range(1, min(self.max_ngram, i) + 1):
                self.follow[n][tuple(context[i - n:i])] = i
            self.indexed += 1
        if max_tokens <= 0:
            return [], 0
        for n in range(min(self.max_ngram, len(context) - 1), min_ngram - 1, -1):
            pos = self.follow[n].get(tuple(context[len(context) - n:]))
            if pos is not None:
                return context[pos:pos + max_tokens], n
        return [], 0


def one_hot_law(tokens: torch.Tensor, vocab: int, n_nodes: int) -> torch.Tensor:
    """float32 [n_nodes, V]: q[u] = one-hot of the token of u's child (a chain: node u + 1). tokens: long [n_nodes]
    with tokens[0] the root; the last node has no child (zero row)."""
    q = torch.zeros(n_nodes, vocab)
    if n_nodes > 1:
        q[torch.arange(n_nodes - 1), tokens[1:n_nodes]] = 1.0
    return q
