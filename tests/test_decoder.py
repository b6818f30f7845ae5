"""The Decoder and the method registry: a method registered from here (no other file edited) runs through
`generate`, `bench` and `serve`; the server reads trained heads once; generate's stats, the bench record and the
server's spec_decode come from the one metrics record."""
from __future__ import annotations

import pytest

from helpers import save_tiny_pair
from multispec import generate, load_pair
from multispec.decoding.decoder import Decoder
from multispec.decoding.methods import MethodConfig, MethodEntry, build_method, register, unregister
from multispec.decoding.metrics import SPEC_DECODE_KEYS
from multispec.drafting.policies import FixedTree
from multispec.errors import MultispecError

PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = save_tiny_pair(tmp_path_factory.mktemp("decoder_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


@pytest.fixture
def chain2():
    """A tiny method: a fixed draft chain of k = 2, verified by `block`. One registry entry, one policy."""
    from multispec.tree import Tree

    entry = MethodEntry(
        name="chain2", options=frozenset(),
        build=lambda o: MethodConfig(name="chain2", tree=(1, 1), verifier="block", options=o),
        make_policy=lambda config, pair, loaded: FixedTree(Tree.chain(2)),
        summary="test: a fixed chain of two draft tokens")
    register(entry)
    yield entry
    unregister("chain2")


def test_a_method_registered_from_a_test_runs_through_generate_bench_and_serve(pair, chain2, tmp_path):
    ar = generate(pair, PROMPT, method="ar", max_new_tokens=16, temperature=0.0)
    mine = generate(pair, PROMPT, method="chain2", max_new_tokens=16, temperature=0.0)
    assert mine.token_ids == ar.token_ids and mine.stats["method"] == "chain2"
    assert mine.stats["num_spec_steps"] > 0 and mine.stats["lossless"]
    sampled = generate(pair, PROMPT, method="chain2", max_new_tokens=8, temperature=1.0, seed=3)
    assert sampled.stats["verifier"] == "block" and sampled.stats["lossless"]

    from multispec.bench import run_bench

    res = run_bench(pair=pair, methods="ar;chain2", datasets=_prompts_file(tmp_path), max_new_tokens=8, warmup=0, progress=False, out=None)
    rows = {r["method"]: r for r in res["records"]}
    assert rows["chain2"]["same_as_ar"] is True and rows["chain2"]["num_spec_steps"] > 0

    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    with TestClient(create_app(pair, ServeSettings(model_name="tiny", method="chain2"))) as client:
        r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                                 "return_token_ids": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["token_ids"] == ar.token_ids and body["spec_decode"]["method"] == "chain2"
    with pytest.raises(MultispecError, match="unknown method 'chain2'"):
        unregister("chain2"), build_method("chain2")


def _prompts_file(tmp_path) -> str:
    import json

    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in [PROMPT, "for n in range(2):"]))
    return str(path)


def test_stats_bench_record_and_spec_decode_come_from_one_metrics_record(pair, tmp_path):
    """One run of each (same prompt, greedy, same method): every spec-decode figure agrees, under one name."""
    lib = generate(pair, PROMPT, method="sd", k=3, max_new_tokens=16, temperature=0.0, seed=0)
    from multispec.bench import run_bench

    res = run_bench(pair=pair, methods="sd:k=3", datasets=_prompts_file(tmp_path), limit=1,
                    max_new_tokens=16, warmup=0, progress=False)
    rec = res["records"][0]
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    with TestClient(create_app(pair, ServeSettings(model_name="tiny", method="sd", method_options={"k": 3}))) as c:
        spec = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 16, "temperature": 0}).json()[
            "spec_decode"]
    for key in SPEC_DECODE_KEYS + ("new_tokens", "target_calls", "draft_calls", "rounds", "tau", "drafted_tokens"):
        if key in spec:
            assert spec[key] == lib.stats[key], key
        assert rec[key] == lib.stats[key], key
    assert spec["model"] == lib.stats["model"] == pair.models  # what was loaded, named
    assert lib.stats["model"]["target"]["path"] == pair.target_path
    # no duplicated figures under two names
    for old in ("accepted_tokens", "acceptance_rate", "accepted", "drafted_depth", "num_drafts", "accepted_per_pos"):
        assert old not in lib.stats and old not in rec


def test_the_server_builds_one_decoder_per_worker_and_reads_the_head_once(pair, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    import multispec.heads.acceptance as acceptance
    from multispec.serve import ServeSettings, create_app

    hidden = int(pair.draft.config.hidden_size)
    head_dir = acceptance.save_head(acceptance.AcceptanceHead(hidden, 1, False), tmp_path / "head")
    real, loads = acceptance.load_head, []
    monkeypatch.setattr(acceptance, "load_head", lambda *a, **k: (loads.append(a), real(*a, **k))[1])
    settings = ServeSettings(model_name="tiny", method="specdecpp", method_options={"head": str(head_dir)},
                             max_concurrent=3)
    app = create_app(pair, settings)
    decoders = app.state.scheduler.decoders
    assert len(loads) == 1 and len(decoders) == 3 and all(d.loaded is decoders[0].loaded for d in decoders)
    with TestClient(app) as client:
        for i in range(5):
            r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0})
            assert r.status_code == 200, r.text
    assert len(loads) == 1, "the head was read again after start-up"
    # generate builds a Decoder per call (and so reads the head each call); a Decoder reused reads it once
    d = Decoder(pair, "specdecpp", head=str(head_dir))
    for _ in range(3):
        d.generate(PROMPT, max_new_tokens=4, temperature=0.0)
    assert len(loads) == 2
    assert d.spawn().loaded is d.loaded and len(loads) == 2


def test_a_decoder_reused_gives_what_fresh_calls_give(pair):
    """Built once, run many times: the policy's adaptive state and the caches reset between runs (style §2.12),
    also when a later prompt needs a larger static cache."""
    d = Decoder(pair, "auto", backend="fast")
    for prompt, n in ((PROMPT, 8), ("for n in range(2):\n    print(n)\n" * 3, 24), (PROMPT, 8)):
        fresh = generate(pair, prompt, method="auto", backend="fast", max_new_tokens=n, temperature=0.0)
        again = d.generate(prompt, max_new_tokens=n, temperature=0.0)
        assert again.token_ids == fresh.token_ids
    a = d.generate(PROMPT, max_new_tokens=10, temperature=1.0, seed=5)
    b = Decoder(pair, "sd", k=2).generate(PROMPT, max_new_tokens=10, temperature=1.0, seed=5)
    assert a.stats["seed"] == b.stats["seed"] == 5


def test_the_decoder_is_reachable_from_the_package_without_loading_torch_first():
    import subprocess
    import sys

    code = ("import sys, multispec; assert 'torch' not in sys.modules; "
            "from multispec.decoding.decoder import Decoder; assert multispec.Decoder is Decoder")
    subprocess.run([sys.executable, "-c", code], check=True)
