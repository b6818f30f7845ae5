"""Draft policies (the protocol is in drafting/protocol.py): which tree to draft this round and when to stop growing it.

A policy reads draft-side state only (design §10.9), so the stopping decision never depends on the target's accept
coins and every lossless verifier stays lossless. Adaptive state lives here and resets at the start of each
generation (style §2.12).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from multispec.drafting.protocol import DraftPolicyBase, RoundOutcome, RoundPlan
from multispec.tree import Tree


class FixedTree(DraftPolicyBase):
    """Draft the whole max tree every round (sd with fixed k, mcsd, ti-mcsd); subclasses stop it early.
    proposer: the registered proposer that drafts it (drafting/proposers.py; default: the draft model)."""

    proposer = "draft"

    def __init__(self, tree: Tree, proposer: str = "draft"):
        self.tree, self.proposer = tree, proposer

    def round_tree(self) -> Tree:
        return self.tree

    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        tree = self.round_tree()
        return RoundPlan(tree, self.proposer if tree.max_depth > 0 else "none")


class DynamicTree(FixedTree):
    """EAGLE-2's dynamic tree (drafting/dynamic_tree.py) every round: up to `nodes` nodes below the root, `depth`
    levels, `width` children per expanded node and nodes expanded per level."""

    def __init__(self, nodes: int, depth: int, width: int):
        from multispec.drafting.dynamic_tree import budget_tree

        super().__init__(budget_tree(nodes, depth), "head-dynamic")
        self.width = width

    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        return replace(super().plan_round(history, pending), width=self.width)


class LookupPolicy(DraftPolicyBase):
    """Prompt lookup on its own (transformers' `prompt_lookup_num_tokens`): every round, the tokens that followed
    the latest earlier match of the context's last n-gram (n = max_ngram..1), up to k of them; a plain target
    step when nothing matches."""

    def __init__(self, k: int, max_ngram: int = 3):
        self.k, self.max_ngram = k, max_ngram
        self.reset()

    def reset(self) -> None:
        from multispec.drafting.lookup import NgramIndex

        self.index = NgramIndex(self.max_ngram)

    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        tokens, _ = self.index.propose(history, self.k)
        if not tokens:
            return RoundPlan(Tree.chain(0), "none")
        return RoundPlan(Tree.chain(len(tokens)), "lookup", tuple(tokens))


class HeuristicK(FixedTree):
    """transformers' assisted-generation heuristic for a chain: k += 2 after a fully accepted round, else k -= 1
    (never below 1), starting from k."""

    def __init__(self, k: int, k_max: int = 64):
        self.k0, self.k_max = k, k_max
        self.reset()

    def reset(self) -> None:
        self.k = self.k0

    def round_tree(self) -> Tree:
        return Tree.chain(self.k)

    def observe(self, outcome: RoundOutcome) -> None:
        self.k = min(self.k + 2, self.k_max) if outcome.accepted == outcome.depth else max(1, self.k - 1)


class ThresholdStop(FixedTree):
    """SpecDec++ (design §7.6): chain drafting that stops once 1 - prod(predicted acceptance) > h, within
    [k_min, k_max]. `predict(hidden [n, H]) -> float [n]` is the acceptance head, fed the hidden state of the
    newest *consumed* draft token; the round's first forward consumes the verified root, which is skipped."""

    needs_hidden = True

    def __init__(self, predict: Callable[[torch.Tensor], torch.Tensor], threshold: float, k_min: int, k_max: int):
        super().__init__(Tree.chain(k_max))
        self.predict, self.h, self.k_min = predict, threshold, k_min
        self.cum = 1.0

    def start_round(self) -> None:
        self.cum = 1.0

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        if depth >= 2:  # parent is Y_{depth-1}, a draft token
            if parent_hidden is None:
                raise RuntimeError("ThresholdStop needs the draft's hidden states (needs_hidden), got None")
            self.cum *= float(self.predict(parent_hidden)[0])
        if depth < self.k_min:
            return True
        return (1.0 - self.cum) <= self.h


class AnyChainAbove(FixedTree):
    """P1 decision models (design §6.3): after each drafted level, stop when every chain's predicted acceptance of
    its newest token is below beta. `predict(parent_hidden [n, H], parent_q [n, V]) -> float [n]`."""

    needs_hidden = True

    def __init__(self, tree: Tree, predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], beta: float):
        super().__init__(tree)
        self.predict, self.beta = predict, beta

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        if parent_hidden is None:
            raise RuntimeError("AnyChainAbove needs the draft's hidden states (needs_hidden), got None")
        return bool((self.predict(parent_hidden, parent_q) >= self.beta).any())


def _child_probs(tree_parents_q: torch.Tensor, new_tokens: torch.Tensor) -> torch.Tensor:
    """float [n]: the draft probability of each newly drafted token under its parent's law. tree_parents_q:
    float [n, V], one row per new token (its parent's law)."""
    return tree_parents_q.gather(1, new_tokens[:, None]).squeeze(1)


class ConfidenceStop(FixedTree):
    """Training-free stopping (transformers' `assistant_confidence_threshold`): stop drafting once the draft's
    probability of the token it just drafted is below `threshold` — in a tree, once that holds for every newest
    token. Reads draft-side state only, so every lossless verifier stays lossless."""

    def __init__(self, tree: Tree, threshold: float):
        super().__init__(tree)
        self.threshold = threshold

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        if new_tokens is None:
            raise RuntimeError("ConfidenceStop reads the newest level's tokens, got None")
        return bool((_child_probs(_expand(parent_q, new_tokens), new_tokens) >= self.threshold).any())


class EntropyStop(FixedTree):
    """AdaEDL-style stopping (arXiv 2410.18351): the acceptance probability of the next draft token is bounded
    below by 1 - sqrt(gamma * H(q)) (H in nats, of the draft law the newest tokens were drawn from); stop once that
    bound is below `threshold` for every newest token. The static-threshold form of the rule: AdaEDL's online
    adjustment of the threshold is not used. Draft-side only, so lossless."""

    def __init__(self, tree: Tree, threshold: float, gamma: float = 1.0):
        super().__init__(tree)
        self.threshold, self.gamma = threshold, gamma

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        q = parent_q.clamp_min(1e-30)
        entropy = -(parent_q * q.log()).sum(-1)  # [n_parents]
        bound = 1.0 - (self.gamma * entropy).clamp_min(0).sqrt()
        return bool((bound >= self.threshold).any())


def _expand(parent_q: torch.Tensor, new_tokens: torch.Tensor) -> torch.Tensor:
    """Repeat each parent's law once per child when a level has several children per parent (children of one
    parent are contiguous and every parent of the level has the same count in the trees stopping rules use)."""
    per = max(1, new_tokens.shape[0] // max(1, parent_q.shape[0]))
    return parent_q.repeat_interleave(per, dim=0)[: new_tokens.shape[0]]

