"""Proposers: where a round's draft tokens come from. One class per source; the engine calls
`PROPOSERS[plan.proposer].propose(inputs, plan, max_tree)` and never names one.

    policy.plan_round(...) ─► RoundPlan(tree, proposer="lookup", tokens=...)      a policy only chooses
    get_proposer(plan.proposer).propose(RoundInputs, plan, max_tree) ─► Proposal  tokens [N], q [N, V] or None
    engine: target.forward(proposal.tokens, ...) ─► verify ─► keep                 decoding/engine.py

A proposal is a BFS prefix of the round's max tree (`max_tree`, already cut to the round's budget): its positions
and its tree mask are sliced from the max tree's one mask (design §3.5). `q[u]` is the law node u's children were
drawn from: what every lossless verifier needs. A deterministic source (lookup, suffix, any rule without a draft
model) proposes point masses; the verifier then accepts child x with probability p(x) and otherwise draws from p
with x removed, which is exact. Greedy runs never read q, so a proposer may leave it None there.

The built-in proposers are listed in ALL_PROPOSERS. A new one is one class with `name` and `propose`, registered
with `register_proposer`, plus a method entry whose policy plans with its name (tests/test_proposers.py does this
for "repeat the last token").
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol

import torch

from multispec.drafting.dynamic_tree import grow_dynamic
from multispec.drafting.grow import DrawFn, StopPolicy, grow_steps
from multispec.drafting.lookup import one_hot_law
from multispec.drafting.protocol import RoundPlan
from multispec.drafting.suffix import first_child_law
from multispec.errors import MultispecError, check
from multispec.models.base import Backend, Steps, drive
from multispec.sampling import SamplingConfig
from multispec.tree import Tree
from multispec.verify.keyed import node_keys


@dataclass(frozen=True)
class RoundInputs:
    """What a proposer may read in one round (built by the engine; never mutated by a proposer).

    history: prompt + committed tokens, oldest first. pending: committed tokens the draft model has not consumed;
    pending[-1] is the root (node 0, the newest committed token, not yet in the target's cache).
    root_position: the root's position (= the target's cache_len). vocab: the width of q (the target's rows).
    draft: the draft model's backend, or None. draw(q [B, V], n, generator) -> long [B, n]: the verifier's draft
    law. key: the seed of a keyed verifier (gls): drafts are then coupled to the noise of their positions.
    node_history(tree) -> history(rows, tokens, logits) | None: the processors' history of a node's path
    (penalties, min_tokens), None when the sampling reads none."""

    history: list[int]
    pending: list[int]
    root_position: int
    vocab: int
    sampling: SamplingConfig
    draft: Backend | None
    draw: DrawFn
    generator: torch.Generator
    policy: StopPolicy
    key: int | None
    node_history: Callable[[Tree], Callable | None]


@dataclass(frozen=True)
class Proposal:
    """One round's draft. tree: the drafted topology, the first len(tree) nodes of max_tree.
    tokens: long [N], tokens[0] the root. q: float [N, V] the law each node's children came from (zero rows at
    leaves), or None in greedy runs. draft_fed: nodes the draft model consumed (a BFS prefix from the root; 0: it
    consumed nothing, and the committed tokens stay pending for it). draft_root: the draft-cache row of node 0.
    draft_calls: draft forwards spent. verifier: the sequence verifier this proposal needs instead of the run's
    (None: the run's); a keyed (reproducible) run keeps its own."""

    tree: Tree
    max_tree: Tree
    tokens: torch.Tensor
    q: torch.Tensor | None
    draft_fed: int = 0
    draft_root: int | None = None
    draft_calls: int = 0
    verifier: str | None = None

    @property
    def drafted(self) -> int:
        """Draft tokens sent to the target (the root excluded)."""
        return len(self.tree) - 1


class Proposer(Protocol):
    name: str  # the key a RoundPlan names it by

    def propose(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Proposal: ...


def proposal_steps(proposer: Proposer, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Steps[Proposal]:
    """The proposal as a generator of its draft forwards (models/base.Steps), which the engine runs with the other
    sequences' forwards of the same depth: a proposer's own `propose_steps` where it has one (the draft model's),
    else its `propose` (no forward, or forwards it makes itself, run alone)."""
    steps = getattr(proposer, "propose_steps", None)
    if steps is not None:
        return (yield from steps(inputs, plan, max_tree))
    return proposer.propose(inputs, plan, max_tree)


def _root_only(inputs: RoundInputs, max_tree: Tree) -> Proposal:
    return Proposal(max_tree.truncate(0), max_tree, torch.tensor(inputs.pending[-1:], dtype=torch.long), None)


def point_mass_chain(inputs: RoundInputs, chain: list[int]) -> Proposal:
    """A chain of deterministic tokens after the root; q: a point mass on each node's child. Verified by `naive`
    (one draw from p per visited node): on point masses it has the law of every optimal verifier (block,
    traversal, rrs-wor; tests/test_verifiers_sequence.py), at a fraction of their cost."""
    if not chain:
        return _root_only(inputs, Tree.chain(0))
    tree = Tree.chain(len(chain))
    tokens = torch.tensor(inputs.pending[-1:] + list(chain), dtype=torch.long)  # [N]
    q = None if inputs.sampling.greedy else one_hot_law(tokens, inputs.vocab, len(tokens))
    return Proposal(tree, tree, tokens, q, verifier="naive")


class NoProposer:
    """No speculation: the root alone, one plain target step."""

    name = "none"

    def propose(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Proposal:
        return _root_only(inputs, max_tree)


class LookupProposer:
    """A chain copied from the context (prompt lookup): the plan's tokens (the policy matched them, drafting/
    lookup.py), cut to the round's depth."""

    name = "lookup"
    deterministic = True  # its q: point masses read off the tree (decoding/grammar.without_refused rebuilds them)

    def propose(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Proposal:
        return point_mass_chain(inputs, list(plan.tokens[:max_tree.max_depth]))


class SuffixTreeProposer:
    """A tree from suffix tries (drafting/suffix.py): the plan's tokens in node order, root excluded. Deterministic
    distinct siblings (q: first-child point masses, the rrs-wor walk's law), verified by `naive`, which reaches
    sibling i with probability p(token i), the most any lossless verifier gives such a tree (as rrs-wor does)."""

    name = "suffix"
    deterministic = True

    def propose(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Proposal:
        # the round's cut keeps whole levels of the BFS tree: a prefix of the plan's nodes, tokens still aligned
        tokens = torch.tensor(inputs.pending[-1:] + list(plan.tokens[:len(max_tree) - 1]), dtype=torch.long)
        q = None if inputs.sampling.greedy else first_child_law(max_tree, tokens, inputs.vocab)
        return Proposal(max_tree, max_tree, tokens, q, verifier="naive")


class DraftModelProposer:
    """The draft model grows the max tree level by level (drafting/grow.py), the policy may stop it early. It first
    feeds the pending tokens, so it consumes them; a keyed run couples each draw to its position's noise."""

    name = "draft"
    uses_draft = True  # drafts with the run's draft backend (a reduced vocabulary grows before it does)

    def propose(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Proposal:
        return drive(self.propose_steps(inputs, plan, max_tree))

    def propose_steps(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Steps[Proposal]:
        draft = inputs.draft
        if draft is None:
            raise MultispecError("this round drafts with the draft model, but the pair has none")
        keys = node_keys(max_tree, inputs.key, inputs.root_position) if inputs.key is not None else None
        d = yield from grow_steps(draft, inputs.pending, max_tree, [], 0, inputs.sampling, inputs.draw,
                                  inputs.generator, inputs.policy, keys=keys, history=inputs.node_history(max_tree))
        return Proposal(d.tree, max_tree, d.tokens, d.q, draft_fed=d.fed, draft_root=d.root_index,
                        draft_calls=d.draft_calls)


class HeadProposer(DraftModelProposer):
    """A feature head (models/eagle.py) drafts as a draft model does, but keeps only its rows up to the root: the
    accepted nodes it read its own features for are fed again next round with the target's (EAGLE's way; both are
    exact, the target's features make better drafts)."""

    name = "head"

    def propose_steps(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Steps[Proposal]:
        proposal = yield from super().propose_steps(inputs, plan, max_tree)
        return replace(proposal, draft_fed=min(proposal.draft_fed, 1))


class DynamicHeadProposer(HeadProposer):
    """EAGLE-2's dynamic tree (drafting/dynamic_tree.py): the head grows the round's tree by its own path
    probabilities; the plan's max tree is the budget (node count and depth), RoundPlan.width the children per
    expanded node and nodes expanded per level. The tokens are the head's top ones, so q is the point mass on each
    node's first child, verified by the rrs-wor walk (greedy runs: argmax)."""

    name = "head-dynamic"

    def propose_steps(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Steps[Proposal]:
        if inputs.key is not None or inputs.node_history(max_tree) is not None:
            # the static tree: keyed draws, per-path processors
            return (yield from super().propose_steps(inputs, plan, max_tree))
        return self.propose(inputs, plan, max_tree)  # its forwards, run alone

    def propose(self, inputs: RoundInputs, plan: RoundPlan, max_tree: Tree) -> Proposal:
        if inputs.key is not None or inputs.node_history(max_tree) is not None:
            return drive(super().propose_steps(inputs, plan, max_tree))
        if inputs.draft is None:
            raise MultispecError("a dynamic tree drafts with a head, but this run has none")
        tree, tokens, root, calls = grow_dynamic(inputs.draft, inputs.pending, max_tree, max(1, plan.width),
                                                 inputs.sampling)
        q_law = None if inputs.sampling.greedy else first_child_law(tree, tokens, inputs.vocab)
        return Proposal(tree, tree, tokens, q_law, draft_fed=1, draft_root=root, draft_calls=calls,
                        verifier=None if inputs.sampling.greedy else "rrs-wor")


ALL_PROPOSERS: tuple[Proposer, ...] = (NoProposer(), LookupProposer(), SuffixTreeProposer(), DraftModelProposer(),
                                       HeadProposer(), DynamicHeadProposer())
PROPOSERS: dict[str, Proposer] = {p.name: p for p in ALL_PROPOSERS}


def register_proposer(proposer: Proposer, replace: bool = False) -> Proposer:
    """Make a user's `proposer` available to plans under its name (a policy plans with RoundPlan(tree,
    proposer=name))."""
    check(replace or proposer.name not in PROPOSERS, f"proposer {proposer.name!r} is already registered")
    PROPOSERS[proposer.name] = proposer
    return proposer


def unregister_proposer(name: str) -> None:
    PROPOSERS.pop(name, None)


def get_proposer(name: str) -> Proposer:
    check(name in PROPOSERS, f"unknown proposer {name!r}; registered: {', '.join(PROPOSERS)}")
    return PROPOSERS[name]
