"""README and docs examples run as written, on the embedded default pair (`multispec.load_pair()`).

Every fenced Python block of README.md and docs/*.md is executed, in document order, in a temporary folder shared
by the blocks of one document, unless the line right before it is `<!-- not run: REASON -->` with a reason
(a server, a real model, Ray, ...). Every `multispec ...` command of a bash block (or a block with no language) is
parsed by the real command line (an unknown option, a missing argument or an extra one fails); the commands that
run on the embedded pair (`generate`, `profile`, `verifiers` naming no model folder, data set or cluster) are also
run in-process, with `--max-new-tokens 16` added where the command takes it and the doc does not give it (the
only change to what the doc says). The files those commands name (prompts.jsonl, a.py, b.py, schema.json) are
made first, with the content their doc describes. Broken variants: a failing snippet, a marker without a reason,
an unknown option and a command that exits 2 each fail the runner.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.S | re.M)
NOT_RUN = re.compile(r"^<!--\s*not run:(.*?)-->\s*$")
SHELL = {"bash", "sh", "shell", "console", ""}
RUNNABLE = {"generate", "profile", "verifiers"}  # subcommands that run on the embedded pair in seconds
NEEDS = {"--target": "a model", "--draft": "a model", "--data-dir": "a data set", "--dataset": "a data set",
         "--ray": "Ray", "--ray-address": "Ray"}
SHORT = ("--max-new-tokens", "16")
# The files the docs' commands name, as their docs describe them.
FILES = {
    "prompts.jsonl": "".join(json.dumps(p) + "\n" for p in ("def f(x):", {"prompt": "class Stack:"})),
    "a.py": "def add(a, b):\n", "b.py": "import os\n",
    "schema.json": json.dumps({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
}


class DocExampleError(AssertionError):
    """A doc example that does not run as written, or a block marked not run without a reason."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    code: str
    not_run: str | None  # the stated reason, or None: the block runs

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(text: str, path: Path) -> list[Block]:
    """The fenced blocks of one document, each with its `<!-- not run: ... -->` reason when it has one."""
    found = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        marker = NOT_RUN.match(before[-1].strip()) if before else None
        line = text.count("\n", 0, m.start()) + 1
        reason = marker.group(1).strip() if marker else None
        if marker and not reason:
            raise DocExampleError(f"{path.name}:{line}: `<!-- not run: -->` gives no reason")
        found.append(Block(path, line, m.group(1).lower(), m.group(2), reason))
    return found


def commands(code: str) -> list[list[str]]:
    """The `multispec ...` commands of a shell block, each as argv without `multispec` (continuations joined,
    comments dropped; lines that are output or another program are skipped)."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # a line of output with an odd quote
            continue
        if words[:1] == ["multispec"] and len(words) > 1 and not any("$" in w for w in words):
            found.append(words[1:])
    return found


def parse_command(argv: list[str]) -> tuple[str, click.Context]:
    """Parse argv with the real command line, without running it (values are not converted, so placeholders like
    DIR pass): an unknown option, a missing value or an extra argument raises click.UsageError."""
    from multispec.cli import cli

    cmd, path, rest = cli, ["multispec"], list(argv)
    while isinstance(cmd, click.Group):
        if not rest or rest[0].startswith("-"):
            raise click.UsageError(f"`{' '.join(path)}` needs a subcommand")
        sub = cmd.get_command(click.Context(cmd), rest[0])
        if sub is None:
            raise click.UsageError(f"no such command `{' '.join(path)} {rest[0]}`")
        cmd, path, rest = sub, [*path, rest[0]], rest[1:]
    ctx = cmd.make_context(" ".join(path), rest, resilient_parsing=True)
    if ctx.args and not cmd.allow_extra_args:
        raise click.UsageError(f"`{' '.join(path)}`: unexpected extra arguments {ctx.args}")
    return " ".join(path[1:]), ctx


def why_not_run(argv: list[str], command: str) -> str:
    """'' when the command runs on the embedded pair, else what it needs."""
    if command.split()[0] not in RUNNABLE:
        return f"`{command}` is not among {sorted(RUNNABLE)}"
    needs = sorted({need for flag, need in NEEDS.items() if flag in argv})
    return f"needs {' and '.join(needs)}" if needs else ""


def run_command(argv: list[str], where: str, ctx: click.Context) -> None:
    """Run one command in-process through `multispec.cli.main`; a non-zero exit is a broken example."""
    from multispec.cli import main

    if any(p.name == "max_new_tokens" for p in ctx.command.params) and SHORT[0] not in argv:
        argv = [*argv, *SHORT]
    try:
        main(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            raise DocExampleError(f"{where}: `multispec {shlex.join(argv)}` exited {e.code}") from None


def run_python(block: Block) -> None:
    """Execute one Python block as a script of its own; any exception is a broken example."""
    try:
        exec(compile(block.code, block.where, "exec"), {"__name__": "__doc_example__"})  # noqa: S102 - the test
    except Exception as e:  # noqa: BLE001 - whatever the example raises, the doc is wrong
        raise DocExampleError(f"{block.where}: {type(e).__name__}: {e}") from e


def run_document(path: Path, ran: list[str]) -> None:
    """Every block of one document, in order (a later block may use a file an earlier one wrote)."""
    for block in blocks(path.read_text(encoding="utf-8"), path):
        if block.lang == "python":
            if block.not_run is None:
                run_python(block)
                ran.append(block.where)
        elif block.lang in SHELL:
            for argv in commands(block.code):
                try:
                    command, ctx = parse_command(argv)
                except click.UsageError as e:
                    raise DocExampleError(f"{block.where}: `multispec {shlex.join(argv)}`: {e.format_message()}") \
                        from None
                if block.not_run is None and not why_not_run(argv, command):
                    run_command(argv, block.where, ctx)
                    ran.append(f"{block.where} multispec {command}")


@pytest.fixture
def doc_folder(tmp_path, monkeypatch):
    """A temporary working folder with the files the docs name, and a cache folder of its own (`profile reset`
    and measured profiles stay there)."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_examples_run_as_written(path, doc_folder):
    ran: list[str] = []
    run_document(path, ran)
    print(f"{path.name}: ran {ran}")


def test_every_python_block_runs_or_says_why():
    python = [b for p in DOCUMENTS for b in blocks(p.read_text(encoding="utf-8"), p) if b.lang == "python"]
    assert len(python) >= 10  # the blocks were found (a changed fence syntax would find none)
    skipped = [b for b in python if b.not_run is not None]
    assert all(len(b.not_run) >= 10 for b in skipped), [(b.where, b.not_run) for b in skipped]
    assert len(skipped) < len(python) / 2, [b.where for b in skipped]  # most examples run


def test_the_runner_catches_a_broken_example(tmp_path, doc_folder):
    """Broken variants: each of these fails the runner, so a doc example that breaks fails this suite."""
    broken = tmp_path / "broken.md"
    cases = {
        "python that raises": "```python\nimport multispec\nmultispec.generate(multispec.load_pair(), 'x', "
                              "max_new_tokens=2, methd='ar')\n```\n",
        "python with a name it never defines": "```python\nmultispec.generate(pair, prompt)\n```\n",
        "a marker without a reason": "<!-- not run: -->\n```python\nraise SystemExit\n```\n",
        "an unknown option": "```bash\nmultispec generate 'x' --max-new-tokenz 4 --target DIR\n```\n",
        "an unknown subcommand": "```bash\nmultispec generat 'x'\n```\n",
        "a command that exits 2": "```bash\nmultispec generate 'x' --temperature -1\n```\n",
    }
    for label, text in cases.items():
        broken.write_text(text)
        with pytest.raises(DocExampleError):
            run_document(broken, [])
            pytest.fail(f"not caught: {label}")
    broken.write_text("<!-- not run: needs a server -->\n```python\nraise SystemExit(3)\n```\n"
                      "```bash\nmultispec serve --target DIR --port 8000\n```\n")
    ran: list[str] = []
    run_document(broken, ran)  # a marked block and a command needing a model are not run
    assert ran == []
