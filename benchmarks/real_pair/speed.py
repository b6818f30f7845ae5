"""The real pair's speed table: multispec's configurations beside llama.cpp, OpenVINO-free, on the same prompts,
interleaved prompt by prompt, one run (Qwen2.5-Coder-1.5B-Instruct + its 0.5B sibling, one thread).

    python benchmarks/real_pair/speed.py --dtype int8 --humaneval 20 --spec-bench 2 --max-new-tokens 128 \\
        --methods 'ar;sd:k=4;lookup;suffix;auto' --llama-cpp plain,spec,lookup \\
        --out benchmarks/results/real_pair/speed

Prompts: HumanEval prompt i as one user message ("Complete the following Python function:" and the prompt in a
```python block), Spec-Bench's first turns (--spec-bench per category), each rendered by the target's chat template
(transformers' `apply_chat_template`, generation prompt on). multispec decodes those ids; llama.cpp gets the same
rendered text with special tokens parsed and no template of its own (benchmarks/real_pair/llama_cpp.py).

For every cell (data set x temperature) and every prompt, every configuration runs once, in the order given, so a
change in machine load hits all alike. llama.cpp runs greedy cells only. Each record: new tokens, decode-only and
end-to-end seconds (prefill included; model loading excluded for every engine), target calls, accepted draft tokens,
and whether the output equals the same engine's plain greedy output on that prompt. Written: results.json.gz and
results.md in --out; progress on stderr.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RESULTS = "results.json.gz"  # every record with its token ids: large, so gzipped as benchmarks/results keeps them
HUMANEVAL_ASK = "Complete the following Python function:\n\n```python\n{prompt}\n```"


def say(msg: str) -> None:
    print(f"speed: {msg}", file=sys.stderr, flush=True)


def pair_files() -> tuple[Path, Path]:
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from real_models import find_qwen_coder

    found = find_qwen_coder()
    if found is None:
        sys.exit("speed: the Qwen2.5-Coder pair is not here; run `python scripts/fetch_models.py --only qwen-coder`")
    return found


def raw_prompts(humaneval: int, spec_bench: int, data_dir: str | None) -> list[dict]:
    """[{dataset, category, id, messages}]: read (and checked) before any model loads."""
    from multispec.data import load_prompts

    out = []
    for name, n in (("humaneval", humaneval), ("spec-bench", spec_bench)):
        for p in load_prompts(name, data_dir, limit=n) if n > 0 else []:
            msg = HUMANEVAL_ASK.format(prompt=p.text) if name == "humaneval" else p.message
            out.append({"dataset": name, "category": p.category, "id": p.id,
                        "messages": [{"role": "user", "content": msg}]})
    return out


def rendered(tokenizer, items: list[dict]) -> list[dict]:
    """Each prompt with its text through the chat template (generation prompt on) and that text's token ids."""
    for p in items:
        p["text"] = tokenizer.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
        p["ids"] = tokenizer(p["text"], add_special_tokens=False)["input_ids"]
    return items


def with_backend(specs_text: str, backend: str) -> str:
    """Each ';'-separated method spec with backend=BACKEND added where it names none."""
    out = []
    for spec in filter(None, (x.strip() for x in specs_text.split(";"))):
        name, _, opts = spec.partition(":")
        out.append(spec if "backend=" in opts or name == "hf-assisted"  # transformers' own generate: no backend
                   else f"{name}:{opts + ',' if opts else ''}backend={backend}")
    return ";".join(out)


def multispec_runners(pair, specs_text: str, profile):
    from multispec.bench.runner import make_runner
    from multispec.bench.specs import parse_method_specs

    eos = _eos(pair)
    specs = parse_method_specs(specs_text)
    return [(f"multispec {s.label}", s, make_runner(s, pair, eos, None, profile)) for s in specs], eos


def _eos(pair) -> set[int]:
    from multispec.loading import eos_ids

    return set(eos_ids(pair))


def run_multispec(runner, ids, temperature: float, max_new: int, seed: int) -> dict:
    from multispec.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=temperature)
    t0 = time.perf_counter()
    new, stats = runner(ids, sampling, max_new, seed, None)
    wall = time.perf_counter() - t0
    seconds = stats.get("engine_s") or stats.get("seconds") or wall
    prefill = stats.get("prefill_s") or 0.0
    return {"tokens": list(map(int, new)), "new_tokens": len(new), "e2e_s": seconds, "decode_s": seconds - prefill,
            "target_calls": stats.get("target_calls"), "accepted": stats.get("num_accepted_draft_tokens"),
            "drafted": stats.get("num_draft_tokens"), "tau": stats.get("tau"), "auto": stats.get("auto")}


def run_llama(kind: str, files, prompt: dict, max_new: int) -> dict:
    """One llama.cpp run: "plain", "spec" / "spec:N" (the 0.5B draft, at most N drafted tokens, default 4) or
    "lookup"; greedy, one thread. Speculative tools may pass max_new by a few tokens: their figures count what they
    generated."""
    import llama_cpp

    target, draft = files
    if kind == "plain":
        r = llama_cpp.plain(target, prompt["text"], max_new, threads=1)
    elif kind.startswith("spec"):
        r = llama_cpp.speculative(target, draft, prompt["text"], max_new, n_max=int(kind.partition(":")[2] or 4),
                                  threads=1)
    elif kind == "lookup":
        r = llama_cpp.lookup(target, prompt["text"], max_new, threads=1)
    else:
        raise ValueError(f"unknown llama.cpp configuration {kind!r}")
    n = r["n_generated"]
    return {"raw": {k: v for k, v in r.items() if k not in ("text", "cmd")}, "text": r["text"], "eos": r["eos"],
            "n_generated": n, "new_tokens": n, "decode_s": n / r["decode_tok_s"], "e2e_s": n / r["e2e_tok_s"],
            "accepted": r.get("n_accepted"), "drafted": r.get("n_drafted"), "cmd": r["cmd"]}


def interleaved(items: list[dict], temps: list[float], sampled_on: list[str]) -> list[tuple[float, dict]]:
    """(temperature, prompt) cells in an order that covers every data set and temperature early, so that a run cut
    short is balanced: the i-th prompt of each data set in turn, each at every temperature it runs at."""
    by_set: dict[str, list[dict]] = {}
    for p in items:
        by_set.setdefault(p["dataset"], []).append(p)
    cells = []
    for i in range(max((len(v) for v in by_set.values()), default=0)):
        for ps in by_set.values():
            if i < len(ps):
                cells += [(t, ps[i]) for t in temps if t == 0 or ps[i]["dataset"] in sampled_on]
    return cells


def summarize(records: list[dict], configs: list[str]) -> list[dict]:
    """One row per (dataset, temperature, config): tokens/s decode-only and end to end (sum of tokens / sum of
    seconds), speedups against multispec ar and llama.cpp plain of the same cell, tau, identity counts."""
    rows = []
    cells = sorted({(r["dataset"], r["temperature"]) for r in records})
    for d, t in cells:
        cell = [r for r in records if r["dataset"] == d and r["temperature"] == t]
        base = {}
        for c in configs:
            rs = [r for r in cell if r["config"] == c and r.get("decode_s")]
            if not rs:
                continue
            toks = sum(r["new_tokens"] for r in rs)
            dec = toks / sum(r["decode_s"] for r in rs)
            e2e = toks / sum(r["e2e_s"] for r in rs)
            calls = [r["target_calls"] for r in rs if r.get("target_calls")]
            same = [r["same_as_plain"] for r in rs if r.get("same_as_plain") is not None]
            row = {"dataset": d, "temperature": t, "config": c, "prompts": len(rs), "tokens": toks,
                   "decode_tps": dec, "e2e_tps": e2e,
                   "tau": toks / sum(calls) if len(calls) == len(rs) else None,
                   "same_as_plain": f"{sum(same)}/{len(same)}" if same else None}
            base[c] = row
            rows.append(row)
        for row in [r for r in rows if r["dataset"] == d and r["temperature"] == t]:
            ar = next((c for c in base if c.startswith("multispec ar")), None)
            for ref, key in ((ar, "vs_ar"), ("llama.cpp plain", "vs_llama_plain")):
                if ref in base:
                    row[key] = row["decode_tps"] / base[ref]["decode_tps"]
                    row[key + "_e2e"] = row["e2e_tps"] / base[ref]["e2e_tps"]
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| data set | T | configuration | prompts | tok/s decode | tok/s end to end | × multispec ar | "
            "× llama.cpp plain (decode / e2e) | τ | = own plain greedy |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    def f(x, p=2):
        return ("–" if x is None else f"{x:.{p}f}")
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['temperature']:g} | {r['config']} | {r['prompts']} | "
                     f"{f(r['decode_tps'], 1)} | {f(r['e2e_tps'], 1)} | {f(r.get('vs_ar'))} | "
                     f"{f(r.get('vs_llama_plain'))} / {f(r.get('vs_llama_plain_e2e'))} | {f(r['tau'])} | "
                     f"{r['same_as_plain'] or '–'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--methods", default="ar;sd:k=4;lookup;suffix;auto")
    ap.add_argument("--backend", default="fast", help="added to every method spec that names none")
    ap.add_argument("--llama-cpp", default="plain,spec,lookup", help="comma-separated; '' for none")
    ap.add_argument("--humaneval", type=int, default=20)
    ap.add_argument("--spec-bench", type=int, default=2, help="prompts per category")
    ap.add_argument("--temperatures", default="0", help="comma-separated; llama.cpp runs at 0 only")
    ap.add_argument("--sampled-on", default="spec-bench", help="the data sets the temperatures > 0 run on")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default=None, help="machine profile file auto plans from")
    ap.add_argument("--data-dir", default=os.environ.get("MULTISPEC_DATA"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true", help="keep the cells --out's results.json.gz holds; run the rest")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from multispec.api import load_pair
    from multispec.sampling import SamplingConfig

    files = pair_files()
    items = raw_prompts(args.humaneval, args.spec_bench, args.data_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pair = load_pair(target=str(files[0]), draft=str(files[1]), dtype=args.dtype, device="cpu")
    load_s = time.perf_counter() - t0
    say(f"pair loaded as {args.dtype} in {load_s:.0f} s")
    runners, _ = multispec_runners(pair, with_backend(args.methods, args.backend), args.profile)
    llama = [k for k in args.llama_cpp.split(",") if k]
    import llama_cpp

    if llama:
        llama_cpp.build()
    items = rendered(pair.tokenizer, items)
    temps = [float(t) for t in args.temperatures.split(",")]
    for _, _, run in runners:  # warm-up: one short untimed run each
        run(items[0]["ids"], SamplingConfig(temperature=0.0), 8, 0, None)
    configs = [name for name, _, _ in runners] + [f"llama.cpp {k}" for k in llama]
    cells = interleaved(items, temps, args.sampled_on.split(","))
    records: list[dict] = []
    if args.resume and (args.out / RESULTS).is_file():  # cells already measured are kept, not run again
        records = json.loads(gzip.decompress((args.out / RESULTS).read_bytes()))["records"]
        have = {(r["dataset"], r["id"], r["temperature"]) for r in records}
        say(f"resuming: {len(have)} cells already measured")
        cells = [(t, p) for t, p in cells if (p["dataset"], p["id"], t) not in have]
    total = len(cells)
    done = 0
    for t, p in cells:
        plain: dict[str, object] = {}
        for name, spec, run in runners:
            r = run_multispec(run, p["ids"], t, args.max_new_tokens, args.seed)
            r.update(config=name, engine="multispec", dataset=p["dataset"], category=p["category"], id=p["id"],
                     temperature=t)
            if spec.name == "ar" and "multispec" not in plain:
                plain["multispec"] = r["tokens"]
            r["same_as_plain"] = (r["tokens"] == plain["multispec"]) if t == 0 and "multispec" in plain \
                and spec.lossless else None
            records.append(r)
        if t == 0:
            for k in llama:
                r = run_llama(k, files, p, args.max_new_tokens)
                r.update(config=f"llama.cpp {k}", engine="llama.cpp", dataset=p["dataset"],
                         category=p["category"], id=p["id"], temperature=t)
                if k == "plain":
                    plain["llama"] = r
                r["same_as_plain"] = llama_cpp.same_output(r, plain["llama"]) if "llama" in plain else None
                records.append(r)
        done += 1
        row = {r["config"]: r["new_tokens"] / r["decode_s"] for r in records[-len(configs):] if r.get("decode_s")}
        say(f"{done}/{total} {p['dataset']} {p['id']} T={t:g}: " +
            ", ".join(f"{c} {v:.1f}" for c, v in row.items()))
        write(args, records, configs, load_s)
    write(args, records, configs, load_s)
    return 0


def write(args, records, configs, load_s) -> None:
    import torch
    import transformers

    rows = summarize(records, configs)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=HERE).stdout.strip()
    except OSError:
        commit = None
    meta = {"command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]), "commit": commit,
            "machine": {"cpu": platform.processor() or platform.machine(), "threads": 1,
                        "loadavg": os.getloadavg()},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()},
            "dtype": args.dtype, "load_s": load_s, "max_new_tokens": args.max_new_tokens,
            "humaneval_ask": HUMANEVAL_ASK}
    data = json.dumps({"settings": meta, "summary": rows, "records": records}, indent=1, default=str)
    tmp = args.out / (RESULTS + ".tmp")
    tmp.write_bytes(gzip.compress(data.encode(), mtime=0))
    tmp.replace(args.out / RESULTS)  # whole or not at all: --resume reads it
    (args.out / "results.md").write_text(f"# The real pair: speed\n\n`{meta['command']}`\n\n" + markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
