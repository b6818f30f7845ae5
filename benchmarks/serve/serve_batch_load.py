"""Continuous batching under load: `multispec serve --max-batch 32` against `--max-batch 1`, same requests, one run.

Per setting, one server subprocess (pycode-v1, or --target alone, fast backend, one torch thread, the default method): C streaming
clients x R requests each, greedy, max_tokens M (distinct HumanEval prompts: none repeats by default). Records total tokens/s, time to first
token and inter-token latency p50/p99, the server's RSS, and checks every response's token ids against the offline
library result for its prompt. Then, on the batched server only, a cancellation phase: `slots` long streams start,
8 are abandoned mid-run, and 8 new requests must be admitted at once (their queue time, from /metrics, and time to
first token are reported). With --server-cpus, the library itself is timed first on the server's CPUs at each
setting (same requests, no HTTP): each run's server_vs_library says what serving adds. Writes one JSON file.

    PYTHONPATH=src python benchmarks/serve/serve_batch_load.py --out benchmarks/results/batch/serve_load.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pycode_args.py lives in benchmarks/
from pycode_args import add_pycode_args
from serve_load import proc_status_mb

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


class Server:
    """`multispec serve` in a subprocess on a free loopback port, its RSS sampled every 0.2 s."""

    def __init__(self, args, max_batch: int, profile: Path):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        models = f"{args.models}/pycode-v1"
        pair = ["--target", args.target] if args.target else ["--target", f"{models}/target", "--draft",
                                                               f"{models}/draft"]
        pin = ["taskset", "-c", args.server_cpus] if args.server_cpus else []
        self.cmd = [*pin, PYTHON, "-m", "multispec", "serve", *pair, "--backend", "fast", "--threads", "1", "--port", str(self.port), "--max-batch", str(max_batch),
                    "--max-concurrent", "1", "--max-queue", str(args.clients * args.requests_per_client),
                    "--profile", str(profile), "--log-level", "warning"]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.rss_peak_mb = 0.0
        self._stderr: list[str] = []
        self._sampling = True
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()

    def rss_mb(self, field: str = "VmRSS") -> float | None:
        return proc_status_mb(self.proc.pid, field)

    def sample(self) -> None:
        def loop():
            while self._sampling:
                self.rss_peak_mb = max(self.rss_peak_mb, self.rss_mb() or 0.0)
                time.sleep(0.2)
        threading.Thread(target=loop, daemon=True).start()

    async def ready(self, http) -> None:
        import httpx

        for _ in range(1200):
            if self.proc.poll() is not None:
                raise SystemExit("the server exited:\n" + "".join(self._stderr[-20:]))
            try:
                if (await http.get(self.url + "/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
        raise SystemExit("the server did not start")

    def stop(self) -> dict:
        self._sampling = False
        out = {"rss_peak_sampled_mb": self.rss_peak_mb, "rss_hwm_mb": self.rss_mb("VmHWM"), "command": self.cmd}
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return out


async def stream_one(http, url: str, prompt: str, max_tokens: int, stop_after: int | None = None) -> dict:
    """One streaming completion; returns arrival times of text chunks, token ids and timings. stop_after: abandon
    the stream after that many text chunks."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "return_token_ids": True}
    start = time.perf_counter()
    times, ids = [], []
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                if c.get("text"):
                    times.append(time.perf_counter())
                ids = c.get("token_ids") or ids
            if stop_after is not None and len(times) >= stop_after:
                break
    return {"start": start, "times": times, "ids": ids, "end": time.perf_counter()}


def percentiles(xs) -> dict:
    return {"p50": float(np.percentile(xs, 50)), "p99": float(np.percentile(xs, 99)), "max": float(np.max(xs))} \
        if len(xs) else {}


async def load(args, server: Server, prompts, offline) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as http:
        await server.ready(http)
        server.sample()
        rss_start = server.rss_mb()

        async def client(i: int) -> list:
            out = []
            for j in range(args.requests_per_client):
                k = prompt_index(args, prompts, i, j)
                rec = await stream_one(http, server.url, prompts[k], args.max_tokens)
                rec["prompt"] = k
                out.append(rec)
            return out

        t0 = time.perf_counter()
        recs = [r for rs in await asyncio.gather(*(client(i) for i in range(args.clients))) for r in rs]
        wall = time.perf_counter() - t0
        tokens = sum(len(r["ids"]) for r in recs)
        ttft = [r["times"][0] - r["start"] for r in recs if r["times"]]
        itl = [b - a for r in recs for a, b in zip(r["times"], r["times"][1:])]
        equal = sum(r["ids"] == offline[r["prompt"]] for r in recs)
        report = {"requests": len(recs), "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
                  "equal_to_offline": equal, "ttft_s": percentiles(ttft), "inter_token_s": percentiles(itl),
                  "rss_start_mb": rss_start}
        if args.cancel and server.cmd[server.cmd.index("--max-batch") + 1] != "1":
            report["cancel"] = await cancel_phase(args, server, prompts, http)
    return report


async def cancel_phase(args, server, prompts, http) -> dict:
    """`slots` long streams; 8 (at most `slots`) are abandoned after 4 chunks; then as many new requests: admitted
    at once? (Their time to first token against the load phase's.)"""
    slots = int(server.cmd[server.cmd.index("--max-batch") + 1])
    n = min(8, slots)
    long = [asyncio.create_task(stream_one(http, server.url, prompts[i % len(prompts)], 512,
                                           stop_after=4 if i < n else None)) for i in range(slots)]
    await asyncio.gather(*long[:n])
    await asyncio.sleep(0.5)  # the server notices the closed connections at their next committed text
    metrics = (await http.get(server.url + "/metrics")).text
    running = next(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("multispec:num_requests_running"))
    fresh = await asyncio.gather(*(stream_one(http, server.url, prompts[i % len(prompts)], 16) for i in range(n)))
    for t in long[n:]:
        t.cancel()
    ttft = [r["times"][0] - r["start"] for r in fresh if r["times"]]
    return {"streams": slots, "abandoned": n, "running_after_abandon": running,
            "new_requests_ttft_s": percentiles(ttft), "new_requests_completed": sum(bool(r["ids"]) for r in fresh)}


def prompt_index(args, prompts, client: int, j: int) -> int:
    """The prompt of client `client`'s j-th request: distinct while prompts >= clients x requests."""
    return (client + j * args.clients) % len(prompts)


def offline_rates(args, pair, prompts, profile: Path, scratch: Path) -> dict[int, float]:
    """Total tokens/s of the library itself at each --batches setting, this process pinned to the server's CPUs
    for the time: the server's requests (clients x requests each, greedy, max_tokens) through `generate` one at a
    time (max-batch 1) or `generate_batch` (batch_size b), planning from a copy of the server's profile. What the
    server adds (HTTP, streaming, its scheduler) is the gap between the two."""
    from multispec.decoding.batch_offline import generate_batch
    from multispec.decoding.decoder import Decoder

    n = args.clients * args.requests_per_client
    asked = [prompts[prompt_index(args, prompts, i, j)] for j in range(args.requests_per_client)
             for i in range(args.clients)]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for c in args.server_cpus.split(",")})
    rates = {}
    try:
        for b in [int(x) for x in args.batches.split(",")]:
            copy = scratch / f"profile_offline_{b}.json"
            shutil.copy(profile, copy)
            decoder = Decoder(pair, "auto", "fast", profile=str(copy))
            t0 = time.perf_counter()
            if b == 1:
                tokens = sum(len(decoder.generate(p, max_new_tokens=args.max_tokens, temperature=0).token_ids)
                             for p in asked)
            else:
                out = generate_batch(decoder, asked, batch_size=min(b, n), max_new_tokens=args.max_tokens,
                                     temperature=0)
                tokens = sum(len(r.token_ids) for r in out)
            rates[b] = tokens / (time.perf_counter() - t0)
            print(f"library, batch {b}: {rates[b]:.1f} tok/s", file=sys.stderr)
    finally:
        os.sched_setaffinity(0, before)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_pycode_args(ap)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=128, help="HumanEval prompts; client i's request j takes prompt "
                    "i + j x clients (cycled): no prompt repeats while prompts >= clients x requests, so suffix "
                    "caching of earlier answers flatters neither setting")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batches", default="32,1")
    ap.add_argument("--cancel", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--target", help="another model alone (a GGUF file or a folder) instead of the pycode-v1 pair: "
                    "auto then plans lookup and suffix drafts")
    ap.add_argument("--server-cpus", help="pin the server to these CPUs (taskset -c), e.g. 0: the clients then "
                    "run beside it, not on its core")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import multispec.decoding.batch, multispec.drafting.auto, multispec.drafting.costs  # noqa: F401,E401 - all code read now

    import torch

    torch.set_num_threads(1)
    from multispec import load_pair
    from multispec.bench.runner import environment
    from multispec.data import load_prompts
    from multispec.decoding.decoder import Decoder

    pair = load_pair(args.target, device="cpu") if args.target else \
        load_pair(f"{args.models}/pycode-v1/target", f"{args.models}/pycode-v1/draft", device="cpu")
    prompts = [p.text for p in load_prompts("humaneval", args.data_dir, limit=args.prompts)]
    decoder = Decoder(pair, "auto", "fast")  # the server's default method, on its backend
    offline = [decoder.generate(p, max_new_tokens=args.max_tokens, temperature=0).token_ids for p in prompts]
    scratch = Path(tempfile.mkdtemp(prefix="serve_batch_load_"))
    # every server setting plans from the same pinned profile (read only): this machine's costs and the acceptance
    # the offline runs observed, so that no setting starts from what another left behind
    profile = decoder.updated_profile().save(scratch / "profile.json")
    report = {"settings": vars(args), "environment": environment(pair, [PYTHON, *sys.argv]), "runs": {},
              "profile": decoder.updated_profile().digest}
    library = offline_rates(args, pair, prompts, profile, scratch) if args.server_cpus else {}
    for b in [int(x) for x in args.batches.split(",")]:
        server = Server(args, b, profile)
        try:
            run = asyncio.run(load(args, server, prompts, offline))
        finally:
            run_server = server.stop()
        run["server"] = run_server
        if b in library:  # the library on the server's core, same prompts and settings, no HTTP
            run["library_tokens_per_s"] = library[b]
            run["server_vs_library"] = run["tokens_per_s"] / library[b]
        report["runs"][f"max_batch_{b}"] = run
        print(f"--max-batch {b}: {run['tokens_per_s']:.1f} tok/s, {run['equal_to_offline']}/{run['requests']} equal "
              f"to offline, TTFT p50 {run['ttft_s'].get('p50', 0):.2f}s p99 {run['ttft_s'].get('p99', 0):.2f}s",
              file=sys.stderr)
    shutil.rmtree(scratch, ignore_errors=True)
    runs = report["runs"]
    if "max_batch_1" in runs and len(runs) > 1:
        top = max(runs, key=lambda k: int(k.rsplit("_", 1)[1]))
        report["throughput_ratio"] = runs[top]["tokens_per_s"] / runs["max_batch_1"]["tokens_per_s"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: {kk: v for kk, v in r.items() if kk != "server"} for k, r in runs.items()}, indent=1))
    print("ratio", report.get("throughput_ratio"))


if __name__ == "__main__":
    main()
