"""Greedy identity on the real models (issue 36, Done means, first bullet): multispec's greedy output against
transformers' own `model.generate(do_sample=False)` on the same input ids (attention mask of ones), token for token,
for HumanEval 0-9 and 10 Spec-Bench prompts (the first prompt of 10 categories: MT-Bench's writing, roleplay,
reasoning, math and coding, then translation, summarization, qa, math_reasoning and rag) x 64 new tokens; every
draft-free lossless method (ar, lookup, suffix, auto) on both backends (hf, fast), with the chat template (the
prompt as one user message) and without (raw text); on Gemma also SmolLM2 as a draft of another family (token-level
intersection): sd, mcsd and auto. A mismatch records its first differing position and whether it is a near-tie
(the target's own float32 forward at that step: top-2 logit gap < 1e-4). One thread, CPU, float32.

    python benchmarks/pretrained/real_greedy_identity.py --model smollm2
    python benchmarks/pretrained/real_greedy_identity.py --model gemma
    python benchmarks/pretrained/real_greedy_identity.py --merge OTHER.json   # fold a run written elsewhere (--out) into the JSON

Prompts are taken in turn from the two sets, each with and without the template, so that a partial run covers
all of them. Each finished run is appended to a resume file (default ~/.cache/multispec/real_greedy_identity/MODEL.jsonl), so an
interrupted run goes on where it stopped; the JSON (one section per model, updated in place) and a short .md are
rewritten after every prompt: benchmarks/results/real_greedy_identity.json / .md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import zip_longest
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # real_models: where the GGUF files are

NEAR_TIE = 1e-4
SPEC_BENCH_MT = 5  # MT-Bench categories taken (round-robin order: writing, roleplay, reasoning, math, coding)
# (pair, method, options): "own" = the target alone, "cross" = the target with SmolLM2 as its draft
DRAFT_FREE = [("own", "ar"), ("own", "lookup"), ("own", "suffix"), ("own", "auto")]
CROSS = [("cross", "sd"), ("cross", "mcsd"), ("cross", "auto")]
BACKENDS = ("hf", "fast")


def select_prompts(data_dir: str, humaneval: int):
    from multispec.data import load_prompts

    code = load_prompts("humaneval", data_dir, limit=humaneval)
    spec = load_prompts("spec-bench", data_dir, limit=SPEC_BENCH_MT)
    chat, seen = [], set()
    for p in spec:  # the mt_bench group comes first, 5 of its categories; then the first of each other group
        if p.category == "mt_bench" or p.category not in seen:
            chat.append(p)
            seen.add(p.category)
    # interleaved (HumanEval/0, Spec-Bench 81, HumanEval/1, ...) so that a partial run covers both sets
    sets = zip_longest([("humaneval", p) for p in code], [("spec-bench", p) for p in chat])
    return [x for both in sets for x in both if x is not None]


def encode(pair, text: str, template: bool) -> list[int]:
    from multispec.loading import vocab_rows
    from multispec.text import encode_chat, encode_prompt

    if template:
        return encode_chat(pair.tokenizer, vocab_rows(pair.target), [{"role": "user", "content": text}])
    return encode_prompt(pair.tokenizer, vocab_rows(pair.target), text)


def reference(pair, ids: list[int], max_new: int) -> list[int]:
    """transformers' greedy generate: the new tokens (an end token it ends on included). It ends at the tokens
    multispec ends at (loading.eos_ids: the generation config's, and for a GGUF file the end-of-generation tokens
    llama.cpp ends at), given as transformers takes several: a list of eos_token_id."""
    from multispec.loading import eos_ids

    eos = sorted(eos_ids(pair))
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else eos[0]
    with torch.inference_mode():
        out = pair.target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   do_sample=False, max_new_tokens=max_new, pad_token_id=pad, eos_token_id=eos)
    return out[0, len(ids):].tolist()


def tie_check(pair, ids: list[int], ref: list[int], got: list[int]) -> dict:
    """At the first position where got differs from ref: the target's own float32 logits after ids + ref[:i]."""
    i = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    info: dict = {"first_diff": i, "ref_len": len(ref), "got_len": len(got),
                  "ref_token": ref[i] if i < len(ref) else None, "got_token": got[i] if i < len(got) else None}
    with torch.inference_mode():
        logits = pair.target(torch.tensor([ids + ref[:i]])).logits[0, -1].float()
    top = torch.topk(logits, 2)
    gap = float(top.values[0] - top.values[1])
    info.update(top2=top.indices.tolist(), top2_gap=gap, near_tie=gap < NEAR_TIE)
    for key in ("ref_token", "got_token"):
        if info[key] is not None:
            info[key.replace("token", "logit")] = float(logits[info[key]])
    return info


def load_done(path: Path) -> dict:
    done = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["key"]] = r
    return done


def summarize(records: dict, model: str) -> dict:
    rows: dict = {}
    for r in records.values():
        if r["kind"] != "run":
            continue
        label = f"{r['pair']}/{r['method']}/{r['backend']}/{'chat' if r['template'] else 'raw'}"
        row = rows.setdefault(label, {"pair": r["pair"], "method": r["method"], "backend": r["backend"],
                                      "template": r["template"], "equal": 0, "total": 0, "mismatches": []})
        row["total"] += 1
        row["equal"] += r["equal"]
        if not r["equal"]:
            row["mismatches"].append({"prompt": r["prompt"], **r["tie"]})
    return {"model": model, "rows": rows}


def write_outputs(out: Path, model: str, section: dict, meta: dict, config: dict) -> None:
    data = json.loads(out.read_text()) if out.is_file() else {"models": {}}
    data["models"][model] = {"meta": meta, "config": config, **section}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# Greedy identity on the real models", "",
             f"multispec's greedy output against transformers' `generate(do_sample=False)`, token ids, "
             f"{config['max_new_tokens']} new tokens, CPU float32, one thread. Command: "
             "`python benchmarks/pretrained/real_greedy_identity.py --model smollm2|gemma`; data: `real_greedy_identity.json`.",
             "", "| model | pair | method | backend | template | equal / total | mismatches (prompt: first diff, "
             "top-2 gap, near-tie) |", "|---|---|---|---|---|---|---|"]
    for name, sec in data["models"].items():
        for row in sec["rows"].values():
            mm = "; ".join(f"{m['prompt']}: @{m['first_diff']}, {m['top2_gap']:.2e}, "
                           f"{'yes' if m['near_tie'] else 'NO'}" for m in row["mismatches"]) or "-"
            lines.append(f"| {name} | {row['pair']} | {row['method']} | {row['backend']} | "
                         f"{'chat' if row['template'] else 'raw'} | {row['equal']} / {row['total']} | {mm} |")
    lines.append("")
    for name, sec in data["models"].items():
        done = max((row["total"] for row in sec["rows"].values()), default=0)
        if done < len(sec["config"]["prompts"]):
            lines.append(f"{name}: partial, {done} of {len(sec['config']['prompts'])} prompts per template so far "
                         "(the run resumes where it stopped).")
    lines += ["Commits and versions: the JSON's `meta` of each model."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("smollm2", "gemma"))
    ap.add_argument("--merge", metavar="JSON", help="copy the model sections of another run's JSON (e.g. one run "
                    "beside this one with its own --out) into --out, and rewrite the .md; loads no model")
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--humaneval", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--no-cross", action="store_true", help="Gemma: skip the SmolLM2 draft")
    ap.add_argument("--resume-file", help="default ~/.cache/multispec/real_greedy_identity/MODEL.jsonl")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "real_greedy_identity.json"))
    args = ap.parse_args()
    if args.merge:
        for name, sec in json.loads(Path(args.merge).read_text())["models"].items():
            write_outputs(Path(args.out), name, {"model": sec["model"], "rows": sec["rows"]}, sec["meta"],
                          sec["config"])
        return
    if args.model is None:
        ap.error("--model is required (or --merge)")
    torch.set_num_threads(1)

    import multispec
    import real_models
    from multispec.bench.runner import environment
    from multispec.decoding.decoder import Decoder
    from multispec.paths import cache_root

    smollm2 = real_models.find_smollm2()
    path = smollm2 if args.model == "smollm2" else real_models.find_gemma()
    if path is None:
        sys.exit(f"{args.model}: GGUF file not found; get it with python scripts/fetch_models.py")
    resume = Path(args.resume_file or cache_root() / "real_greedy_identity" / f"{args.model}.jsonl")
    resume.parent.mkdir(parents=True, exist_ok=True)
    done = load_done(resume)
    pairs = {"own": multispec.load_pair(target=str(path), device="cpu")}
    systems = list(DRAFT_FREE)
    if args.model == "gemma" and not args.no_cross:
        pairs["cross"] = multispec.load_pair(target=str(path), draft=str(smollm2), device="cpu")
        systems += CROSS
    own = pairs["own"]
    templates = (True, False) if own.tokenizer.chat_template else (False,)
    prompts = select_prompts(args.data_dir, args.humaneval)
    config = {"max_new_tokens": args.max_new_tokens, "near_tie": NEAR_TIE, "gguf": str(path),
              "draft_gguf": str(smollm2) if "cross" in pairs else None,
              "cross_vocab": pairs["cross"].cross_vocab if "cross" in pairs else None,
              "templates": ["chat" if t else "raw" for t in templates],
              "prompts": [f"{d}:{p.id}:{p.category}" for d, p in prompts],
              "systems": [f"{p}/{m}/{b}" for p, m in systems for b in BACKENDS], "threads": 1}
    meta = environment(own, sys.argv)
    decoders: dict = {}
    started, n_runs = time.time(), 0

    def record(rec: dict) -> None:
        done[rec["key"]] = rec
        with resume.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    for d, p in prompts:
        for template in templates:
            pid = f"{d}:{p.id}"
            ids = encode(own, p.text, template)
            rkey = f"ref|{template}|{pid}"
            if rkey not in done:
                t0 = time.time()
                record({"key": rkey, "kind": "ref", "template": template, "prompt": pid, "prompt_tokens": len(ids),
                        "ids": reference(own, ids, args.max_new_tokens), "seconds": time.time() - t0})
            ref = done[rkey]["ids"]
            for pname, method in systems:
                for backend in BACKENDS:
                    key = f"run|{template}|{pid}|{pname}|{method}|{backend}"
                    if key in done:
                        continue
                    pair = pairs[pname]
                    if (pname, method, backend) not in decoders:
                        decoders[(pname, method, backend)] = Decoder(pair, method, backend)
                    t0 = time.time()
                    res = decoders[(pname, method, backend)].generate(ids, max_new_tokens=args.max_new_tokens,
                                                                       temperature=0)
                    got = list(res.token_ids)
                    rec = {"key": key, "kind": "run", "template": template, "prompt": pid, "pair": pname,
                           "method": method, "backend": backend, "equal": got == ref, "seconds": time.time() - t0,
                           "tokens": len(got), "tau": res.stats.get("tau")}
                    if got != ref:
                        rec["ids"] = got
                        rec["tie"] = tie_check(own, ids, ref, got)
                    record(rec)
                    n_runs += 1
                    print(f"[{time.time() - started:6.0f}s] {args.model} {'chat' if template else 'raw'} {pid} "
                          f"{pname}/{method}/{backend}: {'equal' if got == ref else 'DIFFERS ' + str(rec['tie'])} "
                          f"({len(got)} tok, {rec['seconds']:.1f}s)", flush=True)
            write_outputs(Path(args.out), args.model, summarize(done, args.model), meta, config)
    section = summarize(done, args.model)
    write_outputs(Path(args.out), args.model, section, meta, config)
    for label, row in section["rows"].items():
        print(f"{label}: {row['equal']}/{row['total']}")


if __name__ == "__main__":
    main()
