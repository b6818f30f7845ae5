"""Issue 28, a hostile user again: state files that are malformed, SIGTERM, text that is not UTF-8, settings that
must mean what they say. Each case: a one-line refusal (CLI: exit 2; server: a 400 error object), a warning and
recovery (state files), or the documented behaviour; never a traceback, a 500 or a silently wrong setting."""
import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import multispec
from helpers import save_tiny_pair
from multispec import MultispecError
from multispec.cli import main
from multispec.errors import parse_bool
from multispec.methods import build_method

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def pair(dirs):
    return multispec.load_pair(target=str(dirs["target"]), draft=str(dirs["draft"]))


def run_cli(capsys, *args) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, needle):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


# ----------------------------------------------------------------------------------- 4. settings mean what they say
@pytest.mark.parametrize("value,expected", [(True, True), (False, False), (1, True), (0, False), ("true", True),
                                            ("FALSE", False), (" True ", True), ("1", True), ("0", False)])
def test_parse_bool_accepts(value, expected):
    assert parse_bool(value, "x") is expected


@pytest.mark.parametrize("value", ["yes", "no", "", "2", 2, -1, 0.5, 1.0, None, [], "on", "off", "t"])
def test_parse_bool_refuses(value):
    with pytest.raises(MultispecError, match="x must be a boolean"):
        parse_bool(value, "x")


def test_false_strings_are_false_in_build_method():
    assert build_method("dynamic", target_init="false").target_init is False
    assert build_method("dynamic", target_init="false").lossless  # the draft-initialized tree, not the lossy one
    assert build_method("dynamic", target_init="true").target_init is True
    assert build_method("sd", heuristic="0").heuristic is False
    with pytest.raises(MultispecError, match="target_init must be a boolean"):
        build_method("dynamic", target_init="nope")
    with pytest.raises(MultispecError, match="heuristic must be a boolean"):
        build_method("sd", heuristic="yes")


@pytest.mark.parametrize("spec,field,value", [
    ("dynamic:target_init=false", "target_init", False), ("dynamic:target_init=False", "target_init", False),
    ("dynamic:target_init=0", "target_init", False), ("dynamic:target_init=true", "target_init", True),
    ("sd:heuristic=false", "heuristic", False), ("sd:heuristic=1", "heuristic", True),
    ("auto:proposers=draft+lookup", "proposers", ("draft", "lookup")), ("auto:proposers=lookup", "proposers",
                                                                        ("lookup",)),
    ("mcsd:tree=4-2", "tree", (4, 2)), ("auto:max_nodes=64", "max_nodes", 64),
])
def test_bench_specs_parse_booleans_and_lists(spec, field, value):
    from multispec.bench.specs import parse_method_spec

    assert getattr(parse_method_spec(spec).config, field) == value


@pytest.mark.parametrize("spec,needle", [
    ("dynamic:target_init=yes", "target_init must be a boolean"), ("sd:heuristic=2", "heuristic must be a boolean"),
    ("auto:max_nodes=100000", "max_nodes must be at most"), ("auto:proposers=draft+x", "proposers must be among"),
    ("auto:max_nodes=0", "max_nodes"),
])
def test_bench_specs_refuse(spec, needle):
    from multispec.bench.specs import parse_method_spec

    with pytest.raises(MultispecError, match=needle):
        parse_method_spec(spec)


@pytest.mark.parametrize("args,needle", [
    (["--max-nodes", "100000"], "--max-nodes"), (["--max-nodes", "0"], "--max-nodes"),
    (["--prompt-file", "{f}", "--prompt-file", "{f}"], "--prompt-file given 2 times"),
    (["--method", "auto", "--proposers", "draft", "--target", "{t}"], "--proposers draft needs a draft model"),
    (["--method", "dynamic", "--target-init", "--width", "x"], "--width"),
])
def test_generate_refuses_bad_settings(capsys, tmp_path, dirs, args, needle):
    f = tmp_path / "p.txt"
    f.write_text("x = 1")
    args = [a.format(f=f, t=dirs["target"]) for a in args]
    prompt = [] if "--prompt-file" in args else ["x = 1"]
    code, _, err = run_cli(capsys, "generate", *prompt, *args, "--max-new-tokens", "2")
    assert_one_line_error(code, err, needle)


# ----------------------------------------------------------------------------------- 3. text that is not UTF-8
@pytest.mark.parametrize("data,needle", [(b"\xff\xfe\x00\x01binary", "not valid UTF-8"),
                                         (b"def f():\n    return '\xe9'\n", "not valid UTF-8"),
                                         (b"\x89PNG\r\n\x1a\n\x00\x00", "not valid UTF-8"),
                                         (b"abc\x00def", "NUL")])
def test_binary_prompt_file_is_one_line(capsys, tmp_path, data, needle):
    f = tmp_path / "bin.dat"
    f.write_bytes(data)
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(f), "--max-new-tokens", "2")
    assert_one_line_error(code, err, needle)
    assert str(f) in err


def test_bad_stdin_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x = \xff\n")))
    code, _, err = run_cli(capsys, "generate", "-", "--max-new-tokens", "2")
    assert_one_line_error(code, err, "stdin is not valid UTF-8")


def test_surrogate_prompt_argument_is_one_line(capsys):
    code, _, err = run_cli(capsys, "generate", "x = \udcff", "--max-new-tokens", "2")
    assert_one_line_error(code, err, "not valid UTF-8")


def test_bom_is_stripped_from_prompt_files(tmp_path, monkeypatch):
    from multispec.cli.generate_cmd import _read_prompt

    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbfdef f(x):")
    assert _read_prompt(None, (str(f),)) == "def f(x):"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfx = 1")))
    assert _read_prompt("-", ()) == "x = 1"
