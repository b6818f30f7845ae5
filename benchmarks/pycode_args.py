"""What the pycode-v1 benchmark scripts share: where the trained family and the data are (--models, --data-dir:
$MULTISPEC_MODELS / $MULTISPEC_DATA, else ../shared beside the checkout) and loading the pair (fp32, CPU, one thread).
Scripts run as `python benchmarks/NAME.py`, so this module is importable beside them."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"


def add_pycode_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", default=os.environ.get("MULTISPEC_MODELS", str(SHARED / "models")),
                    help="the folder holding pycode-v1/")
    ap.add_argument("--data-dir", default=os.environ.get("MULTISPEC_DATA", str(SHARED / "data")))


def load_pycode(args):
    """The pycode-v1 pair, fp32 on the CPU, with torch on one thread (the benchmarks' setting)."""
    import torch

    import multispec

    torch.set_num_threads(1)
    return multispec.load_pair(target=f"{args.models}/pycode-v1/target", draft=f"{args.models}/pycode-v1/draft",
                               dtype="float32", device="cpu")
