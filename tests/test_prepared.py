"""One prepared request: `Decoder.prepare` checks and defaults a request once (its grammar compiled once, through
the server too), nothing downstream checks it again, and SamplingParams is the one list of sampling fields that
the API, the server's request bodies and the CLI's flags are made from."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

import multispec
from multispec import MultispecError
from multispec.decoding.batch_offline import generate_batch
from multispec.decoding.decoder import Decoder
from multispec.params import FIELDS, SamplingParams


@pytest.fixture(scope="module")
def pair():
    return multispec.load_pair()


@pytest.fixture
def binds(monkeypatch):
    """Counts the grammar compilations (structured.bind, as the Decoder's request_grammar calls it)."""
    import multispec.decoding.grammar as grammar

    calls = []
    real = grammar.bind

    def counted(*args, **kwargs):
        calls.append(args[0].kind)
        return real(*args, **kwargs)

    monkeypatch.setattr(grammar, "bind", counted)
    return calls


def test_the_server_compiles_a_grammar_once_per_request(pair, binds):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    def rechecking(decoder, prepared, **kw):  # the old worker: generate() checks the request again
        return decoder.generate(list(prepared.prompt_ids), prepared.params.replace(seed=prepared.seed), **kw)

    body = {"prompt": "x = ", "max_tokens": 8, "temperature": 0, "guided_regex": "[0-9]{3}"}
    template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with TestClient(create_app(pair, ServeSettings(model_name="m", method="ar", chat_template=template))) as client:
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert binds == ["regex"]
        binds.clear()
        r = client.post("/v1/completions", json={**body, "n": 2, "prompt": ["x = ", "y = "]})  # 4 generations
        assert r.status_code == 200 and len(r.json()["choices"]) == 4, r.text
        assert binds == ["regex"]
        binds.clear()
        chat = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 8, "temperature": 0,
                "response_format": {"type": "json_object"}}
        r = client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200 and binds == ["json_schema"], r.text
    binds.clear()
    with TestClient(create_app(pair, ServeSettings(model_name="m", method="ar"), generate_fn=rechecking)) as client:
        assert client.post("/v1/completions", json=body).status_code == 200
    assert binds == ["regex", "regex"]  # what the counter sees when the worker checks again


def test_prepare_is_run_without_checking_again(pair, binds, monkeypatch):
    decoder = Decoder(pair, "sd")
    prepared = decoder.prepare("x = ", SamplingParams(max_new_tokens=6, temperature=1.0, regex="[0-9]+"))
    assert binds == ["regex"] and isinstance(prepared.seed, int) and prepared.max_new_tokens == 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        prepared.seed = 1  # type: ignore[misc]
    monkeypatch.setattr(decoder, "check_request", lambda params: pytest.fail("checked again"))
    a, b = decoder.run_prepared(prepared), decoder.run_prepared(prepared)
    assert a.token_ids == b.token_ids and a.stats["seed"] == prepared.seed and binds == ["regex"]
    assert a.text.isdigit() or a.text == ""


def test_a_batch_prepares_every_prompt_before_any_decodes(pair, binds, monkeypatch):
    decoder = Decoder(pair, "ar")
    monkeypatch.setattr(decoder, "run", lambda *a, **k: pytest.fail("a prompt decoded before all were checked"))
    prompts = [[1, 2, 3]] * 5 + [[1, 10**9]]
    with pytest.raises(MultispecError, match=r"prompts\[5\]"):
        generate_batch(decoder, prompts, SamplingParams(max_new_tokens=2, regex="[0-9]+"), batch_size=1)
    assert binds == ["regex"]  # one compilation for the whole batch


def test_generate_takes_the_fields_of_sampling_params_as_keywords(pair):
    assert not FIELDS & set(inspect.signature(multispec.generate).parameters)  # one list of fields: params.py
    out = multispec.generate(pair, "x", method="sd", max_new_tokens=3, temperature=0, min_tokens=2, k=2)
    assert out.stats["method"] == "sd" and len(out.token_ids) >= 2
    with pytest.raises(MultispecError, match="did you mean temperature"):
        multispec.generate(pair, "x", temprature=0.5)
    with pytest.raises(MultispecError, match="does not take|no option|option"):
        multispec.generate(pair, "x", method="ar", tree=(2, 1))


def test_the_wire_alias_table_names_sampling_params_fields():
    from multispec.serve.protocol import (CARRIED_OTHERWISE, SAMPLING_WIRE, WIRE_ALIASES, ChatCompletionRequest,
                                          CompletionRequest)

    assert set(WIRE_ALIASES.values()) <= FIELDS and set(CARRIED_OTHERWISE) <= FIELDS
    assert set(SAMPLING_WIRE) | set(CARRIED_OTHERWISE) == FIELDS  # every field reaches the wire one way
    for model in (CompletionRequest, ChatCompletionRequest):
        assert set(SAMPLING_WIRE) <= set(model.model_fields)
        assert {a for a in WIRE_ALIASES if a != "top_logprobs"} <= set(model.model_fields)
    assert "top_logprobs" in ChatCompletionRequest.model_fields


def test_the_cli_sampling_flags_are_the_fields_of_sampling_params():
    from multispec.cli.chat_cmd import chat_command
    from multispec.cli.generate_cmd import generate_command

    with_flag = {f.name for f in dataclasses.fields(SamplingParams) if f.metadata["cli"] is not False}
    assert {"temperature", "top_k", "seed", "stop", "json_schema", "reproducible"} <= with_flag
    for command in (generate_command, chat_command):
        assert with_flag <= {p.name for p in command.params}
