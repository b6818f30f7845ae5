"""Greedy identity on the real pair (Qwen2.5-Coder-1.5B-Instruct, its 0.5B sibling as the draft): every lossless
method against a reference, token for token, one thread, CPU.

    python benchmarks/real_pair/identity.py --dtype float32    # HumanEval 0-9 x 64, hf and fast backends
    python benchmarks/real_pair/identity.py --dtype int8       # HumanEval 0-19 x 128, fast backend
    python benchmarks/real_pair/identity.py --dtype int4
    python benchmarks/real_pair/identity.py --report           # rewrite the JSON and .md from the resume files

float32: the reference is transformers' greedy `model.generate(do_sample=False)` on the same ids, and every method
runs on both backends (hf, fast). int8 / int4: a quantized target is a different model from the float32 one, so the
reference is that dtype's own `ar` on the fast backend, and every method runs on the fast backend. The prompt: the
HumanEval prompt as one user message in the wording of benchmarks/real_pair/speed.py, through the chat template.
Methods: the lossless ones of the registry in their default configurations (ti-mcsd in its one lossless form,
width 1; dynamic without a decision model); specdecpp and eagle need a head trained for this pair, which does not
exist yet, so they are not run. A mismatch records its first differing position and whether it is a near-tie
(the reference pair's target forward at that step, on transformers' code path: top-2 logit gap < 1e-4).

Prompts are taken in order, every method on one prompt before the next, so a partial run covers every method.
Each finished run is appended to a resume file (~/.cache/multispec/real_pair_identity/DTYPE.jsonl), so an
interrupted run goes on where it stopped; --until HH:MM (UTC) stops before a run that would start later. The JSON
(gzipped at 32 KB or more) and a short .md in benchmarks/results/real_pair/ are rewritten after every prompt.
"""
from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "benchmarks" / "pretrained"))

import real_greedy_identity as rgi  # noqa: E402  (reference, tie_check, load_done)
from speed import pair_files, raw_prompts, rendered  # noqa: E402

# (label, method, options); every one lossless (checked against the registry at start)
METHODS = [("ar", "ar", {}), ("sd:k=4", "sd", {"k": 4}), ("mcsd", "mcsd", {}),
           ("ti-mcsd:width=1", "ti-mcsd", {"width": 1}), ("dynamic", "dynamic", {}), ("lookup", "lookup", {}),
           ("suffix", "suffix", {}), ("auto", "auto", {})]
NOT_RUN = {"specdecpp": "needs an acceptance head trained for this pair (none exists yet)",
           "eagle": "needs a feature head trained for this pair (none exists yet)"}
# dtype -> (HumanEval prompts, new tokens, backends)
PLANS = {"float32": (10, 64, ("hf", "fast")), "int8": (20, 128, ("fast",)), "int4": (20, 128, ("fast",))}
OUT = ROOT / "benchmarks" / "results" / "real_pair" / "identity"
GZIP_AT = 32 * 1024


def resume_path(dtype: str) -> Path:
    from multispec.paths import cache_root

    return cache_root() / "real_pair_identity" / f"{dtype}.jsonl"


def check_lossless() -> None:
    from multispec.decoding.methods import build_method

    for label, method, options in METHODS:
        assert build_method(method, **options).lossless_at(0.0), f"{label} is not lossless at T = 0"


def summarize(dtype: str, records: dict) -> dict:
    """Per method/backend: equal/total and the mismatches; the prompts with a reference."""
    rows: dict = {}
    for r in records.values():
        if r["kind"] != "run":
            continue
        row = rows.setdefault(f"{r['method']}/{r['backend']}", {"method": r["method"], "backend": r["backend"],
                                                                "equal": 0, "total": 0, "mismatches": []})
        row["total"] += 1
        row["equal"] += r["equal"]
        if not r["equal"]:
            row["mismatches"].append({"prompt": r["prompt"], **r["tie"]})
    order = {f"{label}/{b}": i * 2 + j for i, (label, _, _) in enumerate(METHODS) for j, b in enumerate(("hf", "fast"))}
    return dict(sorted(rows.items(), key=lambda kv: order.get(kv[0], 99)))


def write_outputs() -> None:
    """The JSON (one section per dtype, from its resume file) and the .md."""
    data: dict = {"methods": [label for label, _, _ in METHODS], "not_run": NOT_RUN, "near_tie": rgi.NEAR_TIE,
                  "humaneval_ask": __import__("speed").HUMANEVAL_ASK, "dtypes": {}}
    for dtype, (n, new, backends) in PLANS.items():
        path = resume_path(dtype)
        if not path.is_file():
            continue
        records = rgi.load_done(path)
        meta = next((r for r in records.values() if r["kind"] == "meta"), {})
        data["dtypes"][dtype] = {
            "reference": "transformers generate(do_sample=False)" if dtype == "float32" else f"{dtype} ar (fast)",
            "plan": {"humaneval": n, "max_new_tokens": new, "backends": list(backends)}, "meta": {**meta.get("env", {}), "dtype": dtype},
            "rows": summarize(dtype, records), "records": [r for r in records.values() if r["kind"] != "meta"]}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1) + "\n"
    plain, packed = OUT.with_suffix(".json"), OUT.with_suffix(".json.gz")
    if len(text.encode()) >= GZIP_AT:
        packed.write_bytes(gzip.compress(text.encode(), mtime=0))
        plain.unlink(missing_ok=True)
    else:
        plain.write_text(text)
        packed.unlink(missing_ok=True)
    OUT.with_suffix(".md").write_text(markdown(data))


def markdown(data: dict) -> str:
    lines = ["# The real pair: greedy identity", "",
             "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) with Qwen2.5-Coder-0.5B-Instruct as the draft; HumanEval "
             "prompts as one user message through the chat template; one thread, CPU. float32: every method against "
             "transformers' `generate(do_sample=False)`, on both backends; int8 / int4: every method against that "
             "dtype's own `ar` on the fast backend. Command: `python benchmarks/real_pair/identity.py --dtype "
             "float32|int8|int4`; data: `identity.json` (or `.json.gz`).", "",
             "Not run: " + "; ".join(f"{k}, which {v}" for k, v in data["not_run"].items()) + ".", ""]
    for dtype, sec in data["dtypes"].items():
        plan = sec["plan"]
        covered = sorted({r["prompt"] for r in sec["records"] if r["kind"] == "run"},
                         key=lambda p: int(p.rsplit("/", 1)[-1]) if p.rsplit("/", 1)[-1].isdigit() else 0)
        full = all(row["total"] == plan["humaneval"] for row in sec["rows"].values()) and \
            len(sec["rows"]) == len(data["methods"]) * len(plan["backends"])
        lines += [f"## {dtype}: against {sec['reference']}", "",
                  f"Planned: HumanEval 0-{plan['humaneval'] - 1} x {plan['max_new_tokens']} new tokens, backends "
                  f"{', '.join(plan['backends'])}. " + ("Complete." if full else
                  f"**Partial**: {len(covered)} of {plan['humaneval']} prompts reached ({', '.join(covered) or '-'}); "
                  "counts below are per method over the prompts it ran; the same command resumes where it "
                  "stopped."), "",
                  "| method | backend | equal / total | mismatches (prompt: first diff, top-2 gap, near-tie) |",
                  "|---|---|---|---|"]
        for row in sec["rows"].values():
            mm = "; ".join(f"{m['prompt']}: @{m['first_diff']}, {m['top2_gap']:.2e}, "
                           f"{'yes' if m['near_tie'] else 'NO'}" for m in row["mismatches"]) or "-"
            count = f"{row['equal']} / {row['total']}"
            if dtype != "float32" and row["method"] == "ar":
                count = f"the reference ({row['total']} prompts)"
            lines.append(f"| {row['method']} | {row['backend']} | {count} | {mm} |")
        lines.append("")
    missing = [d for d in PLANS if d not in data["dtypes"]]
    if missing:
        lines += [f"Not run yet: {', '.join(missing)}.", ""]
    lines.append("Commits and versions: each dtype's `meta` in the JSON.")
    return "\n".join(lines) + "\n"


def past(until: str | None) -> bool:
    if not until:
        return False
    h, m = map(int, until.split(":"))
    now = time.gmtime()
    return now.tm_hour * 60 + now.tm_min >= h * 60 + m


def run(dtype: str, humaneval: int, max_new: int, until: str | None, data_dir: str | None,
        start: int = 0) -> None:
    import torch

    import multispec
    from multispec.bench.runner import environment
    from multispec.decoding.decoder import Decoder

    torch.set_num_threads(1)
    check_lossless()
    resume = resume_path(dtype)
    resume.parent.mkdir(parents=True, exist_ok=True)
    done = rgi.load_done(resume)
    target, draft = pair_files()
    raw = raw_prompts(humaneval, 0, data_dir)  # read (and checked) before the pair loads
    t0 = time.time()
    pair = multispec.load_pair(target=str(target), draft=str(draft), device="cpu", dtype=dtype)
    print(f"identity: {dtype} pair loaded in {time.time() - t0:.0f} s", flush=True)
    backends = PLANS[dtype][2]
    items = rendered(pair.tokenizer, raw)[start:]

    def record(rec: dict) -> None:
        done[rec["key"]] = rec
        with resume.open("a") as f:
            f.write(json.dumps(rec) + "\n")

    record({"key": "meta", "kind": "meta", "env": environment(pair, sys.argv)})
    decoders: dict = {}
    started = time.time()
    try:
        for p in items:
            pid, ids = f"{p['dataset']}/{p['id'].rsplit('/', 1)[-1]}", p["ids"]
            rkey = f"ref|{pid}|{max_new}"
            if rkey not in done:
                if past(until):
                    return
                t0 = time.time()
                if dtype == "float32":
                    ref = rgi.reference(pair, ids, max_new)
                else:  # the dtype's own ar (fast): doubles as the ar/fast run
                    ref = list(Decoder(pair, "ar", "fast").generate(ids, max_new_tokens=max_new,
                                                                    temperature=0).token_ids)
                record({"key": rkey, "kind": "ref", "prompt": pid, "prompt_tokens": len(ids), "ids": ref,
                        "seconds": time.time() - t0})
            ref = done[rkey]["ids"]
            akey = f"run|{pid}|{max_new}|ar|fast"
            if dtype != "float32" and akey not in done:  # the reference is ar/fast itself
                record({"key": akey, "kind": "run", "prompt": pid, "method": "ar", "backend": "fast", "equal": True,
                        "seconds": done[rkey]["seconds"], "tokens": len(ref), "tau": 1.0, "is_reference": True})
            for label, method, options in METHODS:
                for backend in backends:
                    key = f"run|{pid}|{max_new}|{label}|{backend}"
                    if key in done or (dtype != "float32" and label == "ar"):
                        continue
                    if past(until):
                        return
                    if (label, backend) not in decoders:
                        decoders[(label, backend)] = Decoder(pair, method, backend, **options)
                    t0 = time.time()
                    res = decoders[(label, backend)].generate(ids, max_new_tokens=max_new, temperature=0)
                    got = list(res.token_ids)
                    rec = {"key": key, "kind": "run", "prompt": pid, "method": label, "backend": backend,
                           "equal": got == ref, "seconds": time.time() - t0, "tokens": len(got),
                           "tau": res.stats.get("tau")}
                    if got != ref:
                        rec["ids"] = got
                        rec["tie"] = rgi.tie_check(pair, ids, ref, got)
                    record(rec)
                    print(f"[{time.time() - started:6.0f}s] {dtype} {pid} {label}/{backend}: "
                          f"{'equal' if got == ref else 'DIFFERS ' + str(rec['tie'])} "
                          f"({len(got)} tok, {rec['seconds']:.1f}s)", flush=True)
            write_outputs()
    finally:
        write_outputs()
        del decoders, pair
        gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=tuple(PLANS))
    ap.add_argument("--report", action="store_true", help="rewrite the JSON and .md from the resume files only")
    ap.add_argument("--humaneval", type=int, help="prompts (default: 10 for float32, 20 quantized)")
    ap.add_argument("--max-new-tokens", type=int, help="default: 64 for float32, 128 quantized")
    ap.add_argument("--start", type=int, default=0,
                    help="skip the first START prompts (two processes can share a dtype's prompts; one resume file)")
    ap.add_argument("--until", metavar="HH:MM", help="UTC: start no run after this time")
    ap.add_argument("--data-dir", default=os.environ.get("MULTISPEC_DATA", "/work/shared/data"))
    args = ap.parse_args()
    if args.report:
        write_outputs()
        return
    if args.dtype is None:
        ap.error("--dtype is required (or --report)")
    n, new, _ = PLANS[args.dtype]
    run(args.dtype, args.humaneval or n, args.max_new_tokens or new, args.until, args.data_dir, args.start)


if __name__ == "__main__":
    main()
