"""Draft policies: which tree to draft this round and when to stop growing it.

A policy reads draft-side state only (SPEC §10.9), so the stopping decision never depends on the target's accept
coins and every lossless verifier stays lossless. Adaptive state lives here and resets at the start of each
generation (STYLE §2.12).
"""
from __future__ import annotations

from typing import Callable

import torch

from multispec.tree import Tree


class FixedTree:
    """Draft the whole tree every round (sd with fixed k, mcsd, ti-mcsd)."""

    def __init__(self, tree: Tree):
        self.tree = tree

    def reset(self) -> None:
        pass

    def round_tree(self) -> Tree:
        return self.tree

    def start_round(self) -> None:
        pass

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor, parent_q: torch.Tensor) -> bool:
        return True

    def end_round(self, accepted: int, drafted: int) -> None:
        pass

    needs_hidden = False


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

    def end_round(self, accepted: int, drafted: int) -> None:
        self.k = min(self.k + 2, self.k_max) if accepted == drafted else max(1, self.k - 1)


class ThresholdStop(FixedTree):
    """SpecDec++ (SPEC §7.6): chain drafting that stops once 1 - prod(predicted acceptance) > h, within
    [k_min, k_max]. `predict(hidden [n, H]) -> float [n]` is the acceptance head, fed the hidden state of the
    newest *consumed* draft token; the round's first forward consumes the verified root, which is skipped."""

    needs_hidden = True

    def __init__(self, predict: Callable[[torch.Tensor], torch.Tensor], threshold: float, k_min: int, k_max: int):
        super().__init__(Tree.chain(k_max))
        self.predict, self.h, self.k_min = predict, threshold, k_min
        self.cum = 1.0

    def start_round(self) -> None:
        self.cum = 1.0

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor, parent_q: torch.Tensor) -> bool:
        if depth >= 2:  # parent is Y_{depth-1}, a draft token
            self.cum *= float(self.predict(parent_hidden)[0])
        if depth < self.k_min:
            return True
        return (1.0 - self.cum) <= self.h


class AnyChainAbove(FixedTree):
    """P1 decision models (SPEC §6.3): after each drafted level, stop when every chain's predicted acceptance of
    its newest token is below beta. `predict(parent_hidden [n, H], parent_q [n, V]) -> float [n]`."""

    needs_hidden = True

    def __init__(self, tree: Tree, predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], beta: float):
        super().__init__(tree)
        self.predict, self.beta = predict, beta

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor, parent_q: torch.Tensor) -> bool:
        return bool((self.predict(parent_hidden, parent_q) >= self.beta).any())
