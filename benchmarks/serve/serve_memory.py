"""Peak memory (RSS) of a batching server under concurrent requests (issue 41: `--max-batch 8` on Gemma 3 270M).

Starts `multispec serve --target T --max-batch B --threads 1` (default --max-model-len), reads its start-up line on
the KV caches, sends C concurrent /v1/completions (max_tokens N, T = 0.7) R times, and samples the server's RSS
every 50 ms from start to end. Writes the start-up line, RSS after start-up and at peak, and the versions.

    python benchmarks/serve/serve_memory.py --target gemma-3-270m-q4_k_m.gguf --out benchmarks/results/hostile/gemma_serve_memory.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a hash map works.",
           "List three uses of copper.", "What is the capital of Australia and why?",
           "def quicksort(xs):", "Translate to French: the weather is nice today.",
           "Summarize the plot of Hamlet in two sentences.", "Give me a recipe for pancakes."]


def rss_gb(pid: int) -> float:
    """Resident memory of `pid` and its children (the server process), in GB."""
    total = 0
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    for p in [pid] + children:
        try:
            total += int(next(x for x in Path(f"/proc/{p}/status").read_text().splitlines()
                              if x.startswith("VmRSS")).split()[1])
        except (OSError, StopIteration):
            pass
    return total / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--goal-gb", type=float, default=3.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "import sys; from multispec.cli import main; sys.argv[0] = 'multispec'; main()",
           "serve", "--target", a.target, "--max-batch", str(a.max_batch), "--threads", "1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                samples.append(rss_gb(proc.pid))
            except OSError:
                pass
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                sys.exit("server exited: " + "".join(lines)[-2000:])
            time.sleep(0.5)
        after_start = rss_gb(proc.pid)
        print(f"ready; RSS {after_start:.2f} GB", file=sys.stderr, flush=True)

        def one(i: int) -> int:
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": a.max_tokens, "temperature": 0.7, "seed": i}
            r = httpx.post(url + "/v1/completions", json=body, timeout=600)
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        tokens = 0
        with ThreadPoolExecutor(a.clients) as pool:
            for k in range(a.rounds):
                tokens += sum(pool.map(one, range(k * a.clients, (k + 1) * a.clients)))
                print(f"round {k + 1}/{a.rounds}: peak RSS so far {max(samples):.2f} GB", file=sys.stderr, flush=True)
    finally:
        done.set()
        proc.terminate()
        proc.wait(30)
    import torch
    import transformers

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    cache_line = next((x.strip() for x in lines if "KV caches" in x), None)
    out = {"what": f"multispec serve --target {Path(a.target).name} --max-batch {a.max_batch} --threads 1 (default "
                   f"--max-model-len), {a.clients} concurrent /v1/completions x {a.rounds}, {a.max_tokens} tokens, "
                   "T=0.7",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit,
           "torch": torch.__version__, "transformers": transformers.__version__, "startup_line": cache_line,
           "completion_tokens": tokens, "rss_after_start_gb": round(after_start, 3),
           "peak_rss_gb": round(max(samples), 3), "goal_gb": a.goal_gb, "met": max(samples) <= a.goal_gb}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
