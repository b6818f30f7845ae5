"""The engine: rounds of one or many sequences, one round of every live sequence per `step`.

    engine = Engine()
    i = engine.add(target, draft, prompt_ids, method, sampling, max_new_tokens, seed, eos_ids)   # -> an id
    while engine.live:
        engine.step()                 # one round of every live sequence (a newcomer's first step: its prefill)
    new_ids, metrics = engine.pop(i)  # or engine.cancel(i) between steps

A sequence's generation (decoding/rounds.py) is a generator that yields the forwards it needs as values
(models/base.Forward) and None when its round is over. `step` advances every live sequence until each has yielded
a forward or ended its round, runs the waiting forwards — the draft's first, so that drafting sequences reach the
target forward together with the others — the requests on slots of one batched cache as one forward
(models/batched.forward_all: one draft forward per depth across all drafting sequences, one target forward over
the round batch), sends each sequence its output, and goes on until every sequence has ended its round. `generate`
with one prompt is this engine with one sequence: there is one round implementation. A newcomer's first step is
its prefill (on a batched cache, one chunk of PREFILL_CHUNK tokens per step, and at most PREFILL_BUDGET prefill
tokens a step across newcomers, the oldest first), so joining prompts hold up the running sequences' steps by a
bounded amount. A feature head's forwards batch like a draft model's (models/eagle_batched.py: one head
forward per depth, the target's through its feature tap). Forwards a method makes itself (target-initialized rounds,
EAGLE-2's dynamic trees, another tokenizer's draft) run alone, as they come.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from multispec.decoding.batch_plan import OFF_MAX, PLAIN, Gate, PlanAsk, Pool, choose
from multispec.decoding.logprobs import LogprobRecorder
from multispec.decoding.methods import MethodConfig
from multispec.decoding.metrics import Metrics
from multispec.decoding.round_verify import ChainVerify
from multispec.decoding.rounds import Cancelled, Sequence, generation, make_run
from multispec.drafting.protocol import DraftPolicy
from multispec.errors import check
from multispec.models.base import Backend, Forward
from multispec.models.batched import PREFILL_CHUNK, Role, forward_all
from multispec.sampling import SamplingConfig
from multispec.verify.batched import RoundBatch, chain_batch

__all__ = ["Cancelled", "Engine", "PREFILL_BUDGET", "Sequence", "generate_ids"]

PREFILL_BUDGET = 4 * PREFILL_CHUNK  # prefill tokens a step runs at most (chunks past it wait a step, oldest first)


class Engine:
    """See the module docstring. costs: the batched cost table (drafting/batch_costs.BatchCosts) a step's plans are
    priced with (decoding/batch_plan.py), corrected by the engine's own timed forwards; None: every plan runs as its
    policy made it. overhead: per-round and per-level Python seconds for that pricing (default: auto's).
    forwards / sequences: batched forwards so far and the sequences they carried, per Role; timed[role]: (that
    role's forwards so far, sequences, tokens, longest step, seconds) of its latest forward; on_batch(role,
    sequences, tokens) after each forward. plans: asked plans answered as planned / with a plain step / plain by the
    gate (batch_plan.Gate: the measured tokens per second of speculating and plain steps, per batch size)."""

    def __init__(self, costs=None, overhead: dict | None = None, prefill_budget: int = PREFILL_BUDGET):
        self.costs, self.overhead, self.prefill_budget = costs, overhead, prefill_budget
        self.plans: Counter = Counter()
        self.pool = Pool()  # what the batch's kept plans delivered, per proposer and sampling (batch_plan.Pool)
        self.gate: Gate | None = Gate()  # priced plans against the clock, per batch size (None: plans as priced)
        self._round = _Round()  # what the current step ran (for the gate)
        self._held: dict[int, Forward] = {}  # prefill chunks over a step's budget: run first in the next step
        self._seqs: dict[int, Sequence] = {}
        self._next = 0
        self.forwards: Counter = Counter()
        self.sequences: Counter = Counter()
        self.timed: dict[Role, tuple] = {}
        self.on_batch: Callable | None = None

    @property
    def live(self) -> int:
        """Sequences decoding now (added, not ended)."""
        return sum(not s.done for s in self._seqs.values())

    def add(self, target: Backend, draft: Backend | None, prompt: list[int], method: MethodConfig,
            sampling: SamplingConfig, max_new_tokens: int, seed: int | None, eos_ids: set[int], stop=None,
            on_tokens=None, policy: DraftPolicy | None = None, reproducible: bool = False,
            logprobs: LogprobRecorder | None = None) -> int:
        """Add one generation on backends the caller built (the Decoder does; each sequence its own caches or cache
        slots); it starts at the next `step`. prompt: token ids (>= 1). stop(new_ids) -> int | None returns a cut
        length when a stop string completed. on_tokens(new_ids_so_far) is called after each round (streaming).
        policy: the method's draft policy (default: built from the registry without trained models).
        reproducible (T > 0): drafter-invariant verification (`gls`, verify/gumbel.py) with noise keyed by (seed,
        absolute position): the text then depends on the target, the prompt, the sampling settings and the seed
        only, whatever the method, its plans or the batch. eos_ids: the tokens that end the output (and that
        sampling.min_tokens holds back). logprobs: filled with the committed tokens' (and, if it asks, the
        prompt's) log-probabilities, cut with the output. max_new_tokens may be 0 (a prefill only: prompt
        logprobs). Returns the sequence's id."""
        run = make_run(target, draft, method, sampling, seed, policy, reproducible)
        s = Sequence(self._next, run, list(prompt), max_new_tokens, set(eos_ids), stop, on_tokens, logprobs)
        s.steps = generation(s)
        self._seqs[s.id] = s
        self._next += 1
        return s.id

    def cancel(self, seq_id: int, error: BaseException | None = None) -> None:
        """End a sequence between steps (its error: `error`, default Cancelled); its tokens so far stay in
        `sequence(seq_id).new`."""
        s = self._seqs[seq_id]
        self._held.pop(seq_id, None)
        if not s.done:
            if s.steps is not None:
                s.steps.close()
            s.done, s.error = True, error if error is not None else Cancelled("the sequence was cancelled")

    def sequence(self, seq_id: int) -> Sequence:
        return self._seqs[seq_id]

    def pop(self, seq_id: int) -> tuple[list[int], Metrics]:
        """An ended sequence's (new ids, metrics), which the engine then forgets; its error is raised instead."""
        s = self._seqs.pop(seq_id)
        check(s.done, f"sequence {seq_id} has not ended")
        if s.error is not None:
            raise s.error
        assert s.result is not None
        return s.result

    def step(self) -> list[int]:
        """One round of every live sequence (a newcomer: its prefill, or one chunk of it). Returns the ids of the
        sequences that ended in this step (finished, or failed: `pop` raises their error). A forward's error goes
        to every sequence of that forward; an interrupt (KeyboardInterrupt) propagates, its sequence ended."""
        ended: list[int] = []
        waiting: dict = {}  # sequence id -> what it asks for next: a Forward, or a ChainVerify
        live = [s for s in self._seqs.values() if not s.done]
        self._round = _Round({s.id: len(s.new) for s in live}, time.perf_counter())
        for s in live:
            if s.id in self._held:  # a prefill chunk held back by the last step's budget
                waiting[s.id] = self._held.pop(s.id)
                continue
            s.realised.settle(len(s.new), self.pool)  # (its last round is over)
            self._advance(s, None, waiting, ended)
        while waiting:
            if any(isinstance(r, PlanAsk) for r in waiting.values()):  # (every asking sequence at once)
                self._answer(waiting, ended)
                continue
            forwards = [i for i, r in waiting.items() if isinstance(r, Forward)]
            if not forwards:  # every waiting sequence verifies a sampled chain: all of them at once
                ids = list(waiting)
                for i, out in zip(ids, verify_chains([waiting.pop(i) for i in ids])):
                    self._advance(self._seqs[i], out, waiting, ended)
                continue
            # the draft's forwards first: drafting sequences then verify in one target forward with the others
            drafts = [i for i in forwards if waiting[i].backend is not self._seqs[i].run.target]
            ids = self._budget(drafts or forwards, waiting)
            role = Role.DRAFT if drafts else Role.TARGET
            requests: list = [waiting.pop(i) for i in ids]
            t0 = time.perf_counter()
            outs = forward_all(requests)
            self._count(role, requests, time.perf_counter() - t0)
            if len(requests) > 1:
                outs = [o if isinstance(o, BaseException) else replace(o, shared=len(requests)) for o in outs]
            for i, out in zip(ids, outs):
                self._advance(self._seqs[i], out, waiting, ended)
        self._record()
        return ended

    def _record(self) -> None:
        """Give the gate this step's tokens per second, if it speculated (some asked plan ran) or was plain (nothing
        drafted, a token a sequence); a step with a prefill chunk or a method's own drafts is neither."""
        r = self._round
        if self.costs is None or self.gate is None or r.batch < 2 or r.chunk or self._held or not (r.kept or r.plain):
            return
        tokens = sum(max(0, len(self._seqs[i].new) - n) for i, n in r.lengths.items() if i in self._seqs)
        self.gate.record(r.batch, r.kept, tokens, time.perf_counter() - r.start)

    def _budget(self, ids: list[int], waiting: dict) -> list[int]:
        """The requests of `ids` to run now: all but the prefill chunks past the step's prefill token budget (the
        oldest sequences' first; at least one chunk runs), which are held for the next step."""
        chunks = [i for i in ids if waiting[i].chunk]
        total, run = 0, set(ids)
        for i in chunks:
            total += waiting[i].tokens.shape[0]
            if total > self.prefill_budget and i != chunks[0]:
                self._held[i] = waiting.pop(i)
                run.discard(i)
        return [i for i in ids if i in run]

    def _answer(self, waiting: dict, ended: list) -> None:
        """Answer every waiting PlanAsk: as planned, or a plain step (batch_plan.choose over the step); a sequence
        left out takes plain steps for 1, 2, 4 ... OFF_MAX rounds without asking."""
        ids = [i for i, r in waiting.items() if isinstance(r, PlanAsk)]
        asks = [waiting.pop(i) for i in ids]
        keep = [True] * len(asks)
        if self.costs is not None:
            other_tokens = sum(r.tokens.shape[0] if isinstance(r, Forward) and r.backend is self._seqs[i].run.target
                               else 1 for i, r in waiting.items())
            if self.gate is None or self.gate.open(self._round.batch):
                keep = choose(asks, len(waiting), other_tokens, self.costs, self.overhead,
                              [self._seqs[i].realised.factor(_key(self._seqs[i], a), self.pool)
                               for i, a in zip(ids, asks)])
            else:
                keep = [False] * len(asks)
                self.plans["gated"] += len(asks)
        self._round.kept |= any(keep)
        for i, ask, kept in zip(ids, asks, keep):
            s = self._seqs[i]
            self.plans["kept" if kept else "plain"] += 1
            if kept:
                s.backoff = 0
                s.realised.keep(_key(s, ask), (ask.plan.expected or 1.0) - 1, len(s.new))
            else:
                s.backoff = min(OFF_MAX, max(1, 2 * s.backoff))
                s.plain = s.backoff - 1  # (this round is the first of them)
            self._advance(s, ask.plan if kept else PLAIN, waiting, ended)

    def _advance(self, s: Sequence, value, waiting: dict, ended: list) -> None:
        """Run sequence s until it asks for a forward (into `waiting`) or ends its round; value: the output of its
        last request (an exception: that forward's error, raised in the sequence)."""
        assert s.steps is not None
        try:
            request = s.steps.throw(value) if isinstance(value, BaseException) else s.steps.send(value)
        except StopIteration as finished:
            s.done, s.result = True, finished.value
            ended.append(s.id)
        except Exception as e:  # noqa: BLE001 - this sequence fails; the others go on
            s.done, s.error = True, e
            ended.append(s.id)
        except BaseException as e:  # an interrupt: this sequence ends with it, and it propagates
            s.done, s.error = True, e
            ended.append(s.id)
            raise
        else:
            if request is not None:
                waiting[s.id] = request

    def _count(self, role: Role, requests: list[Forward], seconds: float) -> None:
        sizes = [r.tokens.shape[0] for r in requests]
        if role is Role.DRAFT or max(sizes) > 1:
            self._round.plain = False
        self._round.chunk |= any(r.chunk for r in requests)
        self.forwards[role] += 1
        self.sequences[role] += len(requests)
        self.timed[role] = (self.forwards[role], len(requests), sum(sizes), max(sizes), seconds)
        if self.on_batch is not None:
            self.on_batch(role, len(requests), sum(sizes))
        if self.costs is not None:
            self.costs.learn(self.timed[role], "target" if role is Role.TARGET else "draft")


@dataclass
class _Round:
    """What one engine step ran, for the gate: the live sequences at its start and their output lengths, its start
    time, whether some asked plan ran (kept), whether every forward was a token a sequence of the target (plain),
    whether a prefill chunk ran."""

    lengths: dict = field(default_factory=dict)  # sequence id -> its output length at the step's start
    start: float = 0.0
    kept: bool = False
    plain: bool = True
    chunk: bool = False

    @property
    def batch(self) -> int:
        return len(self.lengths)


def _key(s: Sequence, ask: PlanAsk) -> tuple:
    """What a plan's delivered-to-expected ratio is kept for: its proposer, and greedy or sampled."""
    return ask.plan.proposer, s.run.sampling.greedy


def generate_ids(
    target: Backend, draft: Backend | None, prompt: list[int], method: MethodConfig, sampling: SamplingConfig,
    max_new_tokens: int, seed: int | None, eos_ids: set[int], stop=None, on_tokens=None,
    policy: DraftPolicy | None = None, reproducible: bool = False, logprobs: LogprobRecorder | None = None,
) -> tuple[list[int], Metrics]:
    """One generation: the engine with one sequence (see `Engine.add` for the arguments). Returns the new token ids
    and the metrics record."""
    engine = Engine()
    i = engine.add(target, draft, prompt, method, sampling, max_new_tokens, seed, eos_ids, stop, on_tokens, policy,
                   reproducible, logprobs)
    while engine.live:
        engine.step()
    return engine.pop(i)


def verify_chains(requests: list[ChainVerify]) -> list:
    """Each request's (path, next token), the requests of one kind and vocabulary verified as one batch in tensor
    operations (verify/batched.chain_batch, p and q where the forward left them, one host copy); a sequence whose
    law has no mass gets that error (sent into it), the others their outcomes."""
    out: list = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for j, r in enumerate(requests):
        groups.setdefault((r.kind, r.p.shape[-1], r.p.device), []).append(j)
    for (kind, _, device), members in groups.items():
        rs = [requests[j] for j in members]
        try:
            batch = RoundBatch.of([r.tree for r in rs], [r.tokens for r in rs], device)
            p = torch.cat([r.p for r in rs])
            q = None if kind == "naive" else torch.cat([r.q if r.q is not None else torch.zeros_like(r.p) for r in rs])
            results: list = chain_batch(batch, p, q, [r.generator for r in rs], kind).outcomes(errors=True)
        except Exception as e:  # noqa: BLE001 - each sequence of this batch gets the error
            results = [e] * len(rs)
        for j, res in zip(members, results):
            out[j] = res
    return out
