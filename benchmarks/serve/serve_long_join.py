"""Time to first token of running streams while a long prompt joins a batching server (issue 42, chunked prefill).

Starts `multispec serve` (pycode-v1, --max-batch B, --threads 1) from the source tree --src; C streaming clients
send short HumanEval prompts back to back (max_tokens 32, greedy); after a warm-up, one client sends a ~2,000-token
prompt (max_tokens 8). Reports, over the short requests that started after the warm-up: time to first token p50 and
p99 and their ratio, the longest gap between two chunks of a stream while the long prompt was being prefilled, and
the long request's own time to first token. Run it on two source trees to compare (--src, --label).

    python benchmarks/serve/serve_long_join.py --src src --label chunked --out benchmarks/results/batch/long_join_chunked.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PYCODE = ROOT.parent / "shared" / "models" / "pycode-v1"
DATA = ROOT.parent / "shared" / "data"


async def stream(http, body) -> tuple[float, list[float]]:
    """(time to first token, arrival times of the content chunks)."""
    t0, arrivals = time.perf_counter(), []
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]" and json.loads(line[6:])["choices"][0]["text"]:
                arrivals.append(time.perf_counter())
    return (arrivals[0] - t0 if arrivals else float("nan")), arrivals


async def run(args, url: str, prompts: list[str], long_prompt: str, lengths: list[int]) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        for _ in range(600):
            try:
                if (await http.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
        await stream(http, {"prompt": prompts[0], "max_tokens": 4, "temperature": 0})  # warm-up
        start = time.perf_counter()
        records: list[tuple[float, float, list[float]]] = []
        stop_at = start + args.seconds
        join_at = start + args.warmup
        window: dict = {}

        async def client(i: int) -> None:
            k = i
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                ttft, arrivals = await stream(http, {"prompt": prompts[k % len(prompts)], "max_tokens": 32,
                                                     "temperature": 0})
                records.append((t, ttft, arrivals, k % len(prompts)))
                k += args.clients

        async def joiner() -> None:
            await asyncio.sleep(join_at - time.perf_counter())
            window["start"] = time.perf_counter()
            ttft, _ = await stream(http, {"prompt": long_prompt, "max_tokens": 8, "temperature": 0})
            window["end"] = time.perf_counter()
            window["ttft"] = ttft

        await asyncio.gather(joiner(), *(client(i) for i in range(args.clients)))
    after = [r for r in records if r[0] >= join_at - 1.0]
    ttfts = np.array([r[1] for r in after])
    slowest = sorted(after, key=lambda r: -r[1])[:3]  # when they started (against the join) and their prompt
    gaps = []
    for _, _, arrivals, _ in records:  # chunk gaps that overlap the long prompt's time before its first token
        for a, b in zip(arrivals, arrivals[1:]):
            if b >= window["start"] and a <= window["start"] + window["ttft"]:
                gaps.append(b - a)
    return {"label": args.label, "clients": args.clients, "max_batch": args.max_batch,
            "short_requests": len(after), "ttft_p50_s": float(np.percentile(ttfts, 50)),
            "ttft_p99_s": float(np.percentile(ttfts, 99)),
            "ttft_p99_over_p50": float(np.percentile(ttfts, 99) / np.percentile(ttfts, 50)),
            "max_stream_gap_during_join_s": max(gaps) if gaps else None,
            "long_prompt_tokens": args.long_tokens, "long_ttft_s": window["ttft"],
            "slowest": [{"ttft_s": r[1], "started_after_join_s": r[0] - window["start"], "prompt": r[3],
                         "prompt_tokens": lengths[r[3]]} for r in slowest]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--label", default="branch")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--method", default="ar")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=10)
    ap.add_argument("--long-tokens", type=int, default=2000)
    ap.add_argument("--max-model-len", type=int, default=2048, help="the server's --max-model-len (its slots' "
                    "length; a wide batch's default is shorter than the long prompt)")
    ap.add_argument("--server-cpus", help="pin the server to these CPUs (taskset -c), e.g. 0; the clients stay free")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.src)
    from multispec.data import load_prompts
    from transformers import AutoTokenizer

    prompts = [p.text for p in load_prompts("humaneval", data_dir=str(DATA), limit=100)][60:100]
    tok = AutoTokenizer.from_pretrained(str(PYCODE / "target"))
    ids = tok("\n\n".join(p.text for p in load_prompts("humaneval", data_dir=str(DATA), limit=60)))["input_ids"]
    long_prompt = tok.decode(ids[:args.long_tokens])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    pin = ["taskset", "-c", args.server_cpus] if args.server_cpus else []
    cmd = [*pin, sys.executable, "-m", "multispec", "serve", "--target", str(PYCODE / "target"), "--draft",
           str(PYCODE / "draft"), "--method", args.method, "--threads", "1", "--host", "127.0.0.1", "--port",
           str(port), "--max-batch", str(args.max_batch), "--max-queue", "64",
           "--max-model-len", str(args.max_model_len), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": args.src}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        report = asyncio.run(run(args, f"http://127.0.0.1:{port}", prompts, long_prompt,
                                 [len(tok(p)["input_ids"]) for p in prompts]))
    finally:
        proc.terminate()
        proc.wait(30)
    print(json.dumps(report, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
