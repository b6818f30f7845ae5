"""One sequence's generation as a generator of forward requests (the engine runs it: decoding/engine.py).

One round of one sequence = plan -> propose -> verify forward -> verify -> keep -> observe:

    policy.plan_round(history, pending) ─► RoundPlan(tree, proposer)       drafting/protocol.py (a policy chooses)
        ▼ (a plan with `expected`: PlanAsk to the engine, which may answer PLAIN: decoding/batch_plan.py)
    proposal_steps(get_proposer(plan.proposer), inputs, plan, max_tree) ─► Proposal: tokens [N], q [N, V]
        │                                                                 drafting/proposers.py (one class a source)
        ▼
    Forward(target, tokens, positions, tree mask) ─► logits [N, V]       models/ (the one cache owner)
        ▼
    verifier.verify(tree, tokens, p, q, generator) ─► (path, next token)  verify/ (pure; `choose_verifier`)
        ▼
    keep_path(target / draft, tree, path) ─► both caches hold prompt + committed tokens
        ▼
    RoundOutcome ─► policy.observe(outcome), Metrics.count(outcome)       decoding/metrics.py

`generation(s)` is sequence s from its prefill to its end: it yields each forward it needs as a value
(models/base.Forward) and gets its ForwardOut back, and yields None when its turn of the engine's step is over
(after each round; between prefill chunks on a batched cache). Proposers with draft forwards take part through
`proposal_steps` (the draft model's levels); forwards a method makes itself run alone on its backend.

Two round shapes share the loop: draft-initialized (`_round` here: ar, sd, mcsd, dynamic, specdecpp, lookup,
suffix, auto — the root is the newest committed token, which the target has not consumed; the walk commits the
accepted path plus one bonus/residual token) and target-initialized (decoding/ti_round.py: ti-mcsd and dynamic with
target_init, the one lossy shape, P1's longest accepted chain). Only `models/` touches caches (style §2.4).

History-dependent processors (penalties, min_tokens, a grammar's mask) give every tree node its own processed law:
node u's row is processed with the committed history plus u's own path (decoding/node_history.py, structured.py), in
verification and in drafting. Tokens a grammar forces (the one token it allows) are committed between rounds
without a target call (`_commit_forced`) and fed ahead of the next root in the next verification forward.
Log-probabilities (decoding/logprobs.py) are read from the verification forward that committed each token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from multispec.decoding.batch_plan import PLAIN, PlanAsk, Realised
from multispec.decoding.grammar import without_refused
from multispec.decoding.logprobs import LogprobRecorder
from multispec.decoding.metrics import Metrics
from multispec.decoding.node_history import CommittedHistory
from multispec.decoding.state import (Run, State, cap_tree, chain_steps, choose_verifier, cut,
                                      keep_path, prefill, round_limit)
from multispec.decoding.round_verify import verify_round
from multispec.decoding.ti_round import ti_round
from multispec.drafting.proposers import Proposal, RoundInputs, get_proposer, proposal_steps
from multispec.drafting.protocol import RoundOutcome, RoundTimes
from multispec.errors import check
from multispec.models.base import Backend, Forward, ForwardOut, Steps, has_vocab_subset


class Cancelled(Exception):
    """A sequence's error once it is cancelled (`Engine.cancel`): it stopped between rounds, its tokens so far kept."""


@dataclass(eq=False)
class Sequence:
    """One generation in an engine: its fixed parts (`run`), what it was asked, and what it has committed so far
    (`new`, before the final cut). done: it ended (finished, failed or cancelled); error: why it failed."""

    id: int
    run: Run
    prompt: list[int]
    max_new_tokens: int
    eos_ids: set[int]
    stop: Callable | None
    on_tokens: Callable | None
    logprobs: LogprobRecorder | None
    new: list[int] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    result: tuple[list[int], Metrics] | None = None
    error: BaseException | None = None
    done: bool = False
    steps: Steps | None = None
    plain: int = 0  # rounds left to take plainly without asking the policy (the engine's batch plan: batch_plan.py)
    backoff: int = 0  # the length of the latest such run
    realised: Realised = field(default_factory=Realised)  # what its kept plans delivered (the batch plan's)


def generation(s: Sequence) -> Steps[tuple[list[int], Metrics]]:
    """Sequence s from its prefill to its end, one round per engine step (see the module docstring)."""
    run, c, new, logprobs = s.run, s.metrics, s.new, s.logprobs
    max_new_tokens, eos_ids, stop, on_tokens = s.max_new_tokens, s.eos_ids, s.stop, s.on_tokens
    method, target = run.method, run.target
    start = time.perf_counter()
    state = yield from _start(run, s.prompt, eos_ids, logprobs)
    c.t_prefill = time.perf_counter() - start
    jump = _jumps(run, logprobs)
    if jump:  # tokens the grammar forces before the first round
        _commit_forced(run, state, new, c, max_new_tokens)
    end = cut(new, max_new_tokens, eos_ids, stop)
    while end is None:
        yield None  # one round per step
        limit = round_limit(target, max_new_tokens - len(new), method.target_init, len(state.ahead))
        if limit is None:  # the context is full: nothing more can be decoded
            break
        if method.target_init:
            _grow_draft_vocab(run, state, new)
            outcome = ti_round(run, state, limit)
        else:
            plain = s.plain > 0
            s.plain -= plain
            outcome = yield from _round(run, state, limit, new, plain)
        run.policy.observe(outcome)
        c.count(outcome)
        new.extend(outcome.committed)
        state.history.extend(outcome.committed)
        if state.committed is not None:
            state.committed.commit(outcome.committed)
            if jump:
                _commit_forced(run, state, new, c, max_new_tokens)
        end = cut(new, max_new_tokens, eos_ids, stop)
        if end is None and on_tokens is not None:
            on_tokens(new)
    out = new
    if end is not None:
        out, c.finish_reason = new[:end[0]], end[1]
    if on_tokens is not None:
        on_tokens(out)
    run.policy.finish(state.history)
    if logprobs is not None:
        del logprobs.tokens[len(out):]
    c.new_tokens = len(out)
    c.seconds = time.perf_counter() - start
    return out, c


def make_run(target, draft, method, sampling, seed, policy, reproducible) -> Run:
    seed = 0 if seed is None else seed
    if policy is None:
        from multispec.decoding.methods import build_policy

        policy = build_policy(method)
    keyed = reproducible and not sampling.greedy
    check(not (keyed and method.target_init), f"method {method.name!r} draws level 1 from the target (P1's longest "
                                              "chain): it has no reproducible mode; use sd, mcsd, dynamic, lookup, "
                                              "suffix or auto")
    return Run(target, draft, method, sampling, policy, choose_verifier(method, sampling, keyed),
               torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1_000_003),
               seed if keyed else None)


def _start(run: Run, prompt: list[int], eos_ids: set[int], logprobs: LogprobRecorder | None) -> Steps[State]:
    """Reset both models and the policy, prefill. A policy that may never draft (auto) defers the draft's prefill
    to its first drafting round: the prompt then stays pending, and that round's first draft forward feeds it."""
    target, draft = run.target, run.draft
    run.policy.reset()
    target.reset()
    defer = draft is not None and run.policy.defers_draft_prefill and not run.method.target_init
    if draft is not None:
        draft.reset()
        if len(prompt) > 1 and not defer:
            yield from chain_steps(draft, torch.tensor(prompt[:-1], dtype=torch.long), last_only=True)
    committed = None
    if run.sampling.reads_history:
        vocab = max(target.vocab_size, draft.vocab_size if draft is not None else 0)
        committed = CommittedHistory(prompt, vocab, eos_ids, run.sampling.grammar, run.sampling.penalised)
    state = yield from prefill(target, prompt, run.method.target_init, run.sampling, logprobs, committed)
    if defer:
        state.pending = list(prompt)
    run.policy.prepare(target, draft, target.cache_len, run.sampling.temperature)
    return state


def _round(run: Run, state: State, limit: tuple[int, int], new: list[int], plain: bool) -> Steps[RoundOutcome]:
    """One draft-initialized round, as named steps. new: the output so far; plain: a plain step, the policy not
    asked (the engine's batch plan). A plan that says what it expects goes to the engine first (PlanAsk), which
    answers with the plan to run (in a batch it may be PLAIN)."""
    t0 = time.perf_counter()
    if plain:
        plan = PLAIN
    else:
        plan = run.policy.plan_round(state.history, len(state.pending))
        if plan.expected is not None and plan.tree.max_depth > 0:
            # the engine answers a PlanAsk with the plan to run, not a ForwardOut
            plan = yield PlanAsk(plan, len(state.pending))  # type: ignore[misc,assignment]
    max_tree = cap_tree(plan.tree, limit)
    proposer = get_proposer(plan.proposer if max_tree.max_depth > 0 else "none")
    if getattr(proposer, "uses_draft", False):
        _grow_draft_vocab(run, state, new)
    n_pending, n_ahead = len(state.pending), len(state.ahead)
    lt = run.target.cache_len + n_ahead  # the root's position
    proposal = yield from proposal_steps(proposer, _inputs(run, state, lt), plan, max_tree)
    if getattr(proposer, "deterministic", False) and len(proposal.tree) > 1 and state.committed is not None \
            and state.committed.grammar is not None:  # lookup, suffix: drop what the grammar refuses
        proposal = without_refused(proposal, state.committed.grammar)
    t1 = time.perf_counter()
    out = yield from _verify_forward(run.target, proposal, lt, state.ahead)
    state.ahead = []
    t_fwd = time.perf_counter() - t1
    path, nxt = yield from verify_round(run, state, proposal, out, lt)
    t2 = time.perf_counter()
    tok = proposal.tokens.tolist()
    keep_path(run.target, proposal.tree, path, lt)
    state.pending = _pending_after(run, state, proposal, path, tok, nxt)
    t3 = time.perf_counter()
    times = RoundTimes(round_s=t3 - t0, draft_s=t1 - t0, target_fwd_s=t_fwd, verify_s=t2 - t1, cache_s=t3 - t2,
                       pending=n_pending, ahead=n_ahead, proposer=proposer.name, shared=out.shared)
    return RoundOutcome(plan=plan, tree=proposal.tree, path=tuple(path), committed=[tok[u] for u in path[1:]] + [nxt],
                        accepted=len(path) - 1, depth=proposal.tree.max_depth, drafted=proposal.drafted,
                        draft_calls=proposal.draft_calls, times=times)


def _inputs(run: Run, state: State, lt: int) -> RoundInputs:
    return RoundInputs(history=state.history, pending=state.pending, root_position=lt, vocab=run.target.vocab_size,
                       sampling=run.sampling, draft=run.draft, draw=run.verifier.draw, generator=run.gen_draft,
                       policy=run.policy, key=run.key, node_history=state.draft_history)


def _verify_forward(target: Backend, proposal: Proposal, lt: int, ahead: list[int]) -> Steps[ForwardOut]:
    """The target scores [root, tree] in one call: positions and mask sliced from the max tree (N_d nodes). ahead:
    committed tokens before the root the target has not consumed (a grammar's forced tokens), fed first as a chain
    in the same call; their rows are dropped from the output."""
    n, k = len(proposal.tree), len(ahead)
    tokens, positions = proposal.tokens, proposal.max_tree.position_ids(lt)[:n]
    mask = proposal.max_tree.attention_mask(lt, rows=range(n), cols=n)
    if not k:
        return (yield Forward(target, tokens, positions, mask))
    chain = torch.ones(k, lt + n, dtype=torch.bool)  # ahead token i reads the cache and ahead tokens 0..i
    chain[:, lt - k:] = False
    chain[:, lt - k:lt] = torch.ones(k, k, dtype=torch.bool).tril()
    out = yield Forward(target, torch.cat([torch.tensor(ahead, dtype=torch.long), tokens.to(torch.long)]),
                        torch.cat([torch.arange(lt - k, lt), positions]), torch.cat([chain, mask]))
    return ForwardOut(logits=out.logits[k:], hidden=None if out.hidden is None else out.hidden[k:],
                      argmax=None if out.argmax is None else out.argmax[k:], shared=out.shared)


def _grow_draft_vocab(run: Run, state: State, new: list[int]) -> None:
    """A reduced draft vocabulary takes in the output's tokens before the draft next drafts (between rounds: q is the
    law the drafts came from), all since its last drafting round at once: rounds that do not draft pay nothing."""
    if run.draft is not None and has_vocab_subset(run.draft) and state.vocab_seen < len(new):
        run.draft.extend_vocab_subset(new[state.vocab_seen:])
        state.vocab_seen = len(new)


def _jumps(run: Run, logprobs) -> bool:
    """Whether a grammar's forced tokens are committed without a target call (jump-forward): not in
    target-initialized rounds (their root is already in the target's cache), not when logprobs are recorded (each
    token's row comes from the forward that committed it). A feature head reads its own features for the forced
    tokens the target has not seen yet (HeadBackend.forward feeds them one at a time)."""
    return run.sampling.grammar is not None and not run.method.target_init and logprobs is None


def _commit_forced(run: Run, state: State, new: list[int], c: Metrics, max_new_tokens: int) -> None:
    """Commit what the grammar forces after the committed text: each has probability 1 under the constrained law.
    The target consumes them in its next forward (state.ahead), the draft as pending tokens."""
    if state.committed is None:  # a grammar always reads the history; kept for a caller without one
        return
    forced = state.committed.forced(max_new_tokens - len(new))
    if not forced:
        return
    new.extend(forced)
    state.history.extend(forced)
    state.ahead.extend(state.pending[-1:] + forced[:-1])  # the old root and all but the last forced token
    state.pending = state.pending + forced if run.draft is not None else [forced[-1]]
    c.forced_tokens += len(forced)


def _pending_after(run: Run, state: State, proposal: Proposal, path: list[int], tok: list[int],
                   nxt: int) -> list[int]:
    """What the draft has yet to consume after this round: what it was not fed of the accepted path, and nxt.
    A proposal that fed the draft keeps the draft's rows of the accepted path it consumed."""
    if proposal.draft_fed:
        draft, draft_root = run.draft, proposal.draft_root
        if draft is None or draft_root is None:  # a proposal that fed the draft model says where its rows start
            raise RuntimeError("a proposal fed a draft model the run does not have, or gave no draft_root")
        keep_path(draft, proposal.tree, [u for u in path if u < proposal.draft_fed], draft_root)
        return [tok[u] for u in path if u >= proposal.draft_fed] + [nxt]
    if run.draft is not None:  # the draft consumed nothing this round: it catches up when it next drafts
        pending = state.pending  # grown in place: a sequence that never drafts keeps its whole context pending,
        del pending[-1:]  # and a copy a round cost O(context) (auto's plain steps in a batch)
        pending.extend(tok[u] for u in path)
        pending.append(nxt)
        return pending
    return [nxt]
