"""The draft-policy protocol: what the engine asks of a policy each round, and what it tells it back.

One generation, as the engine drives it (decoding/engine.py):

    policy.reset()                               # adaptive state starts afresh (style §2.12)
    policy.prepare(target, draft, context_len, temperature)  # once, after the prefill (auto: costs, memory)
    every round:
        plan = policy.plan_round(history, pending)        # which tree, from which proposer
        policy.start_round()                              # then, while the draft grows the tree level by level:
        policy.keep_drafting(depth, hidden, q, tokens)    #   draft another level?
        ... the target verifies, the path is kept ...
        policy.observe(outcome)                           # the round's outcome, once
    policy.finish(history)                       # the generation is over: prompt + committed tokens
    policy.report()                              # extra stats for this generation, or None

A policy plans as if its sequence decoded alone: in a batch the engine weighs every sequence's plan against the
step's cost (decoding/batch_plan.py) and may answer a plan that carries `expected` with a plain step instead.

A policy reads draft-side state only (design §10.9): its decisions never depend on the target's accept coins of the
round being drafted, so every lossless verifier stays lossless whatever the policy decides.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from multispec.tree import Tree


@dataclass(frozen=True)
class RoundPlan:
    """What one round drafts. tree: the max tree (depth 0: no speculation, the target decodes one token).
    proposer: the registered proposer that drafts it (drafting/proposers.py): "draft" (the draft model grows
    `tree`), "lookup" (`tokens` copied from the context, a chain), "suffix" (`tokens` of a whole tree from suffix
    structures, node order, root excluded), "none", or any other registered one. tokens: what the policy already
    proposed (lookup, suffix: the root is not repeated). label: a short name for stats; predicted_tps: the
    planner's expected tokens/s (auto only); ngram: lookup's matched n-gram length. width: children per expanded
    node and nodes expanded per level of a dynamic tree ("head-dynamic", drafting/dynamic_tree.py).
    expected: the committed tokens the policy expects of the round (accepted + 1), size: the nodes it expects to
    verify, root included (a chain stopped token by token is planned up to `tree`'s depth but expected shorter);
    a plan with `expected` may be replaced by a plain step in a batch (decoding/batch_plan.py), one without never
    is."""

    tree: Tree
    proposer: str = "draft"
    tokens: tuple[int, ...] = ()
    label: str = ""
    predicted_tps: float | None = None
    ngram: int = 0
    width: int = 0
    expected: float | None = None
    size: int = 0


@dataclass(frozen=True)
class RoundTimes:
    """Seconds of one round's phases (the names Metrics reports as draft_s / verify_s / cache_s summed).
    draft_s: planning and proposing; target_fwd_s: the verification forward alone; verify_s: that forward and
    the verifier; cache_s: keeping the accepted path; round_s: all of it. pending: committed tokens the draft had
    not consumed when the round began. ahead: committed tokens the verification forward fed before the root (a
    grammar's forced tokens: its rows are the tree's and these). proposer: the proposer that drafted (after the
    round's budget cut). shared: the sequences the verification forward carried (> 1 in a batch: its time is the
    batch's, not this sequence's)."""

    round_s: float = 0.0
    draft_s: float = 0.0
    target_fwd_s: float = 0.0
    verify_s: float = 0.0
    cache_s: float = 0.0
    pending: int = 0
    ahead: int = 0
    proposer: str = "none"
    shared: int = 1


@dataclass(frozen=True)
class RoundOutcome:
    """One round, as the engine reports it to the policy and to the metrics.
    plan: the plan drafted (target-initialized rounds: the policy's tree as a plan). tree: the tree actually drafted
    (a truncation of the plan's). path: accepted node indices from the root (0, ...). committed: the token ids the
    round committed. accepted: draft tokens accepted. depth: the deepest drafted level of draft tokens.
    drafted: draft tokens sent to the target (target-drawn level-1 tokens excluded); draft_calls: draft forwards."""

    plan: RoundPlan
    tree: Tree
    path: tuple[int, ...]
    committed: list[int]
    accepted: int
    depth: int
    drafted: int = 0
    draft_calls: int = 0
    times: RoundTimes = field(default_factory=RoundTimes)


class DraftPolicy(Protocol):
    """See the module docstring for when each member is called."""

    needs_hidden: bool  # keep_drafting reads the draft's hidden states (the backend then returns them)
    defers_draft_prefill: bool  # the engine leaves the prompt pending: the first drafting round feeds it

    def reset(self) -> None: ...

    def prepare(self, target, draft, context_len: int, temperature: float = 0.0) -> None: ...

    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        """history: prompt + committed tokens; pending: committed tokens the draft has not consumed yet."""
        ...

    def start_round(self) -> None: ...

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        """After drafting level `depth` (>= 1): draft another? parent_hidden: float [n, H] draft hidden states at
        the parents of the newest level (None unless needs_hidden); parent_q: float [n, V] their laws;
        new_tokens: long [m] the newest level's tokens, children of those parents in node order."""
        ...

    def observe(self, outcome: RoundOutcome) -> None: ...

    def finish(self, history: list[int]) -> None: ...

    def observation(self) -> dict | None:
        """What the last generation observed for a new machine profile (decoding/profiles.updated), or None."""
        ...

    def use_profile(self, view) -> None:
        """Plan from this view of the machine profile (auto's AutoView; the Decoder builds it once)."""
        ...

    def report(self) -> dict | None: ...


class DraftPolicyBase:
    """Defaults for every member of DraftPolicy but plan_round: no state, draft the whole planned tree, nothing to
    report. Subclass it and override what the policy decides. defers_draft_prefill: the engine leaves the prompt
    pending instead of prefilling the draft, for a policy that may never draft (its first drafting round feeds
    it; `pending` counts it)."""

    defers_draft_prefill = False

    needs_hidden = False

    def observation(self) -> dict | None:
        return None

    def use_profile(self, view) -> None:
        pass

    def reset(self) -> None:
        pass

    def prepare(self, target, draft, context_len: int, temperature: float = 0.0) -> None:
        pass

    def plan_round(self, history: list[int], pending: int) -> RoundPlan:
        raise NotImplementedError

    def start_round(self) -> None:
        pass

    def keep_drafting(self, depth: int, parent_hidden: torch.Tensor | None, parent_q: torch.Tensor,
                      new_tokens: torch.Tensor | None = None) -> bool:
        return True

    def observe(self, outcome: RoundOutcome) -> None:
        pass

    def finish(self, history: list[int]) -> None:
        pass

    def report(self) -> dict | None:
        return None
