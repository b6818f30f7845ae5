"""Which grammar engine computes structured output's token masks (issue 39): llguidance and xgrammar, the two
well-kept engines the package index offers for this CPU (outlines-core was not measured), on the real models'
vocabularies (SmolLM2: 49,152 tokens; Gemma 3: 262,144): tokenizer preparation, schema compilation, and the mean and
worst time of one mask along a JSON document. One thread.

xgrammar is not a multispec dependency (it needs triton on Linux): install it apart to rerun, e.g.
`pip install --target /tmp/xg --no-deps xgrammar apache-tvm-ffi` and `--xgrammar-path /tmp/xg`.

    PYTHONPATH=src python benchmarks/structured/grammar_engines.py --xgrammar-path /tmp/xg --out benchmarks/results/structured/engines.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city"]}}, "required": ["name", "age"]}
DOC = '{"name": "Ann Lee", "age": 42, "tags": ["a", "c"], "address": {"city": "Paris", "zip": "75001"}}'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xgrammar-path")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.xgrammar_path:
        sys.path.insert(0, args.xgrammar_path)
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt
    import real_models
    import xgrammar as xgr  # 0.2.8 (it has no __version__)
    from transformers import AutoTokenizer

    rows = []
    for name, path in (("SmolLM2-135M-Instruct", real_models.find_smollm2()), ("gemma-3-270m", real_models.find_gemma())):
        if path is None:
            continue
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        ids = tok.encode(DOC, add_special_tokens=False)
        t = time.perf_counter()
        llt = llguidance.hf.from_tokenizer(tok)
        prep = time.perf_counter() - t
        t = time.perf_counter()
        m = llguidance.LLMatcher(llt, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))
        comp = time.perf_counter() - t
        bm, times = lt.allocate_token_bitmask(1, llt.vocab_size), []
        for i in ids:
            t = time.perf_counter()
            lt.fill_next_token_bitmask(m, bm, 0)
            times.append(time.perf_counter() - t)
            assert m.consume_token(i)
        rows.append({"model": name, "vocab": len(tok), "engine": f"llguidance {llguidance.__version__}",
                     "tokenizer_s": prep, "compile_ms": comp * 1e3, "mask_mean_ms": 1e3 * sum(times) / len(times),
                     "mask_max_ms": 1e3 * max(times)})
        t = time.perf_counter()
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
        compiler = xgr.GrammarCompiler(info, max_threads=1)
        prep = time.perf_counter() - t
        t = time.perf_counter()
        g = compiler.compile_json_schema(json.dumps(SCHEMA))
        comp = time.perf_counter() - t
        mm, bm, times = xgr.GrammarMatcher(g), xgr.allocate_token_bitmask(1, info.vocab_size), []
        for i in ids:
            t = time.perf_counter()
            mm.fill_next_token_bitmask(bm)
            times.append(time.perf_counter() - t)
            assert mm.accept_token(i)
        rows.append({"model": name, "vocab": len(tok), "engine": "xgrammar 0.2.8",
                     "tokenizer_s": prep, "compile_ms": comp * 1e3, "mask_mean_ms": 1e3 * sum(times) / len(times),
                     "mask_max_ms": 1e3 * max(times)})
        for r in rows[-2:]:
            print(f"{r['model']:24s} {r['engine']:18s} tokenizer {r['tokenizer_s']:.2f} s, compile "
                  f"{r['compile_ms']:.1f} ms, mask mean {r['mask_mean_ms']:.3f} ms, max {r['mask_max_ms']:.3f} ms")
    Path(args.out).write_text(json.dumps({"document_tokens": len(ids), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
