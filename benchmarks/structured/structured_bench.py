"""Structured output under speculation, measured (issue 39): 40 JSON schemas of the shapes applications send
(nested objects, arrays, enums, bounded numbers, patterned strings, optional fields), on pycode-v1 and on
SmolLM2-135M-Instruct (its chat template), greedy and T = 1.

Per model: every schema decoded greedy by every method (pycode-v1: ar, sd, mcsd, lookup, suffix, auto; SmolLM2:
ar, lookup, suffix, auto, eagle with the shipped head): outputs identical across methods, each parsed and validated
with `jsonschema`; one sample per schema at T = 1 (auto, seeded) validated too; total tokens/s of each method over
the greedy set in one run (ratios to constrained ar), the fraction of tokens the grammar forced, and the share of
wall time spent computing masks. One thread, fp32, fast backend.

    PYTHONPATH=src python benchmarks/structured/structured_bench.py --out benchmarks/results/structured/bench.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # real_models: where the GGUF files are
sys.path.insert(0, str(Path(__file__).resolve().parent))


def schemas() -> list[tuple[str, dict]]:
    """40 schemas: 8 shapes x 5 variants, each with a short description the chat prompt asks for."""
    out = []
    names = ["Ada", "a city", "a book", "a laptop", "a river"]
    for i, thing in enumerate(names):
        out.append((f"a person like {thing}", {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"], "additionalProperties": False}))
        out.append((f"an address in {thing}", {"type": "object", "properties": {
            "street": {"type": "string", "maxLength": 24}, "city": {"type": "string", "maxLength": 16},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city", "zip"], "additionalProperties": False}))
        out.append((f"a rating of {thing}", {"type": "object", "properties": {
            "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            "verdict": {"enum": ["good", "bad", "mixed"]}, "score": {"type": "number", "minimum": 0, "maximum": 10}},
            "required": ["stars", "verdict", "score"], "additionalProperties": False}))
        out.append((f"tags for {thing}", {"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3}},
            "required": ["tags"], "additionalProperties": False}))
        out.append((f"an order of {thing}", {"type": "object", "properties": {
            "id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
            "items": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
                "sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                "required": ["sku", "qty"], "additionalProperties": False}},
            "paid": {"type": "boolean"}}, "required": ["id", "items", "paid"], "additionalProperties": False}))
        out.append((f"an event about {thing}", {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 20}, "date": {"type": "string", "pattern": r"^2026-[01][0-9]-[0-3][0-9]$"},
            "online": {"type": "boolean"}, "notes": {"type": "string", "maxLength": 12}},
            "required": ["title", "date"], "additionalProperties": False}))  # online, notes: optional
        out.append((f"a function call about {thing}", {"type": "object", "properties": {
            "function": {"enum": ["search", "lookup", "translate"]},
            "arguments": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 20},
                                                           "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
                          "required": ["query"], "additionalProperties": False}},
            "required": ["function", "arguments"], "additionalProperties": False}))
        out.append((f"a point near {thing}", {"type": "object", "properties": {
            "lat": {"type": "number", "minimum": -90, "maximum": 90},
            "lon": {"type": "number", "minimum": -180, "maximum": 180},
            "label": {"anyOf": [{"type": "string", "maxLength": 12}, {"type": "null"}]}},
            "required": ["lat", "lon", "label"], "additionalProperties": False}))
    return out


def valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


class MaskClock:
    """Seconds spent computing grammar masks (GrammarState.mask), by wrapping it."""

    def __init__(self):
        from multispec import structured

        self.seconds, self._orig = 0.0, structured.GrammarState.mask
        clock = self

        def timed(state, vocab):
            t = time.perf_counter()
            try:
                return clock._orig(state, vocab)
            finally:
                clock.seconds += time.perf_counter() - t
        structured.GrammarState.mask = timed


def run_model(name, pair, methods, prompts, max_new, clock: MaskClock) -> dict:
    import multispec

    decoders = {m: multispec.Decoder(pair, m.split(":")[0], "fast", **_options(m)) for m in methods}
    for d in decoders.values():  # untimed warm-up: calibrations, first-call allocations, the grammar's tokenizer
        d.generate(prompts[0][1], max_new_tokens=4, temperature=0, json_schema=prompts[0][2])
    rows = {m: {"tokens": 0, "seconds": 0.0, "target_calls": 0, "forced": 0, "mask_s": 0.0, "valid": 0,
                "complete": 0} for m in methods}
    identical, outputs = 0, []
    for i, (what, prompt, schema) in enumerate(prompts):
        ids = {}
        for m in methods:
            clock.seconds = 0.0
            r = decoders[m].generate(prompt, max_new_tokens=max_new, temperature=0, json_schema=schema)
            row = rows[m]
            row["tokens"] += len(r.token_ids)
            row["seconds"] += r.stats["seconds"]
            row["target_calls"] += r.stats["target_calls"]
            row["forced"] += r.stats["structured"]["forced_tokens"]
            row["mask_s"] += clock.seconds
            row["valid"] += valid(r.text, schema)
            row["complete"] += r.stats["structured"]["complete"]
            ids[m] = r.token_ids
            if m == methods[0]:
                outputs.append({"schema": what, "text": r.text, "finish_reason": r.finish_reason})
        identical += len({tuple(v) for v in ids.values()}) == 1
        print(f"{name} {i + 1}/{len(prompts)} {what}: identical={len({tuple(v) for v in ids.values()}) == 1} "
              f"{outputs[-1]['text'][:70]!r}", flush=True)
    sampled_valid = 0
    for i, (_, prompt, schema) in enumerate(prompts):
        r = decoders["auto"].generate(prompt, max_new_tokens=max_new, temperature=1.0, seed=i, json_schema=schema)
        sampled_valid += valid(r.text, schema)
    base = rows[methods[0]]
    for m in methods:
        row = rows[m]
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        row["speedup_vs_ar"] = row["tokens_per_s"] / (base["tokens"] / base["seconds"])
        row["tokens_per_target_call"] = row["tokens"] / max(1, row["target_calls"])
        row["forced_fraction"] = row["forced"] / max(1, row["tokens"])
        row["mask_share"] = row["mask_s"] / row["seconds"]
    return {"schemas": len(prompts), "greedy_identical_across_methods": identical, "methods": rows,
            "t1_valid": sampled_valid, "greedy_outputs": outputs}


def _options(method: str) -> dict:
    out = {}
    for part in method.split(":")[1:]:
        k, v = part.split("=")
        out[k] = int(v) if v.isdigit() else v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=str(ROOT.parent / "shared" / "models"))
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--only", choices=["pycode", "smollm2"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import multispec
    from multispec.bench.runner import environment

    clock = MaskClock()
    result: dict = {"max_new_tokens": args.max_new_tokens, "models": {}}
    items = schemas()
    if args.only in (None, "pycode"):
        pair = multispec.load_pair(target=f"{args.models}/pycode-v1/target", draft=f"{args.models}/pycode-v1/draft",
                                   dtype="float32", device="cpu")
        prompts = [(what, f"# {what}, as JSON\nrecord = ", schema) for what, schema in items]
        result["environment"] = environment(pair, sys.argv)
        result["models"]["pycode-v1"] = run_model("pycode", pair, ["ar", "sd", "mcsd", "lookup", "suffix", "auto"],
                                                  prompts, args.max_new_tokens, clock)
    if args.only in (None, "smollm2"):
        import real_models
        from multispec.text import encode_chat

        pair = multispec.load_pair(target=str(real_models.find_smollm2()), dtype="float32", device="cpu")
        result.setdefault("environment", environment(pair, sys.argv))
        from multispec.loading import vocab_rows

        prompts = [(what, encode_chat(pair.tokenizer, vocab_rows(pair.target), [
            {"role": "user", "content": f"Give {what} as a JSON object with the fields {', '.join(schema['properties'])}."}]),
            schema) for what, schema in items]
        result["models"]["SmolLM2-135M-Instruct"] = run_model(
            "smollm2", pair, ["ar", "lookup", "suffix", "auto", "auto:head=shipped", "eagle:head=shipped:k=3"], prompts,
            args.max_new_tokens, clock)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, r in result["models"].items():
        print(f"\n{name}: {r['greedy_identical_across_methods']}/{r['schemas']} identical; T=1 valid "
              f"{r['t1_valid']}/{r['schemas']}")
        for m, row in r["methods"].items():
            print(f"  {m:24s} valid {row['valid']}/{r['schemas']} complete {row['complete']} "
                  f"{row['tokens_per_s']:6.1f} tok/s {row['speedup_vs_ar']:.2f}x ar, "
                  f"{row['tokens_per_target_call']:.2f} tok/call, forced {row['forced_fraction']:.0%}, "
                  f"masks {row['mask_share']:.1%} of wall")


if __name__ == "__main__":
    main()
