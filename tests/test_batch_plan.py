"""The engine's batch plan (decoding/batch_plan.py): which sequences speculate in a step, priced as one step with the
batched cost table, the table corrected by the batch's own forwards, and the per-request off switch."""
from __future__ import annotations

import numpy as np
import pytest

from engine_utils import ScriptedPolicy, greedy_reference, tiny_pair
from multispec.decoding import batch_plan
from multispec.decoding.batch_plan import PlanAsk, choose
from multispec.decoding.engine import Engine
from multispec.decoding.methods import build_method
from multispec.drafting.batch_costs import BATCH_SIZES, TN_PRIOR, BatchCosts
from multispec.drafting.costs import BUCKETS
from multispec.drafting.protocol import RoundPlan
from multispec.models import make_backend
from multispec.sampling import SamplingConfig
from multispec.tree import Tree


def _table(target, draft) -> BatchCosts:
    """A batched cost table from target(b, n) and draft(b, n): seconds of a forward of b sequences × n tokens."""
    return BatchCosts({"target": [[target(b, n) for n in BUCKETS] for b in BATCH_SIZES],
                       "draft": [[draft(b, n) for n in BUCKETS] for b in BATCH_SIZES]})


# a forward that reads its weights whatever it computes (a small batch of a memory-bound model) ...
BOUND = (lambda b, n: 0.05 + 0.0001 * b * n, lambda b, n: 0.002 + 0.00005 * b * n)
# ... and one that costs in proportion to its tokens (a wide batch of a compute-bound one)
PROPORTIONAL = (lambda b, n: 0.002 * b * n, lambda b, n: 0.0005 * b * n)


def _chain(expected: float, pending: int = 1, depth: int = 3) -> PlanAsk:
    return PlanAsk(RoundPlan(Tree.chain(12), "draft", label="draft chain", expected=expected, size=depth + 1),
                   pending)


def test_a_batch_speculates_where_its_forward_is_bound_and_decodes_plainly_where_it_costs_in_proportion():
    asks = [_chain(3.0) for _ in range(8)]
    assert choose(asks, 0, 0, _table(*BOUND)) == [True] * 8
    assert choose(asks, 0, 0, _table(*PROPORTIONAL)) == [False] * 8
    assert choose(asks[:1], 0, 0, _table(*PROPORTIONAL)) == [True]  # alone: the policy's own plan


def test_the_batch_keeps_the_sequences_whose_speculation_pays_most():
    """Between the two regimes, the sequences expected to commit most keep their plans and the others step plainly;
    lookup and suffix plans (no draft forward) are cheaper than draft chains of the same yield."""
    middle = _table(lambda b, n: 0.004 + 0.0008 * b * n, lambda b, n: 0.0003 + 0.00005 * b * n)
    expected = [1.1, 3.5, 1.3, 3.0, 1.05, 2.5, 1.2, 4.0]
    keep = choose([_chain(e) for e in expected], 0, 0, middle)
    assert any(keep) and not all(keep)
    assert min(e for e, k in zip(expected, keep) if k) > max(e for e, k in zip(expected, keep) if not k)
    lookup = PlanAsk(RoundPlan(Tree.chain(3), "lookup", (1, 2, 3), label="lookup 3", expected=2.8, size=4))
    assert choose([lookup, _chain(2.8)], 6, 6, middle) == [True, False]


@pytest.mark.parametrize("broken", [False, True])
def test_a_long_catch_up_is_priced_in_full(monkeypatch, broken):
    """Every sequence waits on the first draft forward, which feeds each drafting sequence's pending tokens: a
    sequence with a long catch-up (a prompt its draft never read) steps plainly while the others draft. Priced as
    one token (the broken variant) it drafts too, and the whole batch waits on its catch-up."""
    if broken:
        monkeypatch.setattr(batch_plan, "_shape", lambda ask: (ask.plan.expected, ask.plan.size, [1] * 3))
    asks = [_chain(2.5) for _ in range(7)] + [_chain(2.5, pending=256)]
    keep = choose(asks, 0, 0, _table(*BOUND))
    assert keep[:7] == [True] * 7
    assert keep[7] is (True if broken else False)


def test_a_batch_learns_its_forward_costs_from_its_own_forwards():
    """The table is corrected by the engine's timed forwards, each once: a plain forward (one token per sequence)
    corrects "t1", a forward with drafted tokens what they add ("tn"); a forward carrying a prefill chunk teaches
    nothing. A batch that drafted where extra tokens were priced cheap stops once they prove dear (a long context);
    with learning off (the broken variant) it drafts on."""
    t = _table(*BOUND)
    plain, extra = t.forward("target", 8, 1), t.forward("target", 8, 2) - t.forward("target", 8, 1)
    t.learn((1, 8, 8, 1, 2 * plain))
    t.learn((1, 8, 8, 1, 2 * plain))  # the same forward again: learned once
    assert t.scale["t1"] == pytest.approx(1.1) and t.scale["tn"] == 1.0 and t.version == 1
    t.learn((2, 8, 16, 2, t.scale["t1"] * plain + 3 * extra))  # with a prior of TN_PRIOR plain forwards at ratio 1
    assert t.scale["tn"] == pytest.approx((3 * extra + TN_PRIOR * plain) / (extra + TN_PRIOR * plain))
    before = dict(t.scale)
    t.learn((3, 8, 8 + 255, 256, 100.0))  # a prefill chunk rides along
    assert t.scale == before
    assert t.target(8, 2) == pytest.approx(t.scale["t1"] * plain + t.scale["tn"] * extra)
    t.learn((1, 4, 4, 1, 2 * t.forward("draft", 4, 1)), "draft")  # the draft's forwards: "d"
    assert t.scale["d"] == pytest.approx(1.1) and t.scale["t1"] == before["t1"]

    def kept(learn: bool) -> list[int]:
        table = _table(lambda b, n: 0.02 + 0.0005 * b * n, lambda b, n: 0.0005 + 0.0001 * b * n)
        out = []
        for r in range(60):
            keep = choose([_chain(2.5) for _ in range(8)], 0, 0, table)
            out.append(sum(keep))
            tokens = 8 + 3 * sum(keep)
            base = table.forward("target", 8, 1)  # a long context: plain forwards as priced, drafted tokens dearer
            seconds = base + 30 * (table.forward("target", 8, tokens / 8) - base)
            if learn:
                table.learn((r + 1, 8, tokens, 4 if any(keep) else 1, seconds))
        return out

    learned, fixed = kept(True), kept(False)
    assert learned[0] == 8 and sum(learned[-10:]) == 0
    assert fixed[-10:] == [8] * 10


@pytest.mark.parametrize("broken", [False, True])
def test_a_batch_learns_what_drafted_tokens_add_without_bias_from_noise(broken):
    """What a few drafted tokens add to a batched forward is small beside the noise of the forward itself: each
    forward's own ratio is mostly noise, often negative. Learned as a ratio of decayed sums, "tn" lands near the
    truth (here 1.0); averaging the clamped ratios and skipping the negative ones (the old rule, the broken
    variant) learned it several times too high, and the batch stopped speculating."""
    from multispec.drafting.batch_costs import BATCH_SIZES, LEARN_RATE, BatchCosts

    t = BatchCosts({"target": [[0.05 + 0.0006 * b * (n - 1) for n in BUCKETS] for b in BATCH_SIZES]})
    plain = t.forward("target", 32, 1)
    rng = np.random.default_rng(0)

    def old_rule(timed, model="target"):
        _, b, tokens, _, seconds = timed
        base = t.forward(model, b, 1)
        predicted = t.scale["tn"] * (t.forward(model, b, tokens / b) - base)
        measured = seconds - t.scale["t1"] * base
        if predicted > 0 and measured > 0:
            t.scale["tn"] *= 1 + LEARN_RATE * (min(3.0, max(1 / 3, measured / predicted)) - 1)

    learn = old_rule if broken else t.learn
    for i in range(400):
        tokens = 32 + int(rng.integers(1, 4))  # one lane drafted 1-3 tokens: ~0.6-1.8 ms
        extra = t.forward("target", 32, tokens / 32) - plain
        learn((i + 1, 32, tokens, tokens - 31, plain + extra + rng.normal(0, 0.003)))  # 6 % noise on 50 ms
    assert (t.scale["tn"] > 1.5) if broken else (0.75 < t.scale["tn"] < 1.33)


def _add_lookup(engine: Engine, target, prompt, n_new: int, script) -> int:
    """A greedy lookup sequence of `engine` on the target alone, its plans from `script` (ScriptedPolicy)."""
    return engine.add(make_backend(target, "hf"), None, prompt, build_method("lookup"),
                      SamplingConfig(temperature=0.0), n_new, 0, set(), policy=ScriptedPolicy(script))


def _lookup_outputs(engine: Engine, target, prompts, n_new: int, script) -> list[list[int]]:
    """Each prompt as a `_add_lookup` sequence, the engine stepped until none is live: their new ids."""
    ids = [_add_lookup(engine, target, p, n_new, script) for p in prompts]
    while engine.live:
        engine.step()
    return [engine.pop(i)[0] for i in ids]


def test_a_left_out_sequence_steps_plainly_without_asking_then_is_asked_again():
    """In an engine whose step prices speculation out, each sequence is asked for a plan at rounds 0, 1, 3, 7, 15,
    31 ... (plain runs of 1, 2, 4, 8, 16) and decodes the target's greedy output; with no costs every plan runs as
    made and every round asks."""
    target, draft = tiny_pair(vocab=12, seed=2, noise=0.3)
    prompts = [[1, 5, 3, 1], [2, 7, 2], [4, 4, 9, 1, 3], [6, 1]]
    n_new = 40

    def script(history, r):
        return RoundPlan(Tree.chain(3), "draft", label="draft chain", expected=3.0, size=4)

    def decode(costs):
        engine, policies, ids = Engine(costs), [], []
        for p in prompts:
            policies.append(ScriptedPolicy(script))
            ids.append(engine.add(make_backend(target, "hf"), make_backend(draft, "hf"), p, build_method("sd", k=3),
                                  SamplingConfig(temperature=0.0), n_new, 0, set(), policy=policies[-1]))
        while engine.live:
            engine.step()
        return [engine.pop(i)[0] for i in ids], [pol.rounds for pol in policies], engine.plans

    outs, asked, plans = decode(_table(*PROPORTIONAL))
    assert outs == [greedy_reference(target, p, n_new) for p in prompts]
    assert all(6 <= a <= 7 for a in asked), asked  # 0, 1, 3, 7, 15, 31 (and 47 if it runs that long)
    assert plans["kept"] == 0 and plans["plain"] == sum(asked)
    outs, asked, plans = decode(None)
    assert outs == [greedy_reference(target, p, n_new) for p in prompts]
    assert plans["plain"] == 0 and min(asked) >= n_new // 4


@pytest.mark.parametrize("broken", [False, True])
def test_a_plain_step_grows_the_drafts_pending_tokens_in_place(monkeypatch, broken):
    """A sequence left out of speculation keeps every token since its draft last ran pending (its catch-up): each
    plain step appends its tokens to that list in place, as the list it replaces would read, instead of copying the
    whole context every round. The broken variant copies (it used to): the test sees a new list."""
    from multispec.decoding import rounds

    real, seen = rounds._pending_after, []

    def copying(run, state, proposal, path, tok, nxt):
        return state.pending[:-1] + [tok[u] for u in path] + [nxt]

    def watch(run, state, proposal, path, tok, nxt):
        before, expected = state.pending, state.pending[:-1] + [tok[u] for u in path] + [nxt]
        out = (copying if broken else real)(run, state, proposal, path, tok, nxt)
        seen.append((out is before, out == expected, len(path)))
        return out

    monkeypatch.setattr(rounds, "_pending_after", watch)
    target, draft = tiny_pair(vocab=12, seed=2, noise=0.3)
    engine = Engine(_table(*PROPORTIONAL))
    script = lambda history, r: RoundPlan(Tree.chain(3), "draft", label="draft chain", expected=3.0, size=4)  # noqa: E731
    prompts = [[1, 5, 3, 1], [2, 7, 2], [4, 4, 9, 1, 3]]
    ids = [engine.add(make_backend(target, "hf"), make_backend(draft, "hf"), p, build_method("sd", k=3),
                      SamplingConfig(temperature=0.0), 20, 0, set(), policy=ScriptedPolicy(script)) for p in prompts]
    while engine.live:
        engine.step()
    assert [engine.pop(i)[0] for i in ids] == [greedy_reference(target, p, 20) for p in prompts]
    plain = [s for s in seen if s[2] == 1]  # (a plain step's path is the root alone)
    assert len(plain) >= 3 * 15 and all(same for _, same, _ in plain)
    assert not any(kept for kept, _, _ in plain) if broken else all(kept for kept, _, _ in plain)


def test_realised_scales_a_sequence_by_what_its_kept_plans_delivered():
    r, key = batch_plan.Realised(), ("lookup", True)
    assert r.factor(key) == 1.0
    r.keep(key, 2.0, 10)
    r.settle(11)  # one token committed: nothing past the round's own
    assert r.factor(key) == pytest.approx(1 / 3)  # (0 delivered + the prior's 1) / (2 expected + 1)
    r.settle(30)  # nothing in flight: nothing learned
    assert r.factor(key) == pytest.approx(1 / 3)
    assert r.factor(("suffix", True)) == 1.0  # another proposer's record is its own
    asks = [_chain(3.0) for _ in range(8)]
    assert choose(asks, 0, 0, _table(*BOUND), factors=[0.0] * 4 + [1.0] * 4) == [False] * 4 + [True] * 4


@pytest.mark.parametrize("broken", [False, True])
def test_a_sequence_whose_kept_plans_deliver_little_is_left_out(monkeypatch, broken):
    """Lookup plans that promise 4 tokens a round and are always rejected: the engine keeps them at first, then,
    as the sequences' delivered-to-expected ratio falls, answers them with plain steps. Pricing the promise as made
    (the broken variant) keeps every one. Either way the output is the target's greedy output. (The table is not
    corrected by the forwards' own times here: the plans must not depend on how loaded the machine is.)"""
    monkeypatch.setattr(BatchCosts, "learn", lambda self, *a, **k: None)
    if broken:
        monkeypatch.setattr(batch_plan.Realised, "factor", lambda self, *a: 1.0)
    target, draft = tiny_pair(vocab=12, seed=2, noise=0.3)
    prompts = [[1, 5, 3, 1], [2, 7, 2], [4, 4, 9, 1, 3], [6, 1]]
    n_new = 30
    refs = [greedy_reference(target, p, n_new + 4) for p in prompts]

    def script(history, r):
        i = next(j for j, p in enumerate(prompts) if history[:len(p)] == p)
        nxt = refs[i][len(history) - len(prompts[i])]
        wrong = (nxt + 1) % 12  # never the target's next token: the first drafted token is always rejected
        return RoundPlan(Tree.chain(3), "lookup", (wrong, wrong, wrong), label="lookup 3", expected=4.0, size=4)

    middle = _table(lambda b, n: 0.004 + 0.0008 * b * n, lambda b, n: 0.0003 + 0.00005 * b * n)
    engine = Engine(middle)
    assert _lookup_outputs(engine, target, prompts, n_new, script) == [r[:n_new] for r in refs]
    if broken:
        assert engine.plans["plain"] == 0
    else:
        assert 4 <= engine.plans["kept"] <= 12 and engine.plans["plain"] >= 4


@pytest.mark.parametrize("broken", [False, True])
def test_a_newcomer_starts_from_what_the_batchs_plans_delivered(monkeypatch, broken):
    """After four sequences' lookup plans were always rejected, a fifth sequence joins the batch with the same
    optimistic policy: its plans are answered with plain steps from its first ask on, because its record starts
    from the batch's delivered-to-expected ratio for lookup plans at greedy sampling (Pool). Starting from the
    policy's promise (the broken variant: the pool ignored) keeps its first plans. Output = greedy either way."""
    monkeypatch.setattr(BatchCosts, "learn", lambda self, *a, **k: None)  # (plans independent of the machine)
    if broken:
        monkeypatch.setattr(batch_plan.Pool, "ratio", lambda self, key: 1.0)
    target, _ = tiny_pair(vocab=12, seed=2, noise=0.3)
    prompts = [[1, 5, 3, 1], [2, 7, 2], [4, 4, 9, 1, 3], [6, 1], [3, 3, 8]]
    n_new = [60] * 4 + [30]  # the newcomer decodes all its tokens beside the others
    refs = [greedy_reference(target, p, 64) for p in prompts]

    def script(history, r):
        i = next(j for j, p in enumerate(prompts) if history[:len(p)] == p)
        wrong = (refs[i][len(history) - len(prompts[i])] + 1) % 12  # always rejected
        return RoundPlan(Tree.chain(3), "lookup", (wrong,) * 3, label="lookup 3", expected=4.0, size=4)

    middle = _table(lambda b, n: 0.004 + 0.0008 * b * n, lambda b, n: 0.0003 + 0.00005 * b * n)
    engine = Engine(middle)

    ids = [_add_lookup(engine, target, p, n, script) for p, n in zip(prompts[:4], n_new)]
    for _ in range(20):
        engine.step()
    kept_before = engine.plans["kept"]
    ids.append(_add_lookup(engine, target, prompts[4], n_new[4], script))
    while engine.sequence(ids[4]).done is False:
        engine.step()
    newcomer_kept = engine.plans["kept"] - kept_before  # (the others' asks are answered plain by now)
    while engine.live:
        engine.step()
    assert [engine.pop(i)[0] for i in ids] == [r[:n] for r, n in zip(refs, n_new)]
    done, promised = engine.pool.sums[("lookup", True)]
    assert done / promised < 0.1
    if broken:
        assert newcomer_kept >= 1
    else:
        assert newcomer_kept == 0


@pytest.mark.parametrize("budget", [8, 10_000])
def test_prefill_chunks_past_a_steps_budget_wait_a_step(budget):
    """Four prompts join at once on backends that prefill in chunks of 4 tokens: with a budget of 8 prefill tokens
    a step, no forward carries more than 8 prefill tokens (plus the decoding sequences' own), the oldest sequences'
    chunks first; without one (the unbounded variant) a step carries all four chunks. Greedy output unchanged."""
    target, _ = tiny_pair(vocab=12, seed=2, noise=0.3)
    prompts = [[1, 5, 3, 1, 2, 7, 2, 4, 4], [2, 7, 2, 6, 1, 1, 5, 3, 9], [4, 4, 9, 1, 3, 6, 1, 2, 2],
               [6, 1, 5, 5, 3, 1, 7, 2, 8]]
    engine, ids, sizes = Engine(prefill_budget=budget), [], []
    engine.on_batch = lambda role, sequences, tokens: sizes.append(tokens)
    for p in prompts:
        backend = make_backend(target, "hf")
        backend.prefill_chunk = 4
        ids.append(engine.add(backend, None, p, build_method("ar"), SamplingConfig(temperature=0.0), 6, 0, set()))
    while engine.live:
        engine.step()
    assert [engine.pop(i)[0] for i in ids] == [greedy_reference(target, p, 6) for p in prompts]
    assert max(sizes) == (16 if budget > 16 else 8 + 2)  # (two sequences decode while the last two prefill)


def test_the_gate_shuts_where_speculating_steps_ran_fewer_tokens_per_second_and_opens_again():
    """Per batch size: no verdict before GATE_MIN steps of each kind; shut where the speculating steps' decayed tokens
    per second fall below the plain steps'; while shut, every GATE_EXPLORE-th answering step runs its plans; open
    again once speculating steps outrun plain ones. Another batch size is untouched."""
    gate = batch_plan.Gate()
    for _ in range(batch_plan.GATE_MIN - 1):
        gate.record(16, False, 16, 0.100)  # 160 tok/s
        gate.record(16, True, 18, 0.125)  # 144 tok/s
    assert not gate.shut(16) and gate.open(16)
    gate.record(16, False, 16, 0.100)
    gate.record(16, True, 18, 0.125)
    assert gate.shut(16) and not gate.shut(8) and gate.open(8)
    opened = [gate.open(16) for _ in range(3 * batch_plan.GATE_EXPLORE)]
    assert opened.count(True) == 3 and opened[batch_plan.GATE_EXPLORE - 1], opened
    report = gate.report()[16]
    assert report["shut"] and report["spec_tps"] < report["plain_tps"] and report["steps"] == [8, 8]
    for _ in range(20):
        gate.record(16, True, 24, 0.125)  # 192 tok/s
    assert not gate.shut(16) and gate.open(16)


@pytest.mark.parametrize("case", ["slow", "fast", "broken"])
def test_an_engine_answers_plain_where_its_speculating_steps_measured_slower(monkeypatch, case):
    """Four sequences whose lookup plans are always accepted (3 tokens of the target's greedy text, every third
    round a plain plan), priced by a table where verification rows are cheap. Where each wide forward sleeps 40 ms
    (slow), the speculating steps run fewer tokens per second than the plain ones and the gate shuts at batch 4:
    asks are answered plain. Where they do not sleep (fast), nothing is gated. An engine that does not consult the
    gate (broken) gates nothing where the forwards sleep. The output is the target's greedy output every time."""
    import time as time_mod

    from multispec.decoding import engine as engine_mod

    monkeypatch.setattr(BatchCosts, "learn", lambda self, *a, **k: None)  # (the price alone: the clock is the gate's)
    if case == "broken":
        monkeypatch.setattr(batch_plan.Gate, "open", lambda self, batch: True)
    if case != "fast":
        real = engine_mod.forward_all

        def sleepy(requests):
            if any(r.tokens.shape[0] > 1 for r in requests):
                time_mod.sleep(0.04)
            return real(requests)

        monkeypatch.setattr(engine_mod, "forward_all", sleepy)
    target, _ = tiny_pair(vocab=12, seed=2, noise=0.3)
    prompts = [[1, 5, 3, 1], [2, 7, 2], [4, 4, 9, 1, 3], [6, 1]]
    n_new = 120
    refs = [greedy_reference(target, p, n_new + 4) for p in prompts]

    def script(history, r):
        if r % 3 == 2:
            return batch_plan.PLAIN
        i = next(j for j, p in enumerate(prompts) if history[:len(p)] == p)
        at = len(history) - len(prompts[i])
        return RoundPlan(Tree.chain(3), "lookup", tuple(refs[i][at:at + 3]), label="lookup 3", expected=4.0, size=4)

    engine = Engine(_table(*BOUND))
    assert _lookup_outputs(engine, target, prompts, n_new, script) == [r[:n_new] for r in refs]
    report = engine.gate.report()[4]
    assert report["steps"][0] >= batch_plan.GATE_MIN and report["steps"][1] >= batch_plan.GATE_MIN, report
    if case == "slow":
        assert report["shut"] and engine.plans["gated"] > 0, (report, engine.plans)
    else:
        assert engine.plans["gated"] == 0, (report, engine.plans)
        assert case == "broken" or not report["shut"]
