"""int8 targets on this CPU (issue 43): what a k-row forward costs, how fast each method decodes, whether every
lossless method reproduces the int8 target's own greedy output, and how far the int8 model is from the float32 one.

    python benchmarks/steps/quantized.py kernels   # int8 products at 1-16 rows: dynamic, weight-only, int_mm, torchao
    python benchmarks/steps/quantized.py rows      # forward cost at k = 1 ... 16 rows, float32 and int8: rows.json, rows.png
    python benchmarks/steps/quantized.py speed     # methods on HumanEval, greedy, one thread, and llama.cpp: speed.json
    python benchmarks/steps/quantized.py int4      # the int8 model with int4 products instead: cost and perplexity
    python benchmarks/steps/quantized.py quality   # int8 vs float32: greedy agreement on HumanEval 0-19, perplexity

SmolLM2-135M-Instruct from its Q4_1 GGUF file (dequantized to float32 by transformers; int8 = models/int8.py
quantize_target of that float32 model), the fast backend, one thread. `speed` runs every method on one prompt
before the next prompt (so that a change in machine load hits all alike), and llama.cpp (llama-cpp-python, a
benchmark baseline only: pip install llama-cpp-python) on the same GGUF file, greedy, same prompts, same count of
new tokens. Results: benchmarks/results/quantized/.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # real_models: where the GGUF files are
OUT = ROOT / "benchmarks/results/quantized"
ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
CTX, REPS = 300, 7


def meta() -> dict:
    import transformers

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return {"commit": commit.stdout.strip(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


MODEL = "smollm2"  # --model
QUANT = "int8"  # --quant


def load(dtype: str):
    import multispec
    from real_models import find_gemma, find_smollm2

    path = find_smollm2() if MODEL == "smollm2" else find_gemma()
    return multispec.load_pair(target=str(path), dtype=dtype)


def rows(kind: str) -> None:
    from multispec.models import causal_mask, make_backend

    backends = {d: make_backend(load(d).target, kind) for d in ("float32", "int8")}
    ids = torch.randint(0, 40000, (CTX + max(ROWS),), generator=torch.Generator().manual_seed(0))
    for b in backends.values():
        b.forward(ids[:CTX], torch.arange(CTX), causal_mask(0, CTX))
    times: dict = {d: {n: [] for n in ROWS} for d in backends}
    for rep in range(REPS + 1):
        for n in ROWS:
            for d, b in backends.items():
                t0 = time.perf_counter()
                b.forward(ids[CTX:CTX + n], torch.arange(CTX, CTX + n), causal_mask(CTX, n))
                dt = time.perf_counter() - t0
                b.keep(torch.arange(CTX))
                if rep:
                    times[d][n].append(dt)
        print(f"rep {rep}/{REPS}", flush=True)
    med = {d: {str(n): statistics.median(v) for n, v in t.items()} for d, t in times.items()}
    name = {"smollm2": "SmolLM2-135M-Instruct", "gemma": "Gemma 3 270M"}[MODEL]
    stem = f"rows_{kind}" + ("" if MODEL == "smollm2" else f"_{MODEL}")
    result = {"meta": meta(), "model": name, "backend": kind, "context": CTX, "reps": REPS,
              "seconds": med, "int8_speedup": {str(n): med["float32"][str(n)] / med["int8"][str(n)] for n in ROWS}}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for d in med:
        ax.plot(ROWS, [1000 * med[d][str(n)] for n in ROWS], "o-", label=d)
    ax.set(xlabel="rows in the forward (k + 1 for a k-token chain)", ylabel="ms per forward",
           title=f"{name}, {kind} backend, {CTX} cached tokens, 1 thread")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / f"{stem}.png", dpi=120)
    for n in ROWS:
        print(f"{n:2d} rows: float32 {1000 * med['float32'][str(n)]:6.1f} ms, int8 {1000 * med['int8'][str(n)]:6.1f} ms")


KERNEL_SHAPES = {"q/k/v (960 x 576)": (960, 576), "gate/up (3072 x 576)": (3072, 576), "down (576 x 1536)": (576, 1536)}
KERNEL_ROWS = (1, 2, 4, 8, 16)


def kernels() -> None:
    """Microseconds per product of SmolLM2's layer shapes at 1-16 rows, each candidate over 24 weight copies taken in
    turn (more bytes than the L3 cache, as in a forward): float32, torch's dynamic int8 (one activation scale per
    call: not row-exact), the row-exact form multispec uses (models/int8.py), weight-only int8
    (torch._weight_int8pack_mm), int8 x int8 with per-row scales (torch._int_mm), and torchao's two int8 configs
    where torchao imports (pip install torchao)."""
    import warnings

    warnings.simplefilter("ignore")
    out: dict = {}
    for label, (n, k) in KERNEL_SHAPES.items():
        ws = [torch.randn(n, k) * 0.05 for _ in range(24)]
        forms = _kernel_forms(ws)
        out[label] = {}
        for rows in KERNEL_ROWS:
            x = torch.randn(rows, k)
            out[label][str(rows)] = {}
            for name, fns in forms.items():
                for f in fns:
                    f(x)
                t0 = time.perf_counter()
                for _ in range(5):
                    for f in fns:
                        f(x)
                out[label][str(rows)][name] = (time.perf_counter() - t0) / (5 * len(fns)) * 1e6
            print(label, rows, {a: round(b) for a, b in out[label][str(rows)].items()}, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        import torchao

        torchao_version = torchao.__version__
    except ImportError:
        torchao_version = None
    (OUT / "kernels.json").write_text(json.dumps({"meta": {**meta(), "torchao": torchao_version},
                                                  "microseconds": out}, indent=1) + "\n")


def _int4(w: torch.Tensor, group: int = 32):
    """torch's CPU int4 product (gpt-fast's tinygemm layout: w = (q - 8) * scale + zero per group of 32)."""
    n, k = w.shape
    wg = w.reshape(n, k // group, group)
    low, high = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp_min(1e-8)
    q = torch.round((wg - low) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
    sz = torch.cat([scale, low + 8 * scale], -1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [K / g, N, 2]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, group, sz)


def _kernel_forms(ws: list) -> dict:
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from multispec.models.int8 import PackedInt8

    scales = [w.abs().amax(1) / 127 for w in ws]
    q8 = [torch.round(w / s[:, None]).to(torch.int8) for w, s in zip(ws, scales)]
    dyn = [quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(w.shape[1], w.shape[0], bias=False)),
                            {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8) for w in ws]
    packed = [PackedInt8([w], [None]) for w in ws]

    def int_mm(q, s):
        def f(x):
            xs = x.abs().amax(1, keepdim=True).clamp_min(1e-30) / 127
            xq = torch.round(x / xs).to(torch.int8)
            pad = torch.nn.functional.pad(xq, (0, 0, 0, max(0, 17 - xq.shape[0])))  # _int_mm wants > 16 rows
            return torch._int_mm(pad, q.t())[:x.shape[0]].float() * xs * s
        return f

    forms = {"float32": [lambda x, w=w: torch.nn.functional.linear(x, w) for w in ws],
             "torch dynamic int8 (not row-exact)": [lambda x, m=m: m(x) for m in dyn],
             "multispec row-exact int8": [lambda x, p=p: p.apply(x) for p in packed],
             "weight-only int8 (_weight_int8pack_mm)": [lambda x, q=q, s=s: torch._weight_int8pack_mm(x, q, s)
                                                        for q, s in zip(q8, scales)],
             "int8 x int8 (_int_mm, per-row scales)": [int_mm(q, s) for q, s in zip(q8, scales)],
             "int4 weight-only (_weight_int4pack_mm_for_cpu, bfloat16 rows, groups of 32)": [_int4(w) for w in ws]}
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    except ImportError:
        return forms
    for name, cfg in (("torchao Int8WeightOnly", Int8WeightOnlyConfig),
                      ("torchao Int8DynamicActivationInt8Weight", Int8DynamicActivationInt8WeightConfig)):
        mods = []
        for w in ws:
            m = torch.nn.Sequential(torch.nn.Linear(w.shape[1], w.shape[0], bias=False))
            m[0].weight.data.copy_(w)
            quantize_(m, cfg())
            mods.append(m)
        forms[name] = [lambda x, m=m: m(x) for m in mods]
    return forms


def int4() -> None:
    """What int4 would give: the int8 model with every packed product swapped for torch's CPU int4 kernel (_int4:
    groups of 32 of the int8 model's dequantized weights, bfloat16 rows; the attention stays the int8 model's),
    its forward cost at 1 / 4 / 16 rows against the int8 model's, and its perplexity on quality()'s texts."""
    from multispec.models import causal_mask, make_backend
    from multispec.models.int8 import QuantLinear

    pairs = {d: load("int8") for d in ("int8", "int4")}
    for mod in pairs["int4"].target.modules():
        if isinstance(mod, QuantLinear) and mod.start == 0:
            f, bias = _int4(mod.packed.dequantized()), mod.packed.bias
            mod.packed.apply = (lambda x, f=f, bias=bias: f(x).float() if bias is None else f(x).float() + bias)
    ids = torch.randint(0, 40000, (CTX + 16,), generator=torch.Generator().manual_seed(0))
    backends = {d: make_backend(p.target, "fast") for d, p in pairs.items()}
    for b in backends.values():
        b.forward(ids[:CTX], torch.arange(CTX), causal_mask(0, CTX))
    times: dict = {d: {n: [] for n in (1, 4, 16)} for d in backends}
    for rep in range(REPS + 1):
        for n in (1, 4, 16):
            for d, b in backends.items():
                t0 = time.perf_counter()
                b.forward(ids[CTX:CTX + n], torch.arange(CTX, CTX + n), causal_mask(CTX, n))
                times[d][n].append(time.perf_counter() - t0)
                b.keep(torch.arange(CTX))
    texts = _quality_texts()
    result = {"meta": meta(), "context": CTX,
              "seconds": {d: {str(n): statistics.median(v[1:]) for n, v in t.items()} for d, t in times.items()},
              "perplexity": {name: {d: _perplexity(p, ts) for d, p in pairs.items()} for name, ts in texts.items()}}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "int4.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "meta"}, indent=1))


def _quality_texts() -> dict:
    import gzip

    with gzip.open("/work/shared/data/humaneval.jsonl.gz", "rt") as f:
        code = [json.loads(line) for line in f][20:40]
    texts = {"humaneval 20-39 prompt + canonical solution": [r["prompt"] + r["canonical_solution"] for r in code]}
    with open("/work/shared/data/alpaca_eval.jsonl") as f:
        alp = [json.loads(line) for line in f][780:800]
    texts["alpaca_eval 780-799 instruction + output"] = [r["instruction"] + "\n" + r["output"] for r in alp]
    return texts


METHODS = [("float32", "ar", {}), ("int8", "ar", {}), ("int8", "lookup", {}), ("int8", "suffix", {}),
           ("int8", "eagle", {"head": "shipped"}), ("int8", "auto", {"head": "shipped"})]


def speed(offset: int, limit: int, max_new: int) -> None:
    from multispec.data import load_prompts
    from multispec.decoding.decoder import Decoder

    pairs = {d: load(d) for d in ("float32", QUANT)}
    methods = [(QUANT if d == "int8" else d, m, o) for d, m, o in METHODS]
    methods = methods if MODEL == "smollm2" else [(d, m, {}) for d, m, o in methods if m != "eagle"]  # no head
    decoders = {f"{d}/{m}": Decoder(pairs[d], m, backend="fast", **o) for d, m, o in methods}
    prompts = load_prompts("humaneval", "/work/shared/data", offset=offset, limit=limit)
    llama = _llama() if MODEL == "smollm2" else None
    for name, dec in decoders.items():  # untimed: caches, auto's cost calibration
        dec.generate(prompts[0].text, max_new_tokens=8, temperature=0)
    runs: dict = {name: [] for name in [*decoders, *(["llama.cpp/ar"] if llama else [])]}
    for i, p in enumerate(prompts):
        for name, dec in decoders.items():
            t0 = time.perf_counter()
            r = dec.generate(p.text, max_new_tokens=max_new, temperature=0)
            runs[name].append({"prompt": p.id, "seconds": time.perf_counter() - t0, "ids": r.token_ids,
                               "prefill_s": r.stats["prefill_s"], "target_calls": r.stats.get("target_calls"),
                               "tau": r.stats.get("tau")})
        if llama:
            llama.reset()  # no prompt reuse from the last call: each completion evaluates its prompt
            t0 = time.perf_counter()
            llama(p.text, max_tokens=1, temperature=0.0, top_k=1)  # the prompt and one token: its "prefill"
            first = time.perf_counter() - t0
            llama.reset()
            t0 = time.perf_counter()
            out = llama(p.text, max_tokens=max_new, temperature=0.0, top_k=1)
            runs["llama.cpp/ar"].append({"prompt": p.id, "seconds": time.perf_counter() - t0, "prefill_s": first,
                                         "new_tokens": out["usage"]["completion_tokens"],
                                         "text": out["choices"][0]["text"]})
        print(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(
            f"{n} {_rate(v):.1f}" for n, v in runs.items()), flush=True)
    ref = {r["prompt"]: r["ids"] for r in runs[f"{QUANT}/ar"]}
    summary = {}
    for name, rs in runs.items():
        s = {"tokens_per_s": _rate(rs), "decode_tokens_per_s": _rate(rs, decode_only=True), "prompts": len(rs)}
        if name.startswith(f"{QUANT}/"):
            s[f"greedy_equal_{QUANT}_ar"] = sum(r["ids"] == ref[r["prompt"]] for r in rs)
            s["tokens_per_call"] = sum(len(r["ids"]) for r in rs) / max(1, sum(r["target_calls"] or 0 for r in rs))
        summary[name] = s
    base = summary[f"{QUANT}/ar"]["tokens_per_s"]
    for name, s in summary.items():
        s[f"vs_{QUANT}_ar"] = s["tokens_per_s"] / base
        s["vs_float32_ar"] = s["tokens_per_s"] / summary["float32/ar"]["tokens_per_s"]
        if llama:
            s["vs_llama_cpp"] = s["tokens_per_s"] / summary["llama.cpp/ar"]["tokens_per_s"]
    result = {"meta": {**meta(), "llama_cpp": _llama_version()}, "model": MODEL, "quant": QUANT, "prompts": f"HumanEval {offset}-{offset + limit - 1}",
              "max_new_tokens": max_new, "backend": "fast", "summary": summary, "runs": runs}
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "speed" + ("" if MODEL == "smollm2" else f"_{MODEL}") + ("" if QUANT == "int8" else f"_{QUANT}")
    (OUT / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, s in summary.items():
        print(name, {k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()})


def _rate(rs: list, decode_only: bool = False) -> float:
    """New tokens per second over all runs; decode_only: without the prompt's evaluation (ours: prefill_s; llama.cpp:
    a one-token completion of the same prompt, so its first token is left out too)."""
    toks = sum(r.get("new_tokens", len(r.get("ids", []))) for r in rs)
    secs = sum(r["seconds"] for r in rs)
    if decode_only:
        llama = all("new_tokens" in r for r in rs)
        toks -= len(rs) if llama else 0
        secs -= sum(r["prefill_s"] for r in rs)
    return toks / secs if secs else 0.0


def _llama():
    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama-cpp-python is not installed: no llama.cpp baseline", flush=True)
        return None
    from real_models import find_smollm2

    return Llama(model_path=str(find_smollm2()), n_threads=1, n_threads_batch=1, n_ctx=2048, verbose=False)


def _llama_version() -> str | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.__version__


def quality(max_new: int) -> None:

    from multispec.data import load_prompts
    from multispec.decoding.decoder import Decoder

    pairs = {d: load(d) for d in ("float32", "int8")}
    prompts = load_prompts("humaneval", "/work/shared/data", limit=20)
    outs = {d: [Decoder(pairs[d], "ar", backend="fast").generate(p.text, max_new_tokens=max_new,
                                                                   temperature=0).token_ids for p in prompts]
            for d in pairs}
    agree = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
             for x, y in zip(outs["float32"], outs["int8"])]
    same = sum(a == b for x, y in zip(outs["float32"], outs["int8"]) for a, b in zip(x, y))
    total = sum(min(len(x), len(y)) for x, y in zip(outs["float32"], outs["int8"]))
    texts = _quality_texts()
    ppl = {name: {d: _perplexity(pairs[d], ts) for d in pairs} for name, ts in texts.items()}
    result = {"meta": meta(), "greedy": {"prompts": "HumanEval 0-19", "max_new_tokens": max_new,
                                         "identical_continuations": sum(a == len(x) == len(y) for a, x, y in
                                                                        zip(agree, outs["float32"], outs["int8"])),
                                         "first_difference": agree, "same_token_at_position": same / total},
              "perplexity": ppl}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "quality.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "meta"}, indent=1))


def _perplexity(pair, texts: list[str]) -> float:
    nll, count = 0.0, 0
    with torch.inference_mode():
        for t in texts:
            ids = pair.tokenizer(t, return_tensors="pt").input_ids[:, :512]
            logits = pair.target(input_ids=ids).logits[0, :-1].float()
            nll += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
    return float(torch.exp(torch.tensor(nll / count)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("kernels", "rows", "speed", "quality", "int4"))
    ap.add_argument("--backend", default="fast", choices=("fast", "hf"))
    ap.add_argument("--quant", default="int8", choices=("int8", "int4"), help="speed: the quantized dtype")
    ap.add_argument("--model", default="smollm2", choices=("smollm2", "gemma"), help="speed and rows: gemma's speed "
                    "runs without a head and without llama.cpp, into speed_gemma.json")
    ap.add_argument("--offset", type=int, default=140, help="speed: first HumanEval problem (default 140)")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args()
    global MODEL, QUANT
    MODEL, QUANT = a.model, a.quant
    torch.set_num_threads(1)
    if a.what == "kernels":
        with torch.no_grad():
            kernels()
    elif a.what == "int4":
        int4()
    elif a.what == "rows":
        rows(a.backend)
    elif a.what == "speed":
        speed(a.offset, a.limit, a.max_new_tokens)
    else:
        quality(a.max_new_tokens)


if __name__ == "__main__":
    main()
