"""Batched = alone on the real models, greedy: SmolLM2-135M-Instruct and Gemma 3 270M (GGUF, fp32, CPU, one thread),
`ar` and `auto`, 6 HumanEval prompts (from 150) and the 2 longest of Spec-Bench's questions 8 (chat prompts of
700-800 tokens among code prompts of 70-290: the batched attention splits by width) in one batch of 8 x 32 new
tokens, each output against the same prompt decoded alone and against transformers' greedy `generate` (the same
input ids, raw text; real_greedy_identity.reference), token for token.

    python benchmarks/pretrained/real_batch_identity.py --out benchmarks/results/batch/real_identity.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pycode_args.py lives in benchmarks/
from pycode_args import add_pycode_args

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # real_models: where the GGUF files are


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pycode_args(ap)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import real_models
    from real_greedy_identity import encode, reference

    import multispec
    from multispec.bench.runner import environment
    from multispec.data import load_prompts
    from multispec.decoding.batch_offline import generate_batch
    from multispec.decoding.decoder import Decoder

    torch.set_num_threads(1)
    he = [p.text for p in load_prompts("humaneval", data_dir=args.data_dir, limit=6, offset=150)]
    sb = sorted((p.text for p in load_prompts("spec-bench", data_dir=args.data_dir, limit=2, offset=8)), key=len)[-2:]
    prompts, out, meta = he + sb, {}, None
    for name, path in (("smollm2", real_models.find_smollm2()), ("gemma3", real_models.find_gemma())):
        pair = multispec.load_pair(target=str(path), dtype="float32", device="cpu")
        meta = meta or environment(pair, sys.argv)
        ids = [encode(pair, p, template=False) for p in prompts]
        hf = [reference(pair, x, 32) for x in ids]
        for m in ("ar", "auto"):
            alone = [Decoder(pair, m, "fast").generate(x, max_new_tokens=32, temperature=0, seed=0).token_ids
                     for x in ids]
            batched = [r.token_ids for r in generate_batch(Decoder(pair, m, "fast"), ids, batch_size=8,
                                                           max_new_tokens=32, temperature=0, seed=0)]
            same = sum(a == b for a, b in zip(alone, batched))
            as_hf = sum(a == b for a, b in zip(hf, batched))
            out[f"{name} {m}"] = {"identical_to_alone": same, "identical_to_transformers": as_hf,
                                  "prompts": len(prompts), "prompt_tokens": [len(x) for x in ids]}
            print(f"{name} {m}: batched = alone {same}/{len(prompts)}, = transformers {as_hf}/{len(prompts)}; "
                  f"prompt tokens {[len(x) for x in ids]}", file=sys.stderr)
    Path(args.out).write_text(json.dumps({"meta": meta, "max_new_tokens": 32, "batch_size": 8, "runs": out},
                                         indent=1))


if __name__ == "__main__":
    main()
