"""The package's layers, declared once: a module may import from its own package and from packages of lower layers
only, and imports never form a cycle. No module imports another package's underscore names."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "multispec"

# Lowest first. A top-level module or package of multispec sits in exactly one layer; within a layer, packages do
# not import each other (so that every arrow points down).
LAYERS = [
    {"errors"},
    {"threads"},  # its one-line refusal of a thread count comes from errors
    {"paths", "validate", "sampling", "structured", "tree", "data"},
    {"text", "verify", "token_freq", "params", "profile", "tool_calls", "gguf_cache"},
    {"models", "gguf_files", "tools"},
    {"gguf_quant"},
    {"loading"},
    {"drafting", "heads"},
    {"decoding"},
    {"api"},
    {"multispec"},  # the package's __init__: re-exports the API
    {"serve", "bench", "optimal", "training", "zoo"},
    {"cli"},
    {"__main__"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path, root: Path) -> str:
    parts = (root.name,) + path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The top-level unit a module belongs to: multispec.decoding.engine -> decoding; multispec -> multispec."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "multispec"


def imports(root: Path = SRC) -> dict[str, list[tuple[str, list[str], int]]]:
    """module -> [(imported module, imported names, line)], every import statement (lazy ones inside functions
    too: they are arrows all the same)."""
    out: dict[str, list] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        mod = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "multispec":
                out[mod].append((node.module, [a.name for a in node.names], node.lineno))
            elif isinstance(node, ast.ImportFrom) and node.level > 0:
                out[mod].append(("<relative>", [], node.lineno))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "multispec":
                        out[mod].append((a.name, [], node.lineno))
    return out


def layer_violations(graph) -> list[str]:
    bad = []
    for mod, deps in graph.items():
        for dep, _, line in deps:
            if dep == "<relative>":
                bad.append(f"{mod}:{line} uses a relative import")
                continue
            a, b = unit(mod), unit(dep)
            if a == b:
                continue
            assert a in LAYER, f"{a} (from {mod}) is in no layer: add it to LAYERS"
            assert b in LAYER, f"{b} (imported by {mod}) is in no layer: add it to LAYERS"
            if LAYER[b] >= LAYER[a]:
                bad.append(f"{mod}:{line} imports {dep} ({b} is not below {a})")
    return bad


def cycles(graph) -> list[list[str]]:
    """Cycles among modules (an import of a package counts as an import of its __init__)."""
    edges = {m: {d for d, _, _ in deps if d not in ("<relative>", m)} for m, deps in graph.items()}
    found, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == "open":
                found.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
    return found


def private_imports(graph) -> list[str]:
    """Imports of another package's underscore names (a module's own package may share its private helpers)."""
    bad = []
    for mod, deps in graph.items():
        for dep, names, line in deps:
            if dep == "<relative>" or unit(mod) == unit(dep):
                continue
            for n in names:
                if n.startswith("_") and not (n.startswith("__") and n.endswith("__")):
                    bad.append(f"{mod}:{line} imports {dep}.{n}")
            if any(p.startswith("_") and not p.startswith("__") for p in dep.split(".")):
                bad.append(f"{mod}:{line} imports the private module {dep}")
    return bad


def test_every_import_points_down_the_layers():
    assert layer_violations(imports()) == []


def test_no_import_cycles():
    assert cycles(imports()) == []


def test_no_module_imports_another_packages_private_names():
    assert private_imports(imports()) == []
    scripts = imports(SRC.parents[1] / "benchmarks")  # scripts: every multispec name they import is another's
    assert [f"{m}:{line} imports {dep}.{n}" for m, deps in scripts.items() for dep, names, line in deps
            for n in names if n.startswith("_") and not n.endswith("__")] == []


def test_the_checks_catch_an_upward_import_a_cycle_and_a_private_import(tmp_path):
    """The same checks on a made-up tree with one of each fault (a test that cannot fail proves nothing)."""
    pkg = tmp_path / "multispec"
    (pkg / "models").mkdir(parents=True)
    (pkg / "decoding").mkdir()
    (pkg / "models" / "__init__.py").write_text("from multispec.decoding.engine import run\n")
    (pkg / "decoding" / "__init__.py").write_text("")
    (pkg / "decoding" / "engine.py").write_text("from multispec.models import _secret\n")
    graph = imports(pkg)
    assert any("is not below" in v for v in layer_violations(graph))
    assert cycles(graph)
    assert private_imports(graph) == ["multispec.decoding.engine:1 imports multispec.models._secret"]


@pytest.mark.parametrize("old", ["multispec.engine", "multispec.methods", "multispec.policy_factory"])
def test_the_old_modules_are_gone(old):
    """One place for each concern: the registry and the engine live in multispec.decoding."""
    assert not (SRC / (old.split(".")[1] + ".py")).exists()
