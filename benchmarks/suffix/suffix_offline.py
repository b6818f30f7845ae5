"""Offline acceptance of suffix trees vs prompt lookup (issue 30): no model runs in the simulation.

For each of HumanEval problems [--start, --start + --problems), the context is the prompt (trailing whitespace
stripped, as `multispec.data` does) tokenized with the pycode-v1 tokenizer, and the "target" output is a known
continuation: the canonical solution (`--text canonical`, default) or pycode-v1 target's greedy output
(`--text greedy`, generated once with transformers and cached in --cache). Greedy decoding is simulated: each
round a proposer drafts from the context, the round accepts the deepest tree path that equals the known
continuation, plus the bonus token, and the context advances by those tokens. Reported per configuration:
tokens per target call (vLLM's mean acceptance length, 1 + accepted / rounds), drafted nodes per call, and the
proposer's CPU time per call (after the first) and for the first call of a request (it indexes the prompt).

Configurations: `lookup` (NgramIndex, k = 10, n-gram <= 3: the project's `lookup` method) and suffix trees with
--max-nodes draft nodes, in three settings: `context` (the request's own context only), `online` (plus a shared
store that receives each problem's prompt and output once it is done, starting empty: pass 1) and `pass 2`
(the store already holds all of pass 1, the problem's own output included: a repeated-request upper bound).

    PYTHONPATH=src python benchmarks/suffix/suffix_offline.py --out benchmarks/results/suffix
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import torch

from multispec.bench.runner import cpu_name, git_commit
from multispec.drafting.lookup import NgramIndex
from multispec.drafting.suffix import SuffixProposer, SuffixStore


def load_problems(data: Path, start: int, count: int) -> list[dict]:
    with gzip.open(data, "rt") as f:
        rows = [json.loads(line) for line in f]
    return rows[start:start + count]


def continuations(rows, tokenizer, text: str, model_dir: str, cache: Path | None, max_new: int):
    """[(prompt ids, continuation ids)] per problem."""
    out = []
    prompts = [row["prompt"].rstrip() for row in rows]
    if text == "canonical":
        for row, prompt in zip(rows, prompts):
            rest = row["prompt"][len(prompt):] + row["canonical_solution"]
            out.append((tokenizer(prompt)["input_ids"], tokenizer(rest)["input_ids"]))
        return out
    if cache is not None and cache.exists():
        stored = json.loads(cache.read_text())
        if stored["max_new"] == max_new and stored["ids"] == [r["task_id"] for r in rows]:
            return [(tokenizer(p)["input_ids"], c) for p, c in zip(prompts, stored["outputs"])]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    outputs = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_new, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        cont = gen[0, ids.shape[1]:].tolist()
        if tokenizer.eos_token_id in cont:  # the engine stops at EOS and commits it
            cont = cont[:cont.index(tokenizer.eos_token_id) + 1]
        outputs.append(cont)
        out.append((ids[0].tolist(), cont))
    if cache is not None:
        cache.write_text(json.dumps({"max_new": max_new, "ids": [r["task_id"] for r in rows], "outputs": outputs}))
    return out


def accept(parents_children, tokens, target: list[int], pos: int) -> int:
    """Deepest path of the tree (children per node, tokens per node) equal to target[pos:]: its length."""
    node, acc = 0, 0
    while pos + acc < len(target):
        want = target[pos + acc]
        nxt = next((k for k in parents_children[node] if tokens[k] == want), None)
        if nxt is None:
            break
        node, acc = nxt, acc + 1
    return acc


def simulate(prompt: list[int], target: list[int], propose) -> dict:
    """Greedy rounds until the continuation is committed. propose(context) -> (children per node, tokens)."""
    context, pos, calls, drafted, accepted, seconds, first = list(prompt), 0, 0, 0, 0, 0.0, 0.0
    while pos < len(target):
        t0 = time.perf_counter()
        children, tokens = propose(context)
        if calls:
            seconds += time.perf_counter() - t0
        else:  # the first call indexes the prompt (lookup and suffix alike)
            first = time.perf_counter() - t0
        acc = accept(children, tokens, target, pos)
        step = min(acc + 1, len(target) - pos)  # accepted drafts + the bonus token
        context += target[pos:pos + step]
        pos += step
        calls += 1
        drafted += len(tokens) - 1
        accepted += acc
    return {"tokens": len(target), "calls": calls, "drafted": drafted, "accepted": accepted, "seconds": seconds,
            "first_seconds": first}


def lookup_fn(k: int, max_ngram: int):
    index = NgramIndex(max_ngram)

    def propose(context):
        chain, _ = index.propose(context, k)
        return [(i + 1,) for i in range(len(chain))] + [()], [context[-1]] + chain

    return propose


def suffix_fn(proposer: SuffixProposer, max_nodes: int):
    def propose(context):
        prop = proposer.propose(context, max_nodes)
        return prop.tree.children, prop.tokens

    return propose


def summarize(runs: list[dict]) -> dict:
    keys = ("tokens", "calls", "drafted", "accepted", "seconds", "first_seconds")
    tot = {key: sum(r[key] for r in runs) for key in keys}
    return {"tokens_per_call": tot["tokens"] / tot["calls"], "drafted_per_call": tot["drafted"] / tot["calls"],
            "accepted_per_draft_node": tot["accepted"] / max(1, tot["drafted"]),
            "proposer_us_per_call": 1e6 * tot["seconds"] / (tot["calls"] - len(runs)),
            "first_call_ms": 1e3 * tot["first_seconds"] / len(runs), **tot}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for results_<text>.json and results_<text>.md")
    ap.add_argument("--data", default="/work/shared/data/humaneval.jsonl.gz")
    ap.add_argument("--model", default="/work/shared/models/pycode-v1/target")
    ap.add_argument("--text", choices=("canonical", "greedy"), default="canonical")
    ap.add_argument("--cache", default=None, help="greedy outputs cache (JSON), e.g. /tmp/pycode_greedy.json")
    ap.add_argument("--max-new", type=int, default=128, help="greedy: new tokens per problem")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--max-nodes", default="8,16,32")
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--max-match", type=int, default=16)
    ap.add_argument("--factors", default="1,2,4", help="max_spec_factor values")
    ap.add_argument("--min-prob", type=float, default=0.1)
    ap.add_argument("--lookup-k", type=int, default=10)
    ap.add_argument("--lookup-ngram", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    t_start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    rows = load_problems(Path(args.data), args.start, args.problems)
    problems = continuations(rows, tokenizer, args.text, args.model, Path(args.cache) if args.cache else None,
                             args.max_new)
    sizes = [int(n) for n in args.max_nodes.split(",")]
    factors = [float(f) for f in args.factors.split(",")]

    results = {}
    runs = [simulate(p, t, lookup_fn(args.lookup_k, args.lookup_ngram)) for p, t in problems]
    results[f"lookup k={args.lookup_k}"] = {"setting": "context", **summarize(runs)}
    for factor in factors:
        for n in sizes:
            def make(store):
                return SuffixProposer(store, depth=args.depth, max_match=args.max_match, factor=factor,
                                      min_prob=args.min_prob)
            name = f"suffix nodes={n} factor={factor:g}"
            runs = [simulate(p, t, suffix_fn(make(None), n)) for p, t in problems]
            results[f"{name} | context"] = {"setting": "context", **summarize(runs)}
            store = SuffixStore(max_tokens=1_000_000, depth=args.depth)
            runs = []
            for i, (p, t) in enumerate(problems):  # pass 1: the store learns each problem once it is done
                runs.append(simulate(p, t, suffix_fn(make(store), n)))
                store.add(("prompt", i), p)
                store.add(("output", i), t)
            results[f"{name} | online"] = {"setting": "online", **summarize(runs)}
            runs = [simulate(p, t, suffix_fn(make(store), n)) for p, t in problems]  # pass 2: the store is full
            results[f"{name} | pass 2"] = {"setting": "pass 2", **summarize(runs)}
            print(name, {k: round(v["tokens_per_call"], 3) for k, v in results.items() if k.startswith(name)},
                  file=sys.stderr)

    meta = {"text": args.text, "problems": [r["task_id"] for r in rows],
            "tokens_prompt": sum(len(p) for p, _ in problems),
            "tokens_target": sum(len(t) for _, t in problems), "depth": args.depth, "max_match": args.max_match,
            "min_prob": args.min_prob, "lookup_ngram": args.lookup_ngram, "cpu": cpu_name(),
            "torch": torch.__version__, "python": sys.version.split()[0], "git_commit": git_commit(),
            "command": sys.argv, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": time.perf_counter() - t_start}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"results_{args.text}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (out / f"results_{args.text}.md").write_text(table(meta, results))
    print(table(meta, results))


def table(meta: dict, results: dict) -> str:
    lines = [f"HumanEval {meta['problems'][0]}..{meta['problems'][-1]}, continuation: {meta['text']} "
             f"({meta['tokens_target']} tokens), depth {meta['depth']}, max_match {meta['max_match']}, "
             f"min_prob {meta['min_prob']}; tokens / call = committed tokens / target calls "
             "(accepted drafts + the bonus; greedy, simulated).", "",
             "| proposer | setting | tokens / call | drafted / call | accepted / drafted | proposer µs / call "
             "| first call ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        lines.append(f"| {name.split(' | ')[0]} | {r['setting']} | {r['tokens_per_call']:.3f} | "
                     f"{r['drafted_per_call']:.1f} | {r['accepted_per_draft_node']:.3f} | "
                     f"{r['proposer_us_per_call']:.0f} | {r['first_call_ms']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
