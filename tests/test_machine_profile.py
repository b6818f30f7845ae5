"""The machine profile (multispec/profile.py): what a run does depends only on what it is given.

A Decoder measures what its profile lacks when it is built, never inside a generation; auto plans from the
profile and from its own rounds' acceptance, not from timings, so identical seeded runs plan alike in one process
and in two processes given the same profile file. Runs report observations; only an explicit call folds them into
a new profile (acceptance blended halfway, the probes' schedule replaced) and saves it; a second process given
that file plans its first round from it. A damaged default file is ignored with one warning, a damaged given file
refused in one line.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multispec.drafting.auto import memory
from multispec.profile import MachineProfile

TESTS = Path(__file__).resolve().parent
SRC = str(TESTS.parent / "src")

# One process: the same tiny model as target and draft (greedy acceptance 1), auto with fixed costs in which a
# draft step is cheap, so the plan follows acceptance alone. argv: one or more runs, each n_new, fresh_start (0/1),
# profile in, profile out ("-": none), done one after another (each with its own policy, profile and backends).
# Prints the plans each run used, one line per run.
SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("always")
from helpers import tiny_llama
from engine_utils import greedy_reference
from multispec.decoding.profiles import updated
from multispec.drafting.auto import AutoPolicy
from multispec.drafting.auto.policy import AutoView
from multispec.drafting.costs import BUCKETS, CostCurve, CostModel
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_method
from multispec.models import make_backend
from multispec.profile import MachineProfile
from multispec.sampling import SamplingConfig

model = tiny_llama(vocab=8, hidden=16, layers=1, heads=2, kv_heads=1, seed=3, scale=3.0)
costs = CostModel(CostCurve([0.010 + 0.0002 * (b - 1) for b in BUCKETS]),
                  CostCurve([0.0005 * (1 + 0.1 * (b - 1)) for b in BUCKETS]))
for n_new, fresh, src, dst in zip(*[iter(sys.argv[1:])] * 4):
    n_new, fresh = int(n_new), fresh == "1"
    profile = MachineProfile.load(src) if src != "-" else MachineProfile()
    policy = AutoPolicy(proposers=("draft",), cost_model=costs, memory=not fresh)
    policy.use_profile(AutoView(None, profile.sections["acceptance"], ("tiny", "tiny")))
    prompt = [1, 2, 3]
    ids, _ = generate_ids(make_backend(model), make_backend(model), prompt, build_method("auto"),
                          SamplingConfig(temperature=0.0), n_new, 0, set(), policy=policy)
    assert ids == greedy_reference(model, prompt, n_new), "auto's greedy output differs from the target's"
    if dst != "-":
        obs = policy.observation()
        updated(profile, [obs] if obs else []).save(dst)
    plans = policy.report()["plans"]
    print(json.dumps({"plans": plans, "first": next(iter(policy.usage))}), flush=True)
"""


def _env(cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(TESTS)]), "OMP_NUM_THREADS": "1",
            "MULTISPEC_CACHE_DIR": str(cache)}


def _run(tmp: Path, *runs: tuple) -> list:
    """Each run (n_new, fresh_start, profile in, profile out) in order, in one new process: each run's result."""
    args = [str(a) for n_new, fresh, src, dst in runs for a in (n_new, "1" if fresh else "0", src, dst)]
    out = subprocess.run([sys.executable, "-c", SCRIPT, *args],
                         env=_env(tmp / "cache"), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()[-len(runs):]
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_a_second_process_plans_its_first_round_from_the_profile_the_first_saved(tmp_path):
    """Two processes (four until the suite passed 15 minutes; an interpreter with torch costs seconds): the first
    runs fresh_start and then learns, saving each profile; the second first runs with no profile (the priors
    again: neither the first process nor the cache folder it used changed them behind its back), then plans from
    the profile the first process saved. Each run has its own policy, profile and backends."""
    fresh, _ = _run(tmp_path, (1, True, "-", tmp_path / "fresh.json"),  # the priors' first plan
                    (40, False, "-", tmp_path / "learned.json"))  # learns: every draft token is accepted
    assert MachineProfile.load(tmp_path / "fresh.json").sections["acceptance"] == {}, \
        "fresh_start must not observe acceptance"
    (entry,) = MachineProfile.load(tmp_path / "learned.json").sections["acceptance"].values()
    assert entry["draft"]["1,1"][0] > 0.9 * entry["draft"]["1,1"][1]  # depth 1, rank 1: (nearly) always accepted
    assert set(entry) == {"draft", "lookup", "suffix_rate", "confidence", "realised", "probe"}
    again, second = _run(tmp_path, (1, False, "-", "-"), (1, False, tmp_path / "learned.json", "-"))
    assert again["first"] == fresh["first"]  # no profile given: the priors again
    assert second["first"] != fresh["first"], (second, fresh)
    learned = second["plans"][second["first"]]["predicted_tokens_per_s"]
    prior = fresh["plans"][fresh["first"]]["predicted_tokens_per_s"]
    assert learned > 1.2 * prior  # it expects (and plans for) much more acceptance than the priors


@pytest.fixture(scope="module")
def pair():
    import multispec

    return multispec.load_pair()


def _plans(result) -> list:
    return [(k, v["rounds"], v["tokens"]) for k, v in result.stats["auto"]["plans"].items()]


DETERMINISM = r"""
import json, sys, torch
torch.set_num_threads(1)
import multispec
from multispec.profile import MachineProfile
pair = multispec.load_pair()
profile = MachineProfile.load(sys.argv[1])
out = []
for t in (0.0, 1.0):
    r = multispec.generate(pair, "def fibonacci(n):", method="auto", max_new_tokens=48, temperature=t, seed=7,
                           profile=profile)
    out.append([r.token_ids, [(k, v["rounds"], v["tokens"]) for k, v in r.stats["auto"]["plans"].items()],
                r.stats["profile"]])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_identical_seeded_runs_plan_alike_in_one_process_and_across_processes(pair, tmp_path):
    """Same tokens, same plan sequence and round counts: twice in this process, and in another process given the
    same profile file (two others until the suite passed 15 minutes: each equal to this process's runs, so equal
    to each other). The check is not blind to plans: a profile with other costs plans otherwise."""
    import multispec
    from multispec.decoding.decoder import Decoder

    profile = Decoder(pair, "auto", profile=MachineProfile()).profile  # this pair's entries alone, measured now
    profile.save(tmp_path / "p.json")
    runs = []
    for _ in range(2):
        for t in (0.0, 1.0):
            r = multispec.generate(pair, "def fibonacci(n):", method="auto", max_new_tokens=48, temperature=t,
                                   seed=7, profile=profile)
            runs.append([r.token_ids, _plans(r), r.stats["profile"]])
    assert runs[:2] == runs[2:]
    assert runs[0][2] == profile.digest
    proc = subprocess.run([sys.executable, "-c", DETERMINISM, str(tmp_path / "p.json")], env=_env(tmp_path / "c"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == json.loads(json.dumps(runs[:2]))
    # sensitivity: a profile in which the draft is dear (what another machine would have measured) plans otherwise
    dear = {k: {**e, "draft": [20 * x for x in e["draft"]]} for k, e in profile.sections["costs"].items()}
    other = profile.with_entries("costs", dear)
    r = multispec.generate(pair, "def fibonacci(n):", method="auto", max_new_tokens=48, temperature=0.0, seed=7,
                           profile=other)
    assert r.token_ids == runs[0][0] and _plans(r) != runs[0][1] and r.stats["profile"] == other.digest


def test_auto_never_times_a_forward_inside_a_generation(pair):
    """Every target forward of a generation is one of its rounds (or the prefill): the costs were measured when
    the Decoder was built. The broken variant (a policy without its profile view measures at the start of the
    generation, as auto did before) is caught by the same count."""
    from multispec.decoding.decoder import Decoder

    calls = []

    def counting(backend):
        forward = backend.forward

        def counted(*args, **kwargs):
            calls.append(1)
            return forward(*args, **kwargs)
        backend.forward = counted
        return backend

    decoder = Decoder(pair, "auto", wrap_target=counting)
    for broken in (False, True):
        if broken:
            decoder.policy.view = None
        calls.clear()
        r = decoder.generate("def fibonacci(n):", max_new_tokens=32, temperature=0.0)
        rounds = sum(p["rounds"] for p in r.stats["auto"]["plans"].values())
        assert (len(calls) == rounds + 1) != broken, (len(calls), rounds)  # + 1: the prefill


def test_a_decoder_writes_nothing_and_changes_no_given_profile(pair, tmp_path, monkeypatch):
    """Given a profile, a Decoder leaves its file and the value as they were and writes no default profile; the
    default profile gains only what a Decoder measured because it lacked it, never what runs observed."""
    from multispec.decoding.decoder import Decoder

    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    first = Decoder(pair, "auto")  # the default profile: measured now, added to the default file
    default = MachineProfile.default()
    assert default.digest == first.profile.digest and default.sections["costs"]
    first.generate("def f(x):", max_new_tokens=16, temperature=0.0)
    assert MachineProfile.default().digest == default.digest  # the run's observations are not saved
    path = tmp_path / "pinned.json"
    given = MachineProfile().save(path)
    before = path.read_bytes()
    d = Decoder(pair, "auto", profile=str(given))
    d.generate("def f(x):", max_new_tokens=16, temperature=0.0)
    assert path.read_bytes() == before and MachineProfile.default().digest == default.digest
    assert d.profile.sections["costs"] and MachineProfile.load(path).sections["costs"] == {}
    assert len(d.observations) == 1 and d.updated_profile().sections["acceptance"]


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"multispec_profile": 1, "costs": 3}'])
def test_a_damaged_default_profile_is_ignored_with_one_warning_and_a_given_one_refused(pair, tmp_path, monkeypatch,
                                                                                      content):
    from multispec.decoding.decoder import Decoder
    from multispec.errors import MultispecError

    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path))
    import multispec.paths as paths

    monkeypatch.setattr(paths, "_WARNED", set())
    MachineProfile.default_path().parent.mkdir(parents=True, exist_ok=True)
    MachineProfile.default_path().write_bytes(content)
    with pytest.warns(RuntimeWarning, match="profile") as caught:
        d = Decoder(pair, "auto")
    assert len([w for w in caught if "profile" in str(w.message)]) == 1
    assert d.profile.sections["costs"] and MachineProfile.default().sections["costs"]  # measured and rebuilt
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(MultispecError, match="profile") as e:
        Decoder(pair, "auto", profile=str(bad))
    assert "\n" not in str(e.value)


def test_a_damaged_costs_entry_is_measured_again(pair, tmp_path):
    from multispec.decoding.decoder import Decoder

    good = Decoder(pair, "auto", profile=MachineProfile()).profile
    (key,) = good.sections["costs"]
    bad = good.with_entries("costs", {key: {"target": [-1.0], "draft": None}})
    with pytest.warns(RuntimeWarning, match="not a valid calibration"):
        d = Decoder(pair, "auto", profile=bad)
    assert d.profile.sections["costs"][key]["target"][0] > 0


def test_the_blend_moves_halfway_and_keys_separate_pairs_and_temperatures():
    from multispec.decoding.profiles import updated

    k0 = memory.key("t|1", "d|1", "draft", 0.0)
    one = updated(MachineProfile(), [{"acceptance": {k0: {"draft": {"1,1": [4.0, 8.0]}, "suffix": [1.0, 2.0]}}}])
    assert one.get("acceptance", k0) == {"draft": {"1,1": [4.0, 8.0]}, "suffix": [1.0, 2.0]}
    two = updated(one, [{"acceptance": {k0: {"draft": {"1,1": [8.0, 8.0], "2,1": [2.0, 4.0]}, "suffix": [3.0, 2.0]}}}])
    assert two.get("acceptance", k0) == {"draft": {"1,1": [6.0, 8.0], "2,1": [1.0, 2.0]}, "suffix": [2.0, 2.0]}
    assert one.get("acceptance", k0) == {"draft": {"1,1": [4.0, 8.0]}, "suffix": [1.0, 2.0]}  # values never change
    assert len({k0, memory.key("t|1", "d|1", "draft", 0.7), memory.key("t|1", "d|1", "draft", 1.0),
                memory.key("t|1", "d|2", "draft", 0.0), memory.key("t|1", "d|1", "head", 0.0)}) == 5
    assert memory.key("t|1", "d|1", "draft", 0.95) == memory.key("t|1", "d|1", "draft", 1.5)


def test_the_probes_back_off_carries_to_the_next_request_through_the_profile():
    """The probe period reached (and the plain steps towards the next probe) go into the new profile and are
    restored by the next generation given it, which then probes on that schedule instead of every 8 rounds."""
    from multispec.decoding.profiles import updated
    from multispec.drafting.auto import AutoPolicy
    from multispec.drafting.auto.policy import AutoView

    def policy(profile):
        p = AutoPolicy(proposers=("draft",))
        p.use_profile(AutoView(None, profile.sections["acceptance"], ("t", "d")))
        p.has_draft = True
        return p

    first = policy(MachineProfile())
    first.memory_key = memory.recall(first, first.view, 1.0, 6)
    first.probe_level, first.ar_streak = 4, 37
    first.finish([1, 2, 3])
    profile = updated(MachineProfile(), [first.observation()])
    second = policy(profile)
    second.memory_key = memory.recall(second, second.view, 1.0, 6)
    assert (second.probe_level, second.ar_streak) == (4, 37)
    second.probe_level, second.ar_streak = 5, 3  # a schedule, not a statistic: the latest wins (no blend)
    second.finish([1, 2, 3])
    profile = updated(profile, [second.observation()])
    third = policy(profile)
    third.memory_key = memory.recall(third, third.view, 1.0, 6)
    assert (third.probe_level, third.ar_streak) == (5, 3)
    other = policy(profile)
    other.memory_key = memory.recall(other, other.view, 0.0, 6)  # another temperature range: its own schedule
    assert (other.probe_level, other.ar_streak) == (0, 0)


def test_realised_rates_correct_a_family_towards_what_its_rounds_did():
    from multispec.drafting.auto.acceptance import REALISED_CLAMP, RealisedRates
    from multispec.drafting.auto.policy import family
    from multispec.drafting.protocol import RoundPlan
    from multispec.tree import Tree

    rates = RealisedRates()
    assert rates.factor("draft chain") == 1.0  # no evidence: the cost model is taken at its word
    for _ in range(60):
        rates.add("draft chain", 0.010, 0.016)  # its rounds take 1.6x the seconds predicted
        rates.add("ar", 0.010, 0.010)  # as predicted
    assert 0.6 < rates.factor("draft chain") < 0.7 and rates.factor("ar") == 1.0
    rates.add("lookup", 1.0, 0.001)
    assert rates.factor("lookup") == REALISED_CLAMP[1]
    plans = {"ar": RoundPlan(Tree.chain(0), "none", label="ar"),
             "draft chain": RoundPlan(Tree.chain(12), "draft", label="draft chain (probe)"),
             "draft tree": RoundPlan(Tree((-1, 0, 0)), "draft", label="draft tree 2"),
             "head chain": RoundPlan(Tree.chain(12), "head", label="head chain"),
             "lookup": RoundPlan(Tree.chain(3), "lookup", label="lookup 3"),
             "suffix": RoundPlan(Tree.chain(2), "suffix", label="suffix 2")}
    assert {k: family(p) for k, p in plans.items()} == {k: k for k in plans}


def test_the_profile_cli_measures_shows_and_resets(capsys, tmp_path, monkeypatch):
    from helpers import assert_one_line_error, run_cli

    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "p.json"
    code, stdout, err = run_cli(capsys, "profile", "measure", "--out", str(out), "--max-new-tokens", "8")
    assert code == 0, err
    shown = json.loads(stdout)
    assert shown["costs"] == 1 and shown["acceptance"] >= 1
    code, stdout, _ = run_cli(capsys, "profile", "show", "--profile", str(out))
    assert code == 0 and json.loads(stdout)["digest"] == MachineProfile.load(out).digest
    code, stdout, err = run_cli(capsys, "generate", "def f(x):", "--profile", str(out), "--max-new-tokens", "4",
                                "--temperature", "0", "--json")
    assert code == 0, err
    assert json.loads(stdout)["profile"] == MachineProfile.load(out).digest
    code, _, err = run_cli(capsys, "generate", "def f(x):", "--profile", str(tmp_path / "none.json"))
    assert code == 2 and "none.json" in err
    (tmp_path / "notdir").write_text("x")
    code, _, err = run_cli(capsys, "profile", "measure", "--out", str(tmp_path / "notdir" / "p.json"))
    assert_one_line_error(code, err, "is not a folder")
    code, _, err = run_cli(capsys, "profile", "measure", "--temperatures", "0,hot", "--out", str(out))
    assert_one_line_error(code, err, "--temperatures")
    code, stdout, _ = run_cli(capsys, "profile", "reset", "--profile", str(out))
    assert code == 0 and not out.exists()


@pytest.mark.parametrize("spec, says", [("auto:fresh_start=2", "fresh_start must be a boolean"),
                                        ("auto:fresh_starts=1", "does not take option(s) fresh_starts")])
def test_a_bad_fresh_start_value_is_refused_in_one_line(capsys, tmp_path, spec, says):
    """`auto:fresh_start` takes a flag (1/0, true/false); anything else, or a misspelt name, is refused before any
    model loads or output is written: one line, exit 2 (bench specs), a MultispecError (the API)."""
    from helpers import assert_one_line_error, run_cli

    from multispec import generate, load_pair
    from multispec.errors import MultispecError

    code, _, err = run_cli(capsys, "bench", "--methods", spec, "--limit", "1", "--out", str(tmp_path / "b"))
    assert_one_line_error(code, err, says)
    assert not (tmp_path / "b").exists()
    option = spec.split(":")[1].split("=")
    with pytest.raises(MultispecError, match=says.replace("(", r"\(").replace(")", r"\)")):
        generate(load_pair(), "def f(x):", method="auto", max_new_tokens=2, **{option[0]: option[1]})


def test_a_server_keeps_what_it_observed_only_on_the_default_profile(pair, tmp_path, monkeypatch):
    """At shutdown a server on the default profile saves it with its requests' acceptance folded in; a server given
    a profile writes nothing anywhere."""
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    body = {"model": "m", "prompt": "def f(x):", "max_tokens": 12, "temperature": 0}
    pinned = MachineProfile()
    with TestClient(create_app(pair, ServeSettings(model_name="m", method="auto", profile=pinned))) as client:
        assert client.post("/v1/completions", json=body).status_code == 200
    assert not MachineProfile.default_path().exists()
    with TestClient(create_app(pair, ServeSettings(model_name="m", method="auto"))) as client:
        measured = MachineProfile.default()  # what the Decoder measured at start-up
        assert measured.sections["costs"] and not measured.sections["acceptance"]
        assert client.post("/v1/completions", json=body).status_code == 200
    saved = MachineProfile.default()
    assert saved.sections["acceptance"] and saved.sections["costs"].keys() == measured.sections["costs"].keys()


def test_many_runs_timed_against_one_profile_move_its_costs_once():
    """Sixty runs, each timing the target 1.37x its profile's curve, move the curve by 1.37 ** 0.5 (the blend),
    once: they were all timed against the same costs. Folding them one after another into successive profiles
    (the broken variant) compounds the move sixty-fold."""
    from multispec.decoding.profiles import updated
    from multispec.drafting.costs import BUCKETS

    entry = {"target": [0.01 * (i + 1) for i in range(len(BUCKETS))], "draft": None,
             "overhead": {"round_s": 1e-4, "level_s": 1e-4}}
    base = MachineProfile().with_entries("costs", {"k": entry})
    obs = [{"costs": {"k": {"timed": {"target": [1.37, 128]}, "overhead": {"round_s": 1e-4, "level_s": 1e-4}}}}] * 60
    moved = updated(base, obs).get("costs", "k")["target"][0] / 0.01
    assert moved == pytest.approx(1.37 ** 0.5)
    broken = base
    for o in obs:
        broken = updated(broken, [o])
    assert broken.get("costs", "k")["target"][0] / 0.01 > 1e3


@pytest.mark.parametrize("max_batch", [1, 2])
def test_a_learning_server_plans_each_request_from_what_the_earlier_ones_observed(pair, max_batch):
    """With profile learning (the server's default) each finished request's acceptance is folded into the profile
    the next ones plan from, and every response names the digest it was planned from: the first the start-up
    profile's, each next one newer, and every policy of the server (the batch's slots too) plans from the newest.
    Off (the library's behaviour): every request plans from the start-up profile, which keeps no acceptance."""
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    body = {"model": "m", "prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0}
    for learning in (True, False):
        app = create_app(pair, ServeSettings(model_name="m", method="auto", profile=MachineProfile(),
                                             max_batch=max_batch, profile_learning=learning))
        machine = app.state.scheduler.decoder.machine
        start = machine.profile.digest
        with TestClient(app) as client:
            digests = [client.post("/v1/completions", json=body).json()["spec_decode"]["profile"] for _ in range(3)]
        assert digests[0] == start
        assert len(set(digests)) == (3 if learning else 1)
        assert (machine.profile.digest != start) == learning == bool(machine.auto_view.acceptance)
        assert machine.auto_view.acceptance == machine.profile.sections["acceptance"]
        policies = list(machine._policies)
        assert policies and all(p.view is machine.auto_view for p in policies)
