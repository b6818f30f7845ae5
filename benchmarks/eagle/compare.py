"""eagle vs ar vs sd on pycode-v1, HumanEval 0-9, 64 tokens, T = 0, one thread, one process, interleaved.

    python benchmarks/eagle/compare.py HEAD_DIR OUT.json
"""
import gzip
import json
import sys
import time

import torch

from multispec import load_pair
from multispec.decoding.decoder import Decoder
from multispec.sampling import SamplingConfig

torch.set_num_threads(1)
head, out = sys.argv[1], sys.argv[2]
M = "/work/shared/models/pycode-v1"
pair = load_pair(target=f"{M}/target", draft=f"{M}/draft", device="cpu")
rows = [json.loads(x) for x in gzip.open("/work/shared/data/humaneval.jsonl.gz", "rt")][:10]
methods = {"ar": Decoder(pair, "ar"), "sd": Decoder(pair, "sd", k=4),
           "eagle-k4": Decoder(pair, "eagle", head=head, k=4),
           "eagle-tree": Decoder(pair, "eagle", head=head, tree=(3, 2, 1, 1))}
greedy = SamplingConfig(temperature=0.0)
res = {m: {"s": 0.0, "tok": 0, "calls": 0, "ids": []} for m in methods}
for r in rows:
    ids = pair.tokenizer(r["prompt"])["input_ids"]
    for m, d in methods.items():
        d.run(ids[:16], greedy, 4, 0)  # warm
        t = time.perf_counter()
        new, c = d.run(ids, greedy, 64, 0)
        res[m]["s"] += time.perf_counter() - t
        res[m]["tok"] += len(new)
        res[m]["calls"] += c.target_calls
        res[m]["ids"].append(new)
summary = {}
for m, v in res.items():
    summary[m] = {"tok_per_s": v["tok"] / v["s"], "tokens_per_call": v["tok"] / max(1, v["calls"]),
                  "speedup_vs_ar": (v["tok"] / v["s"]) / (res["ar"]["tok"] / res["ar"]["s"]),
                  "same_as_ar": v["ids"] == res["ar"]["ids"]}
json.dump({"head": head, "device": "cpu, 1 thread (shared machine)", "prompts": "humaneval 0-9", "max_new": 64,
           "temperature": 0, "summary": summary}, open(out, "w"), indent=1)
print(json.dumps(summary, indent=1))
