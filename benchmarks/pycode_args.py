"""What the pycode-v1 benchmark scripts share: where the trained family and the data are (--models, --data-dir:
$MULTISPEC_MODELS / $MULTISPEC_DATA, else ../shared beside the checkout) and loading the pair (fp32, CPU, one thread;
--embedded and --device cuda for a GPU machine).
Scripts run as `python benchmarks/STUDY/NAME.py` add benchmarks/ to sys.path to import it."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"


def add_pycode_args(ap: argparse.ArgumentParser, placement: bool = False) -> None:
    """--models and --data-dir; with `placement`, also --embedded and --device (for scripts that load with
    load_pycode and label their results with pair_name)."""
    ap.add_argument("--models", default=os.environ.get("MULTISPEC_MODELS", str(SHARED / "models")),
                    help="the folder holding pycode-v1/")
    ap.add_argument("--data-dir", default=os.environ.get("MULTISPEC_DATA", str(SHARED / "data")))
    if not placement:
        return
    ap.add_argument("--embedded", action="store_true", help="the pair embedded in the package (default_pair/) "
                    "instead of pycode-v1: it travels with the code, so a lent GPU machine can run it")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (fp32 either way)")


def pair_name(args) -> str:
    return "the embedded pair" if getattr(args, "embedded", False) else "pycode-v1"


def device_name(pair) -> str:
    """CUDA or CPU, for a table's title."""
    return "CUDA" if pair.device.type == "cuda" else "CPU"


def load_pycode(args):
    """The pycode-v1 pair (or with --embedded the package's own), fp32 on --device (default the CPU), with torch on
    one thread (the benchmarks' setting)."""
    import torch

    import multispec
    from multispec.loading import DEFAULT_PAIR_DIR

    torch.set_num_threads(1)
    root = DEFAULT_PAIR_DIR if getattr(args, "embedded", False) else Path(args.models) / "pycode-v1"
    return multispec.load_pair(target=str(root / "target"), draft=str(root / "draft"), dtype="float32",
                               device=getattr(args, "device", "cpu"))
