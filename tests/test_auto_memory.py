"""auto's acceptance statistics kept across generations and processes (drafting/auto/memory.py, issue 38).

A first process generates with auto and saves what it learned; a second process reads it and plans its first round
from it (a different plan than the priors give); a malformed file is ignored with one warning and rebuilt. The
blend is halfway, the key separates pairs and temperature ranges, and the output stays the target's own greedy text
whatever was stored (the statistics only shape plans).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multispec.drafting.auto import memory

TESTS = Path(__file__).resolve().parent
SRC = str(TESTS.parent / "src")

# One process: the same tiny model as target and draft (greedy acceptance 1), auto with fixed costs in which a
# draft step is cheap, so the plan follows acceptance alone. argv: n_new, fresh_start (0/1). Prints the plans used.
SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("always")
from helpers import tiny_llama
from engine_utils import greedy_reference
from multispec.drafting.auto import AutoPolicy
from multispec.drafting.costs import BUCKETS, CostCurve, CostModel
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_method
from multispec.models import make_backend
from multispec.sampling import SamplingConfig

n_new, fresh = int(sys.argv[1]), sys.argv[2] == "1"
model = tiny_llama(vocab=8, hidden=16, layers=1, heads=2, kv_heads=1, seed=3, scale=3.0)
costs = CostModel(CostCurve([0.010 + 0.0002 * (b - 1) for b in BUCKETS]),
                  CostCurve([0.0005 * (1 + 0.1 * (b - 1)) for b in BUCKETS]))
policy = AutoPolicy(proposers=("draft",), cost_model=costs, memory=not fresh)
prompt = [1, 2, 3]
ids, _ = generate_ids(make_backend(model), make_backend(model), prompt, build_method("auto"),
                      SamplingConfig(temperature=0.0), n_new, 0, set(), policy=policy)
assert ids == greedy_reference(model, prompt, n_new), "auto's greedy output differs from the target's"
plans = policy.report()["plans"]
print(json.dumps({"plans": plans, "first": next(iter(policy.usage))}))
"""


def _run(cache: Path, n_new: int, fresh: bool = False) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(TESTS)]), "OMP_NUM_THREADS": "1",
           "MULTISPEC_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(n_new), "1" if fresh else "0"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_a_second_process_plans_its_first_round_from_what_the_first_learned(tmp_path):
    cache = tmp_path / "cache"
    fresh, _ = _run(cache, 1, fresh=True)  # the priors' first plan
    assert not (cache / memory.FILE).exists(), "fresh_start must not store statistics"
    _run(cache, 40)  # learns: every draft token is accepted
    stored = json.loads((cache / memory.FILE).read_text())
    (entry,) = stored.values()
    assert entry["draft"]["1,1"][0] > 0.9 * entry["draft"]["1,1"][1]  # depth 1, rank 1: (nearly) always accepted
    assert set(entry) == {"draft", "lookup", "suffix", "confidence", "realised", "probe"}
    second, _ = _run(cache, 1)
    assert second["first"] != fresh["first"], (second, fresh)
    learned = second["plans"][second["first"]]["predicted_tokens_per_s"]
    prior = fresh["plans"][fresh["first"]]["predicted_tokens_per_s"]
    assert learned > 1.2 * prior  # it expects (and plans for) much more acceptance than the priors


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", None])
def test_malformed_statistics_are_ignored_with_one_warning_and_rebuilt(tmp_path, content):
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / memory.FILE
    if content is None:  # a JSON object with a malformed entry under the very key this pair uses
        _run(cache, 5)
        (key,) = json.loads(path.read_text())
        path.write_text(json.dumps({key: {"draft": {"1,1": [-1, "x"]}}}))
    else:
        path.write_bytes(content)
    result, stderr = _run(cache, 5)
    assert stderr.count("ignoring auto's acceptance statistics") == 1, stderr
    assert "Traceback" not in stderr
    rebuilt = json.loads(path.read_text())
    assert all(memory.valid_entry(e) for e in rebuilt.values()) and len(rebuilt) == 1


def test_the_blend_moves_halfway_and_keys_separate_pairs_and_temperatures(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(memory, "_MEMORY", {})
    monkeypatch.setattr(memory._WRITES, "dirty", set())
    k0 = memory.key("t|1", "d|1", "draft", 0.0)
    assert memory.save(k0, {"draft": {"1,1": [4.0, 8.0]}, "suffix": [1.0, 2.0]}) == {
        "draft": {"1,1": [4.0, 8.0]}, "suffix": [1.0, 2.0]}
    after = memory.save(k0, {"draft": {"1,1": [8.0, 8.0], "2,1": [2.0, 4.0]}, "suffix": [3.0, 2.0]})
    assert after == {"draft": {"1,1": [6.0, 8.0], "2,1": [1.0, 2.0]}, "suffix": [2.0, 2.0]}
    memory.flush()  # (a process writes at most every WRITE_EVERY_S seconds, and at exit)
    monkeypatch.setattr(memory, "_MEMORY", {})  # a new process reads the disk
    assert memory.load(k0) == after
    assert len({k0, memory.key("t|1", "d|1", "draft", 0.7), memory.key("t|1", "d|1", "draft", 1.0),
                memory.key("t|1", "d|2", "draft", 0.0), memory.key("t|1", "d|1", "head", 0.0)}) == 5
    assert memory.key("t|1", "d|1", "draft", 0.95) == memory.key("t|1", "d|1", "draft", 1.5)


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




def test_the_probes_back_off_carries_to_the_next_request(tmp_path, monkeypatch):
    """The probe period reached (and the plain steps towards the next probe) are stored with the statistics and
    restored by the next generation of the pair, which then probes on that schedule instead of every 8 rounds."""
    from multispec.drafting.auto import AutoPolicy

    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(memory, "_MEMORY", {})
    monkeypatch.setattr(memory._WRITES, "dirty", set())
    monkeypatch.setattr(memory, "model_identity", lambda model: f"id-{id(model)}")
    target, draft = object(), object()
    first = AutoPolicy(proposers=("draft",))
    first._recall(target, draft, 1.0)
    first.probe_level, first.ar_streak = 4, 37
    first.finish([1, 2, 3])
    second = AutoPolicy(proposers=("draft",))
    second._recall(target, draft, 1.0)
    assert (second.probe_level, second.ar_streak) == (4, 37)
    second.probe_level, second.ar_streak = 5, 3  # a schedule, not a statistic: the latest wins (no blend)
    second.finish([1, 2, 3])
    third = AutoPolicy(proposers=("draft",))
    third._recall(target, draft, 1.0)
    assert (third.probe_level, third.ar_streak) == (5, 3)
    other = AutoPolicy(proposers=("draft",))
    other._recall(target, draft, 0.0)  # another temperature range: its own schedule
    assert (other.probe_level, other.ar_streak) == (0, 0)

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
