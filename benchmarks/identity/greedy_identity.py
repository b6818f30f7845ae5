"""Greedy outputs of every method on pycode-v1 HumanEval prompts, as token-id hashes per prompt: run it on two
commits and compare the JSON files to show a change left every output unchanged (fp32, CPU, one thread).

    python benchmarks/identity/greedy_identity.py --out benchmarks/results/greedy_identity/after.json
    python benchmarks/identity/greedy_identity.py --compare before.json after.json
"""
from __future__ import annotations

import argparse
import hashlib
import gzip
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pycode_args.py lives in benchmarks/
from pycode_args import add_pycode_args, load_pycode

METHODS = [("ar", {}), ("sd", {"k": 4}), ("mcsd", {}), ("ti-mcsd", {}), ("ti-mcsd", {"tree": "1,4,3,1,1"}),
           ("dynamic", {}), ("specdecpp", {"head": "heads/pycode-v1/acceptance"}), ("lookup", {}), ("suffix", {}), ("auto", {})]


def read_json(path):
    """A saved JSON file, plain or gzipped (benchmarks/results keeps large ones as .json.gz)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pycode_args(ap)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.compare:
        a, b = (read_json(p) for p in args.compare)
        diff = [k for k in a["outputs"] if a["outputs"][k] != b["outputs"].get(k)]
        print(f"{len(a['outputs']) - len(diff)} of {len(a['outputs'])} method x prompt outputs identical"
              + (f"; differ: {diff}" if diff else ""))
        sys.exit(1 if diff else 0)

    import multispec
    from multispec.data import load_prompts

    pair = load_pycode(args)
    prompts = load_prompts("humaneval", data_dir=args.data_dir, limit=args.prompts)
    outputs, started = {}, time.time()
    for name, options in METHODS:
        label = name + "".join(f":{k}={v}" for k, v in options.items())
        for i, p in enumerate(prompts):
            ids = multispec.generate(pair, p.text, method=name, max_new_tokens=args.max_new_tokens, temperature=0.0,
                                     **options).token_ids
            outputs[f"{label}/{i}"] = hashlib.sha1(repr(ids).encode()).hexdigest()[:16]
        print(f"{label}: done ({time.time() - started:.0f} s)", file=sys.stderr)
    ar = {k.rsplit("/", 1)[1]: v for k, v in outputs.items() if k.startswith("ar/")}
    same_as_ar = {label: sum(outputs[f"{label}/{i}"] == ar[str(i)] for i in range(len(prompts)))
                  for label in dict.fromkeys(k.rsplit("/", 1)[0] for k in outputs)}
    from multispec.bench.runner import environment

    record = {"meta": environment(pair, sys.argv), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "same_as_ar": same_as_ar, "outputs": outputs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(json.dumps(same_as_ar))


if __name__ == "__main__":
    main()
