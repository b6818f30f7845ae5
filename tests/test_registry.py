"""The built-in registries are explicit tuples (registry.ALL_METHODS, verify.ALL_VERIFIERS,
proposers.ALL_PROPOSERS): importing the method registry alone, in a fresh interpreter, lists every built-in method,
verifier and proposer, in their fixed order, without any module registering itself as it is imported."""
import json
import os
import subprocess
import sys
from pathlib import Path

METHODS = ["auto", "ar", "sd", "mcsd", "ti-mcsd", "dynamic", "specdecpp", "lookup", "suffix", "eagle"]
VERIFIERS = ["greedy", "sd", "mcns", "rrs", "rrs-wor", "kseq", "spechub", "greedy-md", "ot"]
PROPOSERS = ["none", "lookup", "suffix", "draft", "head", "head-dynamic"]

PROBE = """
import json, sys
import multispec.decoding.registry as registry
from multispec.drafting.proposers import ALL_PROPOSERS, PROPOSERS
from multispec.verify import ALL_VERIFIERS, REGISTRY
print(json.dumps({"methods": list(registry.method_names()), "all_methods": [e.name for e in registry.ALL_METHODS],
                  "verifiers": list(REGISTRY), "all_verifiers": [v.name for v in ALL_VERIFIERS],
                  "proposers": list(PROPOSERS), "all_proposers": [p.name for p in ALL_PROPOSERS]}))
"""


def test_importing_the_registry_alone_lists_every_builtin():
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["methods"] == got["all_methods"] == METHODS
    assert got["verifiers"] == got["all_verifiers"] == VERIFIERS
    assert got["proposers"] == got["all_proposers"] == PROPOSERS


def test_no_builtin_registers_itself_on_import():
    """register() is for a user's methods: no module of the package calls it (nor register_proposer)."""
    src = Path(__file__).resolve().parents[1] / "src" / "multispec"
    calls = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
             if line.lstrip().startswith(("register(", "register_proposer(")) or " register(" in line.split("#")[0]
             and "def register" not in line]
    assert calls == []


def test_register_adds_a_user_method_and_unregister_removes_it():
    from multispec.decoding.methods import MethodConfig, MethodEntry, get_method, method_names, register, unregister

    entry = MethodEntry("mine", (), lambda o: MethodConfig(name="mine"), lambda c, p, loaded: None,
                        needs_draft=False)
    register(entry)
    try:
        assert method_names()[-1] == "mine" and get_method("mine") is entry
    finally:
        unregister("mine")
    assert method_names() == tuple(METHODS)
