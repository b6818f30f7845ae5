"""An adapting head's updates, priced and backed off (issue 67; drafting/adapt_schedule.py, drafting/adapting.py):
the update period doubles while the updates do not repay their seconds, up to a cap and then off, and comes back
when acceptance falls; auto charges a head plan update_s / period a round and declines the head where that charge
makes it lose; a Decoder times an update once into the machine profile. Broken variants caught: the price ignored,
the gain not measured against the window before, auto not counting the charge, a Decoder that times the update
again."""
from __future__ import annotations

import pytest
import torch

from engine_utils import greedy_reference
from test_eagle_adapt import ON, _auto_decode, _pair
from test_eagle import GREEDY, _head_dir, _target
from multispec.drafting.adapt_schedule import CAP_DOUBLINGS, UpdateSchedule
from multispec.drafting.adapting import AdaptingPolicy, update_key
from multispec.drafting.auto.policy import AutoPolicy, Charged
from multispec.profile import MachineProfile

torch.set_num_threads(1)
ROUND_S = 0.01  # every synthetic head round's predicted seconds


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target = _target()
    return target, _head_dir(target, tmp_path_factory.mktemp("head") / "head")


def _feed(schedule: UpdateSchedule, tokens: list[int], update_s: float | None,
          seconds: float | None = ROUND_S) -> list[int]:
    """Each round's committed tokens in turn: the (1-based) head rounds after which the head updated."""
    return [i + 1 for i, t in enumerate(tokens) if schedule.add(t, seconds, update_s)]


# ---------------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("broken", [False, True])
def test_no_improvement_doubles_the_period_up_to_off(monkeypatch, broken):
    """3 tokens every head round, an update priced 0.3 tokens per round at period 2: after the first window (the
    frozen head's) every window doubles the period, 2 -> 4 -> ... -> 32 (the cap), then off, and no update since.
    Broken variant (the update's price ignored: it always pays) caught."""
    if broken:
        monkeypatch.setattr(UpdateSchedule, "_price", lambda self, update_s, w: 0.0)
    s = UpdateSchedule(2)
    assert s.cap == 2 << CAP_DOUBLINGS == 32
    updates = _feed(s, [3] * 128, update_s=0.002)
    if broken:
        assert s.period == 2 and updates == list(range(2, 129, 2))
        return
    assert updates == [2, 4, 8, 16, 32]
    assert s.changes == [(4, 4), (8, 8), (16, 16), (32, 32), (64, None)]
    report = s.report()
    assert report["period"] is None and report["off_since"] == 64 and "its price" in report["why"]
    assert report["head_rounds"] == 128


def _rising(windows: int, every: int) -> list[int]:
    """Head rounds whose tokens rise by 2 a round from one window of `every` rounds to the next."""
    return [1 + 2 * k for k in range(windows) for _ in range(every)]


@pytest.mark.parametrize("broken", [False, True])
def test_improvement_keeps_the_period(monkeypatch, broken):
    """Tokens per head round rising by 2 from window to window, at a price the rise repays: an update after every
    2nd head round throughout. Broken variant (the gain not measured: only the noise allowance counts) caught."""
    if broken:
        monkeypatch.setattr(UpdateSchedule, "_gain", lambda self, w: self._error(w))
    s = UpdateSchedule(2)
    updates = _feed(s, _rising(8, 2), update_s=0.003)
    if broken:
        assert s.changes and updates != list(range(2, 17, 2))
        return
    assert updates == list(range(2, 17, 2)) and s.period == 2 and s.changes == []
    # the same rounds with no rise, at the same price: the period doubles
    flat = UpdateSchedule(2)
    _feed(flat, [9] * 16, update_s=0.003)
    assert flat.period is not None and flat.period > 2


def test_a_doubled_period_halves_when_updates_pay_twice_over():
    """Priced out to period 8 on a flat stretch, then tokens per round rising by 2 a round: the period comes back
    down to 2 (4 after the window that saw the rise begin, 2 after the next) and stays."""
    s = UpdateSchedule(2)
    _feed(s, [2] * 14, update_s=0.002)
    assert s.period == 8
    assert _feed(s, [2 + 2 * k for k in range(16)], update_s=0.002) == [2, 6, 8, 10, 12, 14, 16]
    assert s.changes[-2:] == [(16, 4), (20, 2)] and s.period == 2 and "paid twice over" in s.why


def test_off_comes_back_when_acceptance_falls():
    """Off on a flat stretch of 5 tokens a round; a stretch 1 token higher keeps it off; one of 1 token a round
    (the head out of date) turns it on again at the cap period, with an update at once."""
    s = UpdateSchedule(2)
    _feed(s, [5] * 64, update_s=0.002)
    assert s.period is None and s.off_since == 64
    assert _feed(s, [6] * 32, update_s=0.002) == [] and s.period is None
    assert _feed(s, [1] * 32, update_s=0.002) == [32] and s.period == s.cap and s.off_since is None
    assert "fell by" in s.why


def test_free_or_unpriced_updates_keep_adapt_every():
    """An update that costs nothing always pays; without a price (no costs, or no update seconds) the period
    stays adapt_every."""
    for update_s, seconds in ((0.0, ROUND_S), (0.002, None), (None, ROUND_S)):
        s = UpdateSchedule(4)
        assert _feed(s, [3] * 64, update_s, seconds) == list(range(4, 65, 4)) and s.changes == []


def test_declines_double_the_period_up_to_off():
    s = UpdateSchedule(8)
    for period in (16, 32, 64, 128, None):
        s.decline()
        assert s.period == period
    s.decline()
    assert s.period is None and s.off_since == 0 and "declined" in s.why


# ---------------------------------------------------------------------------------------------- auto counts it
def test_a_draft_plan_pays_the_charge_each_round():
    """Charged costs price a round charge_s dearer (the same forwards); a draft plan of the same tree through them
    takes exactly charge_s more predicted seconds."""
    from multispec.drafting.auto.costs import AloneCosts
    from multispec.drafting.auto.plans import Planner
    from multispec.drafting.costs import BUCKETS, CostCurve, CostModel

    costs = AloneCosts(CostModel(CostCurve([0.01 + 5e-4 * (b - 1) for b in BUCKETS]),
                                 CostCurve([1e-3] * len(BUCKETS))), 32)
    charged = Charged(costs, 2e-4)
    assert charged.overhead["round_s"] == costs.overhead["round_s"] + 2e-4
    assert (charged.t(5), charged.d(3), charged.overhead["level_s"]) == (costs.t(5), costs.d(3),
                                                                          costs.overhead["level_s"])
    planner = Planner(32, 12, 4, 10, 3, draft_proposer="head")
    free, dear = planner.draft(costs, 1), planner.draft(charged, 1)
    assert free.size == dear.size and free.expected == dear.expected
    assert dear.expected / dear.predicted_tps - free.expected / free.predicted_tps == pytest.approx(2e-4)


PROMPT = [3, 1, 4, 1, 5] * 6  # auto drafts with the head here (and looks up, and takes plain steps)


@pytest.mark.parametrize("broken", [False, True])
def test_auto_stops_the_heads_updates_that_do_not_pay(tiny, monkeypatch, broken):
    """auto:head=DIR:adapt=on, greedy, an update after every head round: priced at 10 s (1,000 plain steps), the
    head drafts no round on its merits while adaptation is on (auto declines it: the period doubles to off, and the
    head then drafts frozen); free, adaptation stays on at adapt_every with an update after every head round. The
    output is the target's either way, and the charge a head round pays is update_s / period while on, 0 off.
    Broken variant (auto does not count the charge) caught."""
    target, head_dir = tiny
    charges: list = []
    plan = AdaptingPolicy.plan_round

    def recording(self, history, pending):
        out = plan(self, history, pending)
        charges.append((self.inner.draft_charge_s, self.schedule.period, self.update_s))
        return out

    monkeypatch.setattr(AdaptingPolicy, "plan_round", recording)
    if broken:
        monkeypatch.setattr(AutoPolicy, "_draft_costs", lambda self: self._costs())
    ids, rounds, report = _auto_decode(target, head_dir, PROMPT, 64, update_s=10.0, **ON)
    assert ids == greedy_reference(target, PROMPT, 64)
    for charge, period, update_s in charges:
        assert charge == (update_s / period if period is not None else 0.0)
    on_merit = [r for r in rounds if r[0] == "head" and r[3] is not None and not r[4].endswith("(probe)")]
    if broken:
        with pytest.raises(AssertionError):
            assert not on_merit
        return
    assert not on_merit and report["updates"] == 0
    assert report["period"] is None and "declined" in report["why"] and report["update_s_from"] == "given"
    assert any(r[0] == "head" for r in rounds)  # the head drafts, frozen
    charges.clear()
    ids, rounds, report = _auto_decode(target, head_dir, PROMPT, 64, update_s=0.0, **ON)
    assert ids == greedy_reference(target, PROMPT, 64)
    head_rounds = sum(r[0] == "head" for r in rounds)
    assert head_rounds > 0 and report["updates"] == head_rounds and report["period"] == 1
    assert report["changes"] == [] and all(c == 0.0 for c, _, _ in charges)


def test_without_a_profile_the_first_update_prices_the_rest(tiny, monkeypatch):
    """A policy used without a Decoder (no profile) and given no update_s: its head plans pay nothing until its first
    update, then that update's own seconds / period, the same number for the rest of the request (later updates'
    timings never move a plan); the report says where update_s came from."""
    target, head_dir = tiny
    seen: list = []
    plan = AdaptingPolicy.plan_round

    def recording(self, history, pending):
        out = plan(self, history, pending)
        seen.append((self.inner.draft_charge_s, self.schedule.period, self.update_s, self.adapter.updates))
        return out

    monkeypatch.setattr(AdaptingPolicy, "plan_round", recording)
    ids, _, report = _auto_decode(target, head_dir, PROMPT, 64, update_s=None, **ON)
    assert ids == greedy_reference(target, PROMPT, 64)
    assert report["update_s_from"] == "first update" and report["updates"] >= 1 and report["update_s"] > 0
    before, after = [x for x in seen if x[3] == 0], [x for x in seen if x[3] > 0]
    assert before and all(charge == 0.0 and update_s is None for charge, _, update_s, _ in before)
    assert after and {update_s for _, _, update_s, _ in after} == {report["update_s"]}
    assert all(charge == (update_s / period if period else 0.0) for charge, period, update_s, _ in after)


# ---------------------------------------------------------------------------------------------- the profile
@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("method", ["eagle", "auto"])
def test_a_decoder_times_an_update_once_into_its_profile(tiny, monkeypatch, method, broken):
    """A Decoder given a profile without the update's cost times one update when it is built and keeps it in its
    profile; a Decoder given that profile times nothing and plans alike; requests price their updates from it
    (update_s_from "profile"), eagle's rounds from the profile's costs too, and two identical requests report the
    same schedule. Broken variant (the entry never found: timed by every Decoder) caught."""
    from multispec.decoding.decoder import Decoder
    from multispec.drafting import adapting
    from multispec.models import eagle_adapt

    target, head_dir = tiny
    options = dict(k=3) if method == "eagle" else dict(proposers="draft,lookup")
    if broken:
        monkeypatch.setattr(adapting, "valid_update_entry", lambda entry: False)
    first = Decoder(_pair(target), method, "hf", head=str(head_dir), profile=MachineProfile(), **ON, **options)
    keys = [k for k in first.profile.sections["costs"] if "||adapt rows=16 steps=1" in k]
    assert len(keys) == 1 and keys[0] == update_key(keys[0].rsplit("||adapt", 1)[0], first.policy.settings)
    update_s = first.profile.get("costs", keys[0])["update_s"]
    assert 0 < update_s < 10 and first.policy.view.update_s == update_s

    def timed_again(*args, **kwargs):
        raise AssertionError("the update was timed again")

    monkeypatch.setattr(eagle_adapt, "time_update", timed_again)
    check = pytest.raises(AssertionError, match="timed again") if broken else None
    if check is not None:
        with check:
            Decoder(_pair(target), method, "hf", head=str(head_dir), profile=first.profile, **ON, **options)
        return
    second = Decoder(_pair(target), method, "hf", head=str(head_dir), profile=first.profile, **ON, **options)
    reports = []
    for decoder in (first, second, second):
        ids, metrics = decoder.run([3, 1, 4, 1, 5] * 4, GREEDY, 48, 0)
        reports.append(decoder.stats(metrics, GREEDY)[method]["adapt"])
    for r in reports:
        assert r["update_s"] == update_s and r["update_s_from"] == "profile" and r["updates"] > 0
        assert r["rounds_priced"]  # (eagle's by the profile's costs, auto's by its own)
    same = ("updates", "rows", "period", "off_since", "why", "head_rounds", "changes")
    assert [{k: r[k] for k in same} for r in reports[1:]] == [{k: reports[0][k] for k in same}] * 2
