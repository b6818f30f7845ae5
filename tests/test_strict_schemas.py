"""Strict object schemas by default (issue 66, build 2): an object schema that declares properties and says nothing
about others takes only its declared keys (OpenAI's strict mode, vLLM's), at the root and nested; a schema that sets
additionalProperties keeps its choice; the server's `strict: false` keeps the schema's own JSON Schema meaning;
pydantic classes are schemas. Checked on the grammar itself (the embedded pair's tokenizer), no model run. The
broken variant (strictness off) lets the model write an undeclared key: the old behaviour, caught by the same tests."""
from __future__ import annotations

import types

import pytest

from multispec import structured
from multispec.structured import Constraint, bind

pydantic = pytest.importorskip("pydantic")

TWO = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}


class Person(pydantic.BaseModel):
    name: str
    n: int


@pytest.fixture(scope="module")
def tok():
    from importlib.resources import files

    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(files("multispec") / "default_pair" / "target"))


def extra_key_allowed(tok, schema, before: str, key: str = "extra") -> bool:
    """Whether the grammar of `schema` takes `before` (declared keys) then `, "<key>": 3}`. Where it does not, the
    token it refuses is one of `, "<key>"`: the declared part passes, the undeclared key is what is refused."""
    vocab = len(tok)
    grammar = bind(Constraint.of(json_schema=schema), tok, vocab, {tok.eos_token_id})
    head = tok(before, add_special_tokens=False)["input_ids"]
    key_part = tok(f', "{key}"', add_special_tokens=False)["input_ids"]
    rest = key_part + tok(": 3}", add_special_tokens=False)["input_ids"]
    taken = grammar.start().m.try_consume_tokens(head + rest)
    assert taken >= len(head), "the declared part itself was refused"
    if taken < len(head + rest):
        assert taken < len(head + key_part), "refused after the key, not at it"
    return taken == len(head + rest)


@pytest.fixture(params=[False, True], ids=["strict", "broken"])
def broken(request, monkeypatch):
    """broken: schemas taken as written (no closing): the behaviour before issue 66."""
    if request.param:
        monkeypatch.setattr(structured, "with_additional_properties", lambda schema, value: schema)
    return request.param


@pytest.mark.parametrize("schema,before", [
    (TWO, '{"a": 1'),  # at the root, after a declared key
    ({"type": "object", "properties": {"p": TWO}}, '{"p": {"a": 1'),  # nested
    ({"type": "array", "items": TWO}, '[{"a": 1'),  # an array's items
    ({"$defs": {"T": TWO}, "type": "object", "properties": {"p": {"$ref": "#/$defs/T"}}}, '{"p": {"b": 2'),
    ({"anyOf": [TWO, {"type": "integer"}]}, '{"a": 1'),  # an anyOf branch
    ({"oneOf": [TWO, {"type": "null"}]}, '{"b": 1'),
])
def test_an_object_schema_takes_only_its_declared_keys(tok, broken, schema, before):
    assert extra_key_allowed(tok, schema, before) is broken


def test_a_pydantic_class_or_instance_is_a_strict_schema(tok, broken):
    for value in (Person, Person(name="x", n=1)):
        assert extra_key_allowed(tok, value, '{"name": "x", "n": 1') is broken


def test_additional_properties_said_explicitly_is_kept(tok):
    assert extra_key_allowed(tok, {**TWO, "additionalProperties": True}, '{"a": 1')
    assert extra_key_allowed(tok, {**TWO, "additionalProperties": {"type": "integer"}}, '{"a": 1')
    assert extra_key_allowed(tok, {"type": "object"}, '{"a": 1')  # json_object: any object (no declared keys)
    # allOf parts are intersected: each part closed would forbid the other's keys, so they are left open
    both = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                      {"properties": {"b": {"type": "integer"}}}]}
    assert extra_key_allowed(tok, both, '{"a": 1', key="b")


def test_the_servers_strict_false_keeps_the_schemas_own_meaning(tok):
    from multispec.serve.edge import APIError, structured_fields
    from multispec.serve.protocol import ResponseFormat

    def schema(**spec):
        req = types.SimpleNamespace(response_format=ResponseFormat(type="json_schema", json_schema=spec))
        return structured_fields(req)[1]["json_schema"]

    assert not extra_key_allowed(tok, schema(name="p", schema=TWO), '{"a": 1')
    assert not extra_key_allowed(tok, schema(name="p", schema=TWO, strict=True), '{"a": 1')
    assert extra_key_allowed(tok, schema(name="p", schema=TWO, strict=False), '{"a": 1')
    with pytest.raises(APIError) as e:
        schema(name="p", schema=TWO, strict="yes")
    assert e.value.body.param == "response_format.json_schema.strict"


def test_a_pydantic_class_generates_an_instance_of_it():
    import multispec

    pair = multispec.load_pair()
    r = multispec.generate(pair, "def person():", max_new_tokens=40, temperature=0, json_schema=Person)
    assert r.stats["structured"]["kind"] == "json_schema"
    if r.finish_reason == "stop":
        assert Person.model_validate_json(r.text)
