"""Repeated workloads through `multispec serve` (loopback, one client, greedy): the same prompts sent twice, and
prompts sharing one long system prompt, for ar, lookup, suffix and auto with suffix trees. Each method gets its
own server (so its suffix store starts empty); tokens/s and tokens per target call per pass, from the responses'
usage and spec_decode. One run, one torch thread.

    python benchmarks/suffix/suffix_repeated.py --prompts 20 --max-tokens 128 --out benchmarks/results/suffix/repeated
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pycode_args.py lives in benchmarks/
from pycode_args import add_pycode_args, load_pycode

METHODS = [("ar", {}), ("lookup", {}), ("suffix", {}), ("auto", {"proposers": "draft,lookup,suffix"})]


def serve(app):
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pycode_args(ap)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from openai import OpenAI

    from multispec.bench.runner import environment
    from multispec.data import load_prompts
    from multispec.serve import ServeSettings, create_app

    pair = load_pycode(args)
    prompts = [p.text for p in load_prompts("humaneval", data_dir=args.data_dir, limit=args.prompts)]
    # a long shared system prompt: the helper module every request starts with (as agents and templates do)
    system = load_prompts("humaneval", data_dir=args.data_dir, limit=1, offset=100)[0].text * 3
    others = [p.text for p in load_prompts("humaneval", data_dir=args.data_dir, limit=args.prompts, offset=40)]
    workloads = {"repeat_pass1": prompts, "repeat_pass2": prompts,
                 "shared_system_prompt": [system + "\n\n" + p for p in others]}
    rows = []
    for name, options in METHODS:
        app = create_app(pair, ServeSettings(model_name="pycode", method=name, method_options=options,
                                             max_concurrent=1))
        server, thread, url = serve(app)
        client = OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        client.completions.create(model="pycode", prompt="x = 1", max_tokens=4, temperature=0)  # warm-up
        for workload, texts in workloads.items():
            toks = accepted = steps = 0
            started = time.perf_counter()
            for text in texts:
                r = client.completions.create(model="pycode", prompt=text, max_tokens=args.max_tokens, temperature=0)
                toks += r.usage.completion_tokens
                spec = r.model_extra["spec_decode"]
                accepted += spec["num_accepted_draft_tokens"]
                steps += spec["num_spec_steps"]
            seconds = time.perf_counter() - started
            rows.append({"method": name, "options": options, "workload": workload, "requests": len(texts),
                         "completion_tokens": toks, "seconds": seconds, "tokens_per_s": toks / seconds,
                         "mean_acceptance_length": 1 + accepted / steps if steps else None})
            print(json.dumps(rows[-1]), file=sys.stderr)
        server.should_exit = True
        thread.join(10)
    ar = {r["workload"]: r["tokens_per_s"] for r in rows if r["method"] == "ar"}
    for r in rows:
        r["speedup_vs_ar"] = r["tokens_per_s"] / ar[r["workload"]]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": environment(pair, sys.argv), "rows": rows}, indent=1))
    lines = ["| method | " + " | ".join(workloads) + " |", "|---|" + "---|" * len(workloads)]
    for name, options in METHODS:
        label = name + ("" if not options else ":" + ",".join(f"{k}={v}" for k, v in options.items()))
        cells = [next(f"{r['tokens_per_s']:.1f} ({r['speedup_vs_ar']:.2f}×)" for r in rows
                      if r["method"] == name and r["workload"] == w) for w in workloads]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    (out / "results.md").write_text("tokens/s (speedup over ar), greedy, one client\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
