"""The seed promise on pycode-v1: with `reproducible=True`, ar, sd, mcsd and auto (its plans forced to change from
round to round, and its own measured choice), alone and in batches (auto and sd decoding all prompts together,
`--batch-sizes`, on the fast backend), give identical text for each HumanEval prompt and seed at each temperature.
Writes per-prompt hashes and the count of prompts where all agree.

    python benchmarks/identity/reproducible_invariance.py --prompts 20 --temperatures 1,0.7 --batch-sizes 4,20 \
        --out benchmarks/results/reproducible/invariance.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pycode_args.py lives in benchmarks/
from pycode_args import add_pycode_args, load_pycode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # engine_utils.ScriptedPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pycode_args(ap)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", default="1,0.7")
    ap.add_argument("--batch-sizes", default="4,20")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import multispec.decoding.batch, multispec.drafting.auto, multispec.drafting.costs  # noqa: F401,E401 - all code read now

    from multispec.bench.runner import environment
    from multispec.data import load_prompts
    from multispec.decoding.batch_offline import generate_batch
    from multispec.decoding.decoder import Decoder
    from engine_utils import ScriptedPolicy
    from multispec.drafting.protocol import RoundPlan
    from multispec.tree import Tree

    pair = load_pycode(args)
    prompts = load_prompts("humaneval", data_dir=args.data_dir, limit=args.prompts)
    forced = Decoder(pair, "auto")
    # auto's plans forced to change from round to round and with the output: none, a draft chain of 3, a (2, 2, 1)
    # draft tree (ScriptedPolicy defers the draft's prefill as auto does)
    plans = [RoundPlan(Tree.chain(0), "none"), RoundPlan(Tree.chain(3), "draft"),
             RoundPlan(Tree.from_shape((2, 2, 1)), "draft")]
    forced.policy = ScriptedPolicy(lambda history, i: plans[(i + 1 + len(history)) % 3])
    decoders = {"ar": Decoder(pair, "ar"), "sd": Decoder(pair, "sd", k=4), "mcsd": Decoder(pair, "mcsd"),
                "auto": Decoder(pair, "auto"), "auto-forced-plans": forced}
    rows, started = [], time.time()
    def digest(ids) -> str:
        return hashlib.sha1(repr(ids).encode()).hexdigest()[:16]

    for t in (float(x) for x in args.temperatures.split(",")):
        batched = {}
        for b in (int(x) for x in args.batch_sizes.split(",") if x):
            for name in ("auto", "sd"):
                out = generate_batch(Decoder(pair, name, "fast"), [p.text for p in prompts], batch_size=b,
                                     max_new_tokens=args.max_new_tokens, seed=[100 + i for i in range(len(prompts))],
                                     temperature=t,
                                     reproducible=True)
                batched[f"{name}-batch{b}"] = [digest(r.token_ids) for r in out]
        for i, p in enumerate(prompts):
            hashes = {name: h[i] for name, h in batched.items()}
            for name, d in decoders.items():
                r = d.generate(p.text, max_new_tokens=args.max_new_tokens, temperature=t, seed=100 + i,
                               reproducible=True)
                hashes[name] = digest(r.token_ids)
            rows.append({"temperature": t, "prompt": p.id, "seed": 100 + i, "hashes": hashes,
                         "identical": len(set(hashes.values())) == 1})
            print(f"T={t:g} {p.id}: {'identical' if rows[-1]['identical'] else 'DIFFERENT'} "
                  f"({time.time() - started:.0f} s)", file=sys.stderr)
    summary = {str(t): sum(r["identical"] for r in rows if r["temperature"] == t)
               for t in dict.fromkeys(r["temperature"] for r in rows)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": environment(pair, sys.argv), "prompts": len(prompts),
                                          "identical_per_temperature": summary, "rows": rows}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
