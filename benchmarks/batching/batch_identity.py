"""Batched = alone, greedy: every sequence of a batch against its own batch-1 run, token for token.

pycode-v1 (--embedded: the package's own pair; --target: another model alone, a GGUF file or a folder), HumanEval
prompts 0..P-1, 128 new tokens, fp32, CPU (or --device cuda), the fast backend. --head DIR (or "shipped": the head
installed for the target) adds `eagle` and gives `auto` the head (its draft plans drafted by it). For each method, the batch-1 outputs (`Decoder.run`, one prompt at a time) are the
reference; then every batch size decodes all prompts (decoding/batch.py, continuous batching: a slot takes the next
prompt when its sequence ends; a batch of one decodes on the Decoder itself, so its row has no mean batch) and each
output is compared with its reference. A divergence is checked for a near-tie: the top-2 logit gap of the target (a
full forward of prompt + the reference tokens before the divergence) below 1e-4. Writes JSON and a markdown table.

    PYTHONPATH=src python benchmarks/batching/batch_identity.py --out benchmarks/results/batch/identity
    PYTHONPATH=src python benchmarks/batching/batch_identity.py --methods eagle --head /tmp/pycode_head \
        --out benchmarks/results/batch/identity_eagle
    PYTHONPATH=src python benchmarks/batching/batch_identity.py --target SmolLM2-135M-Instruct.Q4_1.gguf \
        --head shipped --methods eagle,auto --batch-sizes 4,8 --out benchmarks/results/batch/identity_smollm2_eagle
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pycode_args.py lives in benchmarks/
from pycode_args import add_pycode_args, device_name, load_pycode, pair_name

METHODS = [("ar", {}), ("sd", {"k": 4}), ("mcsd", {}), ("lookup", {}), ("suffix", {}), ("auto", {}), ("eagle", {})]
NEEDS_DRAFT = ("sd", "mcsd")  # refused on a --target alone
NEAR_TIE = 1e-4


def top2_gap(model, ids: list[int]) -> float:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pycode_args(ap, placement=True)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-sizes", default="1,4,16,32")
    ap.add_argument("--methods", help="default: every method the pair runs (eagle: with --head)")
    ap.add_argument("--target", help="another target (a GGUF file or a folder), alone: no draft model")
    ap.add_argument("--head", help="a feature head (a folder, or 'shipped'): eagle's, and auto's draft plans")
    ap.add_argument("--out", required=True, help="path without extension: writes .json and .md")
    args = ap.parse_args()
    import multispec.decoding.batch, multispec.drafting.auto, multispec.drafting.costs  # noqa: F401,E401 - all code read now

    from multispec.bench.runner import environment
    from multispec.data import load_prompts
    from multispec.decoding.batch_offline import generate_batch
    from multispec.params import SamplingParams
    from multispec.decoding.decoder import Decoder
    from multispec.text import encode_prompt

    if args.target:
        import multispec

        torch.set_num_threads(1)
        pair = multispec.load_pair(target=args.target, dtype="float32", device=args.device)
    else:
        pair = load_pycode(args)
    model = Path(args.target).name if args.target else pair_name(args)
    methods = args.methods.split(",") if args.methods else [
        m for m, _ in METHODS if (m != "eagle" or args.head) and (m not in NEEDS_DRAFT or not args.target)]
    prompts = [p.text for p in load_prompts("humaneval", data_dir=args.data_dir, limit=args.prompts)]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    rows, started = [], time.time()
    for name, options in METHODS:
        if name not in methods:
            continue
        options = {**options, **({"head": args.head} if args.head and name in ("eagle", "auto") else {})}
        decoder = Decoder(pair, name, "fast", **options)
        sampling = decoder.check_request(SamplingParams(temperature=0.0))
        ids = [encode_prompt(pair.tokenizer, decoder.vocab_size, p) for p in prompts]
        # capped as generate caps it (the prompt and the new tokens within the model's positions; the embedded pair
        # has 256), so that the reference stops where a batch's sequence stops
        alone = [decoder.run(x, sampling, decoder.fit_context(len(x), args.max_new_tokens, []), 0)[0] for x in ids]
        print(f"{name}: batch-1 reference done ({time.time() - started:.0f} s)", file=sys.stderr)
        for b in sizes:
            decoder = Decoder(pair, name, "fast", **options)  # fresh: auto's suffix store holds no earlier run
            out = generate_batch(decoder, prompts, batch_size=b, max_new_tokens=args.max_new_tokens, temperature=0,
                                 seed=0)
            same, near_ties, other = 0, [], []
            for i, (ref, r) in enumerate(zip(alone, out)):
                new = r.token_ids
                if new == ref:
                    same += 1
                    continue
                at = next((k for k, (x, y) in enumerate(zip(ref, new)) if x != y), min(len(ref), len(new)))
                gap = top2_gap(pair.target, ids[i] + ref[:at])
                (near_ties if gap < NEAR_TIE else other).append({"prompt": i, "position": at, "top2_gap": gap})
            forwards = out[0].stats["batch"].get("forwards", {})
            row = {"method": name, "options": {k: str(v) for k, v in options.items()}, "batch_size": b,
                   "prompts": len(prompts), "identical": same, "near_tie_divergences": near_ties,
                   "other_divergences": other, "batch_tokens_per_s": out[0].stats["batch"]["tokens_per_s"],
                   "mean_target_batch": forwards.get("target", {}).get("mean_batch"),
                   "mean_head_batch": forwards.get("head", {}).get("mean_batch"),
                   "head_forwards": forwards.get("head", {}).get("forwards")}
            rows.append(row)
            print(f"{name} batch {b}: {same}/{len(prompts)} identical, {len(near_ties)} near-tie, "
                  f"{len(other)} other ({time.time() - started:.0f} s)", file=sys.stderr)
    record = {"meta": environment(pair, sys.argv), "model": model, "head": args.head,
              "max_new_tokens": args.max_new_tokens, "near_tie": NEAR_TIE, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    head = f", head {args.head}" if args.head else ""
    lines = [f"Greedy, {model}{head}, HumanEval 0-{len(prompts) - 1} x {args.max_new_tokens} tokens, fp32 "
             f"{device_name(pair)}, fast backend: each sequence of a batch against its batch-1 run.", "",
             "| method | batch | identical | near-tie divergences | other divergences | mean target batch | "
             "mean head batch |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['batch_size']} | {r['identical']}/{r['prompts']} | "
                     f"{len(r['near_tie_divergences'])} | {len(r['other_divergences'])} | "
                     f"{_f(r['mean_target_batch'])} | {_f(r['mean_head_batch'])} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _f(x) -> str:
    return "-" if x is None else f"{x:.1f}"


if __name__ == "__main__":
    main()
