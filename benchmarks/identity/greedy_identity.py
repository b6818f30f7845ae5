"""Greedy outputs of every method on pycode-v1 HumanEval prompts, as token-id hashes per prompt: run it on two
commits and compare the JSON files to show a change left every output unchanged (fp32, CPU, one thread).

    python benchmarks/identity/greedy_identity.py --out benchmarks/results/greedy_identity/after.json
    python benchmarks/identity/greedy_identity.py --compare before.json after.json

--backend fast --batch-size B decodes each method's prompts as batches of B (the batchable methods only). The
script calls only `multispec.generate`, so it runs against an older checkout too (PYTHONPATH=OLD/src).
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

BATCHABLE = ("ar", "sd", "mcsd", "lookup", "suffix", "auto")
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
    ap.add_argument("--backend", default=None, help="hf (default) or fast")
    ap.add_argument("--batch-size", type=int, default=None, help="decode the prompts as batches of this many")
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
    backend = {} if args.backend is None else {"backend": args.backend}
    for name, options in METHODS:
        if args.batch_size is not None and name not in BATCHABLE:
            continue
        label = name + "".join(f":{k}={v}" for k, v in options.items())
        if args.batch_size is not None:
            results = multispec.generate(pair, [p.text for p in prompts], method=name, batch_size=args.batch_size,
                                         max_new_tokens=args.max_new_tokens, temperature=0.0, **backend, **options)
            all_ids = [r.token_ids for r in results]
        else:
            all_ids = [multispec.generate(pair, p.text, method=name, max_new_tokens=args.max_new_tokens,
                                          temperature=0.0, **backend, **options).token_ids for p in prompts]
        for i, ids in enumerate(all_ids):
            outputs[f"{label}/{i}"] = hashlib.sha1(repr(ids).encode()).hexdigest()[:16]
        print(f"{label}: done ({time.time() - started:.0f} s)", file=sys.stderr)
    ar = {k.rsplit("/", 1)[1]: v for k, v in outputs.items() if k.startswith("ar/")}
    same_as_ar = {label: sum(outputs[f"{label}/{i}"] == ar[str(i)] for i in range(len(prompts)))
                  for label in dict.fromkeys(k.rsplit("/", 1)[0] for k in outputs)}
    from multispec.bench.runner import environment

    record = {"meta": environment(pair, sys.argv), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "backend": args.backend or "hf", "batch_size": args.batch_size,
              "same_as_ar": same_as_ar, "outputs": outputs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(json.dumps(same_as_ar))


if __name__ == "__main__":
    main()
