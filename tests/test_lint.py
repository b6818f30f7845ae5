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
