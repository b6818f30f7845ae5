"""Structured output through `multispec serve` (issue 39): OpenAI's response_format with the official client's
`chat.completions.parse` and a pydantic model, vLLM's structured_outputs and the older guided_* fields on
completions, streaming, every response equal to the offline result, and bad constraints answered 400 by field."""
from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pytest.importorskip("uvicorn")

from test_serve import ServerThread  # noqa: E402
from test_serve_openai import TEMPLATE, post  # noqa: E402

import multispec  # noqa: E402
from multispec.serve import ServeSettings, create_app  # noqa: E402

NAME = "default"


class Point(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=6)
    x: int = pydantic.Field(ge=0, le=99)
    ok: bool


@pytest.fixture(scope="module")
def pair():
    return multispec.load_pair()


@pytest.fixture(scope="module")
def server(pair):
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="auto", max_concurrent=2,
                                                    max_queue=16, chat_template=TEMPLATE)))
    yield s
    s.close()


def test_openai_client_parses_a_pydantic_model(server, pair):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    messages = [{"role": "user", "content": "def point():"}]
    r = client.chat.completions.parse(model=NAME, messages=messages, response_format=Point, max_tokens=60,
                                      temperature=0)
    point = r.choices[0].message.parsed
    assert isinstance(point, Point) and r.choices[0].finish_reason == "stop"
    offline = multispec.generate(pair, messages=messages, chat_template=TEMPLATE, max_new_tokens=60, temperature=0,
                                 json_schema=Point.model_json_schema())
    assert r.choices[0].message.content == offline.text


def test_structured_fields_on_completions_and_streaming(server, pair):
    prompt = "x = "
    for body, kw in [({"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}, {"regex": "[0-9]{3}-[a-z]{2}"}),
                     ({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}),
                     ({"response_format": {"type": "json_object"}}, {"json_schema": {"type": "object"}})]:
        out = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 40, "temperature": 0, **body})
        want = multispec.generate(pair, prompt, max_new_tokens=40, temperature=0, **kw)
        assert out["choices"][0]["text"] == want.text, body
    chunks = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "go"}], "max_tokens": 60, "temperature": 0, "stream": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p",
                                                                       "schema": Point.model_json_schema()}}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
    Point.model_validate_json("".join(chunks))


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "objec"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"structured_outputs": {"regex": "a("}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_json": {"type": "object"}, "ignore_eos": True}, "ignore_eos"),
    # legal, but past the grammar engine's limits / with no finite derivation: refused before generation
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(3000)}}}}}, "response_format"),
    ({"structured_outputs": {"grammar": 'start: x\nx: "a" x\n'}}, "structured_outputs"),
])
def test_bad_constraints_are_400s_naming_the_field(server, body, param):
    out = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 4, **body}, status=400)
    assert out["error"]["param"] == param, out


def test_a_grammar_that_dead_ends_mid_generation_is_a_400_not_a_500(server):
    """Past the first tokens the grammar engine hits its limit: the request ends with one clear error naming the
    field, never a 500 or an output labelled stop."""
    out = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 8, "structured_outputs": {
        "grammar": 'start: ("b" | "c") x\nx: "a" x\n'}}, status=400)
    assert out["error"]["param"] == "structured_outputs" and "grammar" in out["error"]["message"], out
