"""Shared machinery of the node verifiers (design §4): plans, the sampler and the exact evaluator.

Every verifier is written as a *plan*. Conditional on reaching step s (all earlier steps rejected), step s
offers draft `index[s]` and accepts it iff `u * den[s] < num[s]` for a fresh uniform u (design §1.4, §1.6).
If every step rejects, the output is drawn from `residual`, with independent randomness. Given the drafts, the
state after k rejections is deterministic, so the whole plan is computed before any coin is thrown. The same
plan is then either

- sampled (`sample_plan`, the production path used by `VerifierSpec.verify`), or
- evaluated exactly (`evaluate_plan`: each coin is replaced by its probability and a reach probability is
  carried along), which is what the exact enumeration tests and `VerifierSpec.exact` use.

So the numbers checked by enumeration come from the code that samples. Notation: p is ALWAYS the target
distribution and q the draft distribution, both already processed (design §1).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import torch

from multispec.errors import check
from multispec.sampling import sample_rows

EPS = 1e-12  # residual mass below this: sample from the current target instead (design §1.5)


@dataclass(frozen=True)
class NodeResult:
    """Outcome of one node verification, batched over B rows.

    token: long [B], the output token (an accepted draft or a new token).
    accepted: long [B], index 0..n-1 of the accepted draft, or -1 when `token` is new.
    """

    token: torch.Tensor
    accepted: torch.Tensor


@dataclass(frozen=True)
class Plan:
    """A verifier's decisions for B rows of drafts, before any coin is thrown.

    index: S draft indices (0..n-1), the draft offered at each step, same for every row.
    num, den: float [B, S]; step s accepts iff u * den < num (probability min(1, num/den); num > 0 when den = 0).
        A step that does not apply to a row has num = 0.
    residual: float [B, V], rows sum to 1: the law of the new token when every step rejects.
    route: if True, a residual token equal to a draft counts as accepting the first draft with that token
        (greedy-md, design §4.6).
    """

    index: tuple[int, ...]
    num: torch.Tensor
    den: torch.Tensor
    residual: torch.Tensor
    route: bool = False


@dataclass(frozen=True)
class NodeLaw:
    """Exact law of a node verification, batched over B rows.

    accept: float [B, n], probability that draft j is accepted (routing included when the plan routes).
    residual: float [B, V], probability that the output is token y and is new.
    """

    accept: torch.Tensor
    residual: torch.Tensor

    def output(self, drafts: torch.Tensor) -> torch.Tensor:
        """float [B, V]: the law of the output token. drafts: long [B, n]."""
        return self.residual.scatter_add(1, drafts, self.accept)

    @property
    def acceptance(self) -> torch.Tensor:
        """float [B]: probability that the output token is one of the drafts (as the verifier reports it)."""
        return self.accept.sum(-1)


# ----------------------------------------------------------------------------------- small helpers
def gather(v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """v: [B, V], idx: long [B] -> v[b, idx[b]], shape [B]."""
    return v.gather(1, idx[:, None]).squeeze(1)


def normalize_or(v: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows of v [B, V] divided by their sums; rows with mass <= EPS are replaced by `fallback` [B, V]."""
    mass = v.sum(-1, keepdim=True)  # [B, 1]
    ok = mass > EPS
    return torch.where(ok, v / torch.where(ok, mass, torch.ones_like(mass)), fallback)


def accept_probability(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """P(u * den < num) for u ~ U[0, 1): min(1, num/den) when den > 0, else 1 if num > 0 else 0.

    num, den: float, same shape (e.g. [B, S]). Returns float of that shape.
    """
    pos = den > 0
    ratio = (num / torch.where(pos, den, torch.ones_like(den))).clamp(0, 1)
    return torch.where(pos, ratio, (num > 0).to(num.dtype))


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """mask: bool [B, K] -> long [B], index of the first True, or K when none."""
    k = mask.shape[1]
    ar = torch.arange(k, device=mask.device).expand_as(mask)
    return torch.where(mask, ar, torch.full_like(ar, k)).amin(-1) if k else torch.zeros(
        mask.shape[0], dtype=torch.long, device=mask.device)


def top_tokens(q: torch.Tensor, k: int) -> torch.Tensor:
    """long [B, k]: the k most probable tokens of q [B, V], ties broken towards the lowest index."""
    check(k <= q.shape[-1], f"cannot take {k} distinct drafts from a vocabulary of {q.shape[-1]} tokens")
    if k == 1:  # argmax returns the first maximum: the same tie-break, without sorting the whole vocabulary
        return q.argmax(-1, keepdim=True)
    # only the tokens at or above each row's k-th largest value are sorted (stable: ties keep index order)
    kth = torch.topk(q, k, dim=-1).values[:, -1:]  # [B, 1]
    rows = []
    for row, t in zip(q, kth):
        idx = torch.nonzero(row >= t).flatten()  # ascending ids, >= k of them
        rows.append(idx[torch.sort(row[idx], descending=True, stable=True).indices[:k]])
    return torch.stack(rows) if rows else torch.zeros(0, k, dtype=torch.long, device=q.device)


# ----------------------------------------------------------------------------------- sample / evaluate
def sample_plan(plan: Plan, drafts: torch.Tensor, generator: torch.Generator | None) -> NodeResult:
    """Run a plan with fresh coins (one uniform per step) and an independent residual draw.

    drafts: long [B, n]. Returns NodeResult with token, accepted long [B].
    """
    b = drafts.shape[0]
    steps = len(plan.index)
    accepted = torch.full((b,), -1, dtype=torch.long, device=drafts.device)
    if steps:
        coins = torch.rand(b, steps, generator=generator, dtype=plan.num.dtype, device=plan.num.device)  # [B, S]
        first = _first_true(coins * plan.den < plan.num)  # [B], S when every step rejects
        step_draft = torch.tensor(plan.index + (-1,), dtype=torch.long, device=drafts.device)
        accepted = step_draft[first]
    residual_token = sample_rows(plan.residual, 1, generator)[:, 0]  # [B]
    if plan.route:
        match = _first_true(drafts == residual_token[:, None])  # [B], n when no draft matches
        routed = torch.where(match < drafts.shape[1], match, torch.full_like(match, -1))
        accepted = torch.where(accepted >= 0, accepted, routed)
    token = torch.where(accepted >= 0, gather(drafts, accepted.clamp_min(0)), residual_token)
    return NodeResult(token=token, accepted=accepted)


def evaluate_plan(plan: Plan, drafts: torch.Tensor) -> NodeLaw:
    """Exact law of `sample_plan(plan, drafts, ·)`: coins replaced by their accept probabilities.

    drafts: long [B, n]. Returns NodeLaw (accept float [B, n], residual float [B, V]).
    """
    probs = accept_probability(plan.num, plan.den)  # [B, S]
    accept = torch.zeros(drafts.shape, dtype=plan.residual.dtype, device=drafts.device)
    reach = torch.ones(drafts.shape[0], dtype=plan.residual.dtype, device=drafts.device)
    for s, j in enumerate(plan.index):
        accept[:, j] += reach * probs[:, s]
        reach = reach * (1 - probs[:, s])
    residual = reach[:, None] * plan.residual  # [B, V]
    if plan.route:
        for j in range(drafts.shape[1]):  # after zeroing, a duplicate later draft gathers 0
            accept[:, j] += gather(residual, drafts[:, j])
            residual = residual.scatter(1, drafts[:, j : j + 1], 0.0)
    return NodeLaw(accept=accept, residual=residual)


# ----------------------------------------------------------------------------------- i.i.d. draft law
def draw_iid(q: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """n i.i.d. drafts per row. q: float [B, V]. Returns long [B, n]."""
    return sample_rows(q, n, generator)


def law_iid(q: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact i.i.d. draft law for one q: float [V]. Returns drafts long [M, n] and weights float [M]
    (tuples of tokens in the support of q only)."""
    q = q / q.sum()
    support = torch.nonzero(q > 0).flatten().tolist()
    tuples = torch.tensor(list(itertools.product(support, repeat=n)), dtype=torch.long)  # [M, n]
    return tuples, q[tuples].prod(-1)


DrawFn = Callable[[torch.Tensor, int, "torch.Generator | None"], torch.Tensor]
PlanFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Plan]
LawFn = Callable[[torch.Tensor, int], "tuple[torch.Tensor, torch.Tensor]"]


# ----------------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class VerifierSpec:
    """A node verifier and the draft law it needs.

    drafts: the number of drafts per node it supports (an int) or "any".
    draw_fn(q [B, V], n, generator) -> long [B, n]: the draft law.
    plan_fn(p [B, V], q [B, V], drafts [B, n]) -> Plan: the verification (p target, q draft).
    law_fn(q [V], n) -> (drafts long [M, n], weights float [M]): the draft law, enumerated exactly.
    """

    name: str
    description: str
    lossless: bool
    drafts: int | str
    draw_fn: DrawFn
    plan_fn: PlanFn
    law_fn: LawFn
    draft_law: str = ""

    def check_drafts(self, n: int) -> None:
        """Raise MultispecError unless this verifier supports n drafts per node."""
        check(isinstance(n, int) and not isinstance(n, bool) and n >= 1,
              f"verifier {self.name!r}: the number of drafts must be an integer >= 1, got {n!r}")
        if self.drafts != "any":
            check(n == self.drafts,
                  f"verifier {self.name!r} supports exactly {self.drafts} draft(s) per node, got {n}")

    def draw(self, q: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
        """Draft n tokens per row from q: float [B, V] with this verifier's draft law. Returns long [B, n]."""
        self.check_drafts(n)
        check(q.dim() == 2, f"q must be [B, V], got shape {tuple(q.shape)}")
        return self.draw_fn(q, n, generator)

    def plan(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> Plan:
        """p: target float [B, V]; q: draft float [B, V]; drafts: long [B, n]. Returns the Plan."""
        self.check_inputs(p, q, drafts)
        return self.plan_fn(p, q, drafts)

    def check_inputs(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> None:
        """MultispecError unless p, q are [B, V] alike and drafts [B, n] with n drafts supported."""
        check(p.dim() == 2 and p.shape == q.shape,
              f"p (target) and q (draft) must both be [B, V], got {tuple(p.shape)} and {tuple(q.shape)}")
        check(drafts.dim() == 2 and drafts.shape[0] == p.shape[0],
              f"drafts must be [B, n] with B = {p.shape[0]}, got {tuple(drafts.shape)}")
        self.check_drafts(drafts.shape[1])

    def verify(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
               generator: torch.Generator | None) -> NodeResult:
        """Verify drafts [B, n] (long) drawn with `draw` from q. p: target float [B, V]; q: draft float [B, V].

        Returns NodeResult (token, accepted: long [B]). All randomness comes from `generator`.
        """
        return sample_plan(self.plan(p, q, drafts), drafts, generator)

    def law(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> NodeLaw:
        """Exact law of `verify` for fixed drafts (coins -> probabilities). Shapes as in `verify`."""
        return evaluate_plan(self.plan(p, q, drafts), drafts)

    def exact(self, p: torch.Tensor, q: torch.Tensor, n: int) -> tuple[torch.Tensor, float]:
        """Exact output law and acceptance at one position, the draft law enumerated.

        p: target float [V]; q: draft float [V] (use float64 for exactness). Returns (out float [V], acceptance).
        """
        self.check_drafts(n)
        drafts, weights = self.law_fn(q, n)  # [M, n], [M]
        keep = weights > 0
        drafts, weights = drafts[keep], weights[keep].to(p.dtype)
        m = drafts.shape[0]
        node = self.law(p.expand(m, -1), q.expand(m, -1), drafts)
        out = (weights[:, None] * node.output(drafts)).sum(0)
        return out, float((weights * node.acceptance).sum())

    def describe(self) -> dict:
        """{'name', 'lossless', 'drafts', 'description'} for the CLI."""
        return {"name": self.name, "lossless": self.lossless, "drafts": self.drafts,
                "description": self.description}
