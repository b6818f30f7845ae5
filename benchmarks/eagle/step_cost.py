"""The head's step cost as a fraction of the target's (issue 37 goal: <= 0.08), one thread, one process: the
target's one-token decode step (fast backend, as `ar` runs it) against the head's one-token step (HeadBackend,
reduced vocabulary as saved), medians over interleaved repeats at a context of `--context` tokens.

    python benchmarks/eagle/step_cost.py --target FILE.gguf|DIR --head DIR [--out FILE.json]
"""
import argparse
import json
import platform
import statistics
import time

import torch

from multispec import load_pair
from multispec.models import make_backend
from multispec.models.eagle import FeatureTap, HeadBackend, TargetParts
from multispec.models.eagle_io import load_head


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(target=a.target, device="cpu")
    tap = FeatureTap(make_backend(pair.target, "fast", max_len=a.context + 2 * a.reps + 8))
    head, ids = load_head(a.head, pair.target)
    hb = HeadBackend(head, TargetParts.of(pair.target), tap, ids)
    ctx = torch.randint(100, 1000, (a.context,))
    pos = torch.arange(a.context)
    tap.forward(ctx, pos)
    hb.forward(ctx, pos)
    t_target, t_head = [], []
    for i in range(a.reps):
        p = torch.tensor([a.context + i])
        x = torch.tensor([7 + i])
        t0 = time.perf_counter()
        tap.forward(x, p, last_only=True)
        t1 = time.perf_counter()
        hb.forward(x, p, last_only=True)
        t2 = time.perf_counter()
        t_target.append(t1 - t0)
        t_head.append(t2 - t1)
    tt, th = statistics.median(t_target[5:]), statistics.median(t_head[5:])
    res = {"target": a.target, "head": a.head, "context": a.context, "threads": 1, "cpu": platform.processor(),
           "torch": torch.__version__, "target_step_ms": 1000 * tt, "head_step_ms": 1000 * th,
           "head_over_target": th / tt, "draft_vocab": None if ids is None else int(ids.numel())}
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
