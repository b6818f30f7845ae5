"""Throughput of `multispec serve` replicas on Ray Serve: C concurrent requests through the Serve endpoint with 2
replicas and with 1, on a local single-machine Ray cluster kept on the loopback address (multispec.serve.ray.init).

Each replica serves the embedded default pair (or --target/--draft) with --threads torch threads and 1 Ray CPU per
thread; every answer is checked against the library's (`multispec.generate`, greedy) for its prompt. With --fault,
the 2-replica run also kills one replica's process by its pid once the load is under way; requests the dead
replica was answering are retried by the client (up to 6 times), and the run reports how many were retried, whether
any was lost or answered twice, and the p99 latency during the fault.

    PYTHONPATH=src python benchmarks/deploy/ray_throughput.py --out benchmarks/results/deploy/ray_throughput.json

Needs the extra: pip install 'multispec[ray]' (without it the script says so and exits 0). For replicas to scale the
machine needs replicas x threads free cores; the 1.7x of 2 replicas over 1 is a property of such a machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

PROMPTS = ["def f(x):", "import os\n", "class A:", "for i in range(3):", "x = [", "return ", "# sum two numbers\n",
           "while True:", "def area(r):", "with open(path) as f:", "try:\n    ", "print(", "if n < 2:", "lambda x:",
           "async def main():", "from typing import"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.update(kids)
        todo.extend(kids)
    return out


def replica_pids() -> list[int]:
    pids = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ServeReplica:multispec:multispec" in f.read():
                    pids.append(pid)
        except OSError:
            pass
    return sorted(pids)


def ask(url: str, prompt: str, max_tokens: int, retries: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    t0 = time.perf_counter()
    for attempt in range(retries + 1):
        try:
            r = httpx.post(url + "/v1/completions", json=body, timeout=600)
            if r.status_code == 200:
                answer = r.json()
                return {"prompt": prompt, "id": answer["id"], "token_ids": answer["choices"][0]["token_ids"],
                        "retries": attempt, "latency_s": time.perf_counter() - t0}
        except httpx.HTTPError:
            pass
        time.sleep(0.5 * (attempt + 1))
    return {"prompt": prompt, "id": None, "token_ids": None, "retries": retries, "latency_s": time.perf_counter() - t0}


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[max(0, round(0.99 * len(values)) - 1)] if values else float("nan")


def load(url: str, prompts: list[str], max_tokens: int, offline: dict, kill_after_s: float | None) -> dict:
    killed = None
    with ThreadPoolExecutor(len(prompts)) as pool:
        t0 = time.perf_counter()
        futures = [pool.submit(ask, url, p, max_tokens, 6 if kill_after_s is not None else 0) for p in prompts]
        if kill_after_s is not None:
            threading.Event().wait(kill_after_s)
            killed = replica_pids()[0]
            os.kill(killed, signal.SIGKILL)
        answers = [f.result() for f in futures]
        wall = time.perf_counter() - t0
    answered = [a for a in answers if a["id"] is not None]
    tokens = sum(len(a["token_ids"]) for a in answered)
    out = {"requests": len(prompts), "answered": len(answered), "lost": len(prompts) - len(answered),
           "answered_twice": len(answered) - len({a["id"] for a in answered}),
           "equal_to_library": sum(a["token_ids"] == offline[a["prompt"]] for a in answered),
           "completion_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
           "p50_latency_s": sorted(a["latency_s"] for a in answers)[len(answers) // 2],
           "p99_latency_s": p99([a["latency_s"] for a in answers])}
    if kill_after_s is not None:
        out.update(killed_pid=killed, retried_requests=sum(a["retries"] > 0 for a in answers),
                   retries=sum(a["retries"] for a in answers))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64, help="concurrent requests per run")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 1], help="replica counts to run, in order")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (and Ray CPUs) per replica")
    ap.add_argument("--max-concurrent", type=int, default=4, help="generations in flight per replica")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--fault", action="store_true", help="also a 2-replica run with one replica killed mid-load")
    ap.add_argument("--kill-after", type=float, default=1.0, help="seconds into the fault run")
    ap.add_argument("--dataset", help="distinct prompts from this dataset (humaneval, ...; multispec.data), "
                    "else the built-in 16 repeated: a replica's suffix drafting learns from earlier answers to the "
                    "same prompt, so repeats favour one replica over two")
    ap.add_argument("--data-dir", help="the dataset's folder (default: $MULTISPEC_DATA)")
    ap.add_argument("--out", type=Path, help="JSON results (default: stdout)")
    args = ap.parse_args()
    if args.out is not None:  # checked before the cluster starts
        from multispec.errors import MultispecError
        from multispec.paths import writable_file

        try:
            writable_file(args.out)
        except MultispecError as e:
            ap.error(str(e))
    try:
        import ray
        from ray import serve
    except ImportError:
        print("Ray Serve is not installed (pip install 'multispec[ray]'); nothing to measure", file=sys.stderr)
        return 0
    import torch

    from multispec import generate, load_pair
    from multispec.serve import ray as ray_serve

    torch.set_num_threads(args.threads)
    if args.dataset:
        from multispec.data import load_prompts
        prompts = [p.text for p in load_prompts(args.dataset, args.data_dir, limit=args.requests)]
        if len(prompts) < args.requests:
            ap.error(f"{args.dataset} has {len(prompts)} prompts, fewer than --requests {args.requests}")
    else:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    pair = load_pair(target=args.target, draft=args.draft)
    offline = {p: generate(pair, p, max_new_tokens=args.max_tokens, temperature=0.0).token_ids for p in set(prompts)}
    del pair
    runs = []
    cpus = max(args.replicas) * args.threads
    ray_serve.init(num_cpus=cpus, object_store_memory=100 * 2**20)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        plan = [(n, False) for n in args.replicas] + ([(2, True)] if args.fault else [])
        for replicas, fault in plan:
            app = ray_serve.deployment(args.target, args.draft, replicas=replicas, threads=args.threads,
                                       settings={"model_name": "bench", "max_concurrent": args.max_concurrent,
                                                 "max_queue": args.requests})
            ray_serve.run(app, port=port)
            for p in PROMPTS[:replicas * 2]:  # every replica's first call, before the clock
                ask(url, p, 4, 0)
            result = load(url, prompts, args.max_tokens, offline, args.kill_after if fault else None)
            result.update(replicas=replicas, fault=fault)
            print(json.dumps(result), file=sys.stderr)
            runs.append(result)
            serve.delete("multispec")
    finally:
        serve.shutdown()
        ray.shutdown()
    plain = {r["replicas"]: r for r in runs if not r["fault"]}
    report = {
        "command": " ".join(["python", *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "ray": ray.__version__},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": runs,
        "speedup_2_over_1": plain[2]["tokens_per_s"] / plain[1]["tokens_per_s"] if {1, 2} <= set(plain) else None,
    }
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
