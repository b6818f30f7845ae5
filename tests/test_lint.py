"""Static checks (issue 35): ruff is clean on src, tests and benchmarks, and mypy is clean on the packages whose
protocols must hold (Backend, DraftPolicy, Proposer, the verifiers). Both read their settings from pyproject.toml;
each test is skipped, saying why, where its tool is not installed (pip install -e .[test] brings both)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MYPY_TARGETS = ["src/multispec/decoding", "src/multispec/drafting", "src/multispec/verify",
                "src/multispec/models/base.py"]


def _run_tool(tool: str, args: list[str]) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed (pip install -e .[test])")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_clean():
    r = _run_tool("ruff", ["check", "src", "tests", "benchmarks"])
    assert r.returncode == 0, f"ruff check src tests benchmarks:\n{r.stdout}{r.stderr}"


@pytest.mark.slow
def test_mypy_clean():
    r = _run_tool("mypy", MYPY_TARGETS)
    assert r.returncode == 0, f"mypy {' '.join(MYPY_TARGETS)}:\n{r.stdout}{r.stderr}"


SMALL = ["src/multispec/decoding", "src/multispec/drafting"]  # the runtime's core: short files, short functions
MAX_FILE_LINES, MAX_FUNCTION_LINES = 300, 60


def test_the_core_stays_small():
    """No file in decoding/ or drafting/ over 300 lines, no function there over 60 (issue 35): a round reads on one
    screen, and growth shows up as a new module, not a longer one."""
    import ast

    too_long = []
    for folder in SMALL:
        for f in sorted((ROOT / folder).rglob("*.py")):
            text = f.read_text()
            if len(text.splitlines()) > MAX_FILE_LINES:
                too_long.append(f"{f.relative_to(ROOT)}: {len(text.splitlines())} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        too_long.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, "over the size limits:\n" + "\n".join(too_long)
