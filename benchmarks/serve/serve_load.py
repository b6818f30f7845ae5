"""Bounded load test of `multispec serve` on loopback; it stops by itself and writes one JSON file.

Phases, against one server subprocess (`multispec serve --threads 1`):
1. load: C concurrent streaming clients (official `openai` AsyncOpenAI) x R requests each, greedy; every request
   must complete and its token ids must equal the offline `multispec.generate` ones (computed first, in this
   process, same prompts). Records p50/p99 latency and time to first token, total tokens/s, server RSS start/peak,
   and checks that /metrics (parsed by prometheus_client) moved by exactly the per-request metrics summed.
2. burst: max_concurrent + max_queue + extra simultaneous requests; the extra ones must get 429 with Retry-After,
   and afterwards the server must still answer a greedy request correctly.
3. fuzz: N malformed bodies (seeded); each must get a 4xx, and the server must stay healthy and correct.

    PYTHONPATH=src python benchmarks/serve/serve_load.py            # pycode-v1, 32 x 4, max_tokens 32
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PYCODE = ROOT.parent / "shared" / "models" / "pycode-v1"
DATA = ROOT.parent / "shared" / "data"
PYTHON = sys.executable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(PYCODE / "target"))
    ap.add_argument("--draft", default=str(PYCODE / "draft"))
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--data-dir", default=str(DATA))
    ap.add_argument("--prompts", type=int, default=32, help="distinct HumanEval prompts, cycled over requests")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-concurrent", type=int, default=4)
    ap.add_argument("--max-queue", type=int, default=32)
    ap.add_argument("--burst-extra", type=int, default=24, help="requests beyond max_concurrent + max_queue")
    ap.add_argument("--fuzz", type=int, default=100)
    ap.add_argument("--time-limit", type=float, default=1800, help="seconds; the whole run is cut off after it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve" / "load.json"))
    args = ap.parse_args()
    assert args.max_queue + args.max_concurrent >= args.clients, "the load phase must fit in the queue"

    import torch

    torch.set_num_threads(1)
    from multispec import generate, load_pair
    from multispec.bench.runner import environment
    from multispec.data import load_prompts

    pair = load_pair(args.target, args.draft, device="cpu")
    prompts = [p.text for p in load_prompts("humaneval", args.data_dir, limit=args.prompts)]
    t0 = time.perf_counter()
    offline = [generate(pair, p, max_new_tokens=args.max_tokens, temperature=0.0) for p in prompts]
    offline_s = time.perf_counter() - t0
    offline_tokens = sum(len(r.token_ids) for r in offline)
    print(f"offline: {offline_tokens} tokens in {offline_s:.1f}s", flush=True)

    server = Server(args)
    try:
        report = asyncio.run(asyncio.wait_for(run_phases(args, server, prompts, offline), args.time_limit))
    finally:
        server.stop()
    report["offline_sequential"] = {"tokens": offline_tokens, "seconds": offline_s,
                                    "tokens_per_s": offline_tokens / offline_s, "method": offline[0].stats["method"]}
    report["throughput_ratio_server_over_offline"] = (report["load"]["tokens_per_s"]
                                                      / report["offline_sequential"]["tokens_per_s"])
    report["server"] = {"rss_start_mb": server.rss_start_mb, "rss_peak_sampled_mb": server.rss_peak_mb,
                        "rss_hwm_mb": server.hwm_mb, "command": server.cmd}
    report["settings"] = vars(args)
    report["environment"] = environment(pair, [PYTHON, *sys.argv])
    report["all_ok"] = all(report[k]["ok"] for k in ("load", "burst", "fuzz"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("load", "burst", "fuzz", "server", "all_ok")}, indent=2))
    print(f"wrote {out}")
    sys.exit(0 if report["all_ok"] else 1)


def proc_status_mb(pid: int, field: str) -> float | None:
    """A /proc/PID/status memory field (VmRSS, VmHWM) in MB, or None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Server:
    """`multispec serve` in a subprocess on a free loopback port, with its RSS sampled every 0.2 s."""

    def __init__(self, args):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [PYTHON, "-m", "multispec", "serve", "--target", args.target, "--draft", args.draft,
                    "--threads", "1", "--host", "127.0.0.1", "--port", str(self.port), "--max-concurrent",
                    str(args.max_concurrent), "--max-queue", str(args.max_queue), "--log-level", "warning"]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.rss_start_mb = self.rss_peak_mb = self.hwm_mb = None
        self._sampling = True
        self._stderr: list[str] = []
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()

    def status_mb(self, field: str) -> float | None:
        return proc_status_mb(self.proc.pid, field)

    def start_sampling(self) -> None:
        self.rss_start_mb = self.rss_peak_mb = self.status_mb("VmRSS")

        def sample():
            while self._sampling:
                rss = self.status_mb("VmRSS")
                if rss is not None:
                    self.rss_peak_mb = max(self.rss_peak_mb, rss)
                time.sleep(0.2)
        threading.Thread(target=sample, daemon=True).start()

    def stop(self) -> None:
        self._sampling = False
        self.hwm_mb = self.status_mb("VmHWM")
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def run_phases(args, server: Server, prompts: list[str], offline) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=server.url, timeout=600,
                                 limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100)) as http:
        for _ in range(600):
            if server.proc.poll() is not None:
                raise SystemExit("the server exited:\n" + "".join(server._stderr[-20:]))
            try:
                if (await http.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)
        server.start_sampling()
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        report = {"load": await load_phase(args, server, model, prompts, offline, http)}
        report["burst"] = await burst_phase(args, model, prompts, offline, http)
        report["fuzz"] = await fuzz_phase(args, model, prompts, offline, http)
    return report


async def greedy_still_correct(http, model, prompt, ref, max_tokens) -> bool:
    r = await http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                 "temperature": 0, "return_token_ids": True})
    return r.status_code == 200 and r.json()["choices"][0]["token_ids"] == ref.token_ids


async def scrape(http) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = (await http.get("/metrics")).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def load_phase(args, server, model, prompts, offline, http) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600,
                         http_client=httpx_client())
    records = []

    async def one(i: int, j: int) -> None:
        k = (i + j * 8) % len(prompts)
        start = time.perf_counter()
        first, text, ids, usage, spec, finish, error = None, "", None, None, None, None, None
        try:
            stream = await client.completions.create(
                model=model, prompt=prompts[k], max_tokens=args.max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
            async for chunk in stream:
                if chunk.choices:
                    c = chunk.choices[0]
                    if c.text and first is None:
                        first = time.perf_counter()
                    text += c.text
                    finish = c.finish_reason or finish
                    ids = (c.model_extra or {}).get("token_ids") or ids
                    spec = (chunk.model_extra or {}).get("spec_decode") or spec
                if chunk.usage is not None:
                    usage = chunk.usage
        except Exception as e:  # noqa: BLE001 - recorded as a failed request
            error = f"{type(e).__name__}: {e}"
        end = time.perf_counter()
        records.append({"client": i, "request": j, "prompt": k, "latency_s": end - start,
                        "ttft_s": None if first is None else first - start, "error": error, "finish_reason": finish,
                        "completion_tokens": None if usage is None else usage.completion_tokens, "spec": spec,
                        "equal_offline": ids == offline[k].token_ids and text == offline[k].text})

    async def client_loop(i: int) -> None:
        for j in range(args.requests_per_client):
            await one(i, j)

    before = await scrape(http)
    t0 = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(args.clients)))
    wall = time.perf_counter() - t0
    after = await scrape(http)
    await client.close()

    done = [r for r in records if r["error"] is None and r["completion_tokens"] is not None]
    lat = np.array([r["latency_s"] for r in done])
    ttft = np.array([r["ttft_s"] for r in done if r["ttft_s"] is not None])
    tokens = sum(r["completion_tokens"] for r in done)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    specs = [r["spec"] for r in done]
    depth = max(len(s["accepted_per_position"]) for s in specs)
    agree = {
        "num_drafts": delta("multispec:spec_decode_num_drafts_total") == sum(s["num_spec_steps"] for s in specs),
        "num_draft_tokens": delta("multispec:spec_decode_num_draft_tokens_total")
        == sum(s["num_draft_tokens"] for s in specs),
        "num_accepted_tokens": delta("multispec:spec_decode_num_accepted_tokens_total")
        == sum(s["num_accepted_draft_tokens"] for s in specs),
        "accepted_per_pos": all(
            delta("multispec:spec_decode_num_accepted_tokens_per_pos_total", position=str(p))
            == sum(s["accepted_per_position"][p] for s in specs if p < len(s["accepted_per_position"]))
            for p in range(depth)),
        "generation_tokens": delta("multispec:generation_tokens_total") == tokens,
        "requests": delta("multispec:e2e_request_latency_seconds_count") == len(done),
    }
    drafts = sum(s["num_spec_steps"] for s in specs)
    accepted = sum(s["num_accepted_draft_tokens"] for s in specs)
    n = args.clients * args.requests_per_client
    out = {
        "requests": n, "completed": len(done), "equal_offline": sum(r["equal_offline"] for r in records),
        "errors": [r["error"] for r in records if r["error"]][:5],
        "wall_s": wall, "completion_tokens": tokens, "tokens_per_s": tokens / wall,
        "latency_s": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                      "max": float(lat.max())},
        "ttft_s": {"p50": float(np.percentile(ttft, 50)), "p99": float(np.percentile(ttft, 99)),
                   "max": float(ttft.max())},
        "method": specs[0]["method"], "lossless": specs[0]["lossless"],
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "metrics_agree": agree,
    }
    out["ok"] = out["completed"] == n and out["equal_offline"] == n and all(agree.values())
    print("load:", {k: out[k] for k in ("completed", "equal_offline", "tokens_per_s", "latency_s", "ttft_s")},
          flush=True)
    return out


def httpx_client():
    import httpx

    return httpx.AsyncClient(limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100), timeout=600)


async def burst_phase(args, model, prompts, offline, http) -> dict:
    n = args.max_concurrent + args.max_queue + args.burst_extra
    body = {"model": model, "prompt": prompts[0], "max_tokens": args.max_tokens, "temperature": 0}
    rs = await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(n)))
    codes = [r.status_code for r in rs]
    rejected = [r for r in rs if r.status_code == 429]
    retry_after = all(r.headers.get("retry-after") and r.json()["error"]["code"] == "queue_full" for r in rejected)
    still = await greedy_still_correct(http, model, prompts[1], offline[1], args.max_tokens)
    health = (await http.get("/health")).status_code == 200
    out = {"sent": n, "ok_200": codes.count(200), "rejected_429": len(rejected),
           "other": sorted(set(codes) - {200, 429}), "retry_after_header": retry_after,
           "server_correct_after": still, "healthy_after": health}
    out["ok"] = (out["ok_200"] + out["rejected_429"] == n and out["rejected_429"] >= args.burst_extra
                 and retry_after and still and health)
    print("burst:", out, flush=True)
    return out


def fuzz_bodies(n: int, seed: int, model: str) -> list[tuple[str, bytes]]:
    """n malformed (path, body) pairs, each invalid by construction: broken JSON, wrong types, unknown fields,
    out-of-range values, unsupported options, prompts over the context, oversized or deeply nested bodies."""
    rng = random.Random(seed)
    valid = {"model": model, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
    junk = [None, True, "7", -3, 2.5, [], {}, [1, "a"], "x" * 50, {"a": [1]}]
    typed = {"max_tokens": int, "temperature": float, "top_p": float, "top_k": int, "seed": int, "stop": list,
             "n": int, "stream": bool, "prompt": str}
    out = []
    for i in range(n):
        kind = i % 10
        body = dict(valid)
        path = "/v1/completions"
        if kind == 0:  # broken JSON: a valid body cut short, or random bytes
            raw = json.dumps(body).encode()
            out.append((path, raw[: rng.randrange(1, len(raw) - 1)] if rng.random() < 0.7
                        else bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))))
            continue
        if kind == 1:  # a field of the wrong type
            field = rng.choice(sorted(typed))
            body[field] = rng.choice([j for j in junk if not (_fits(j, typed[field])
                                                               or (j is None and field in NULLABLE))])
        elif kind == 2:  # unknown field
            body["".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randrange(3, 12))) + "_x"] = 1
        elif kind == 3:  # out of range
            field, value = rng.choice([("max_tokens", 0), ("max_tokens", -5), ("temperature", -0.5),
                                       ("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("seed", -1), ("n", 2),
                                       ("n", 0)])
            body[field] = value
        elif kind == 4:  # unsupported options
            body.update(rng.choice([{"logprobs": 3}, {"echo": True}, {"suffix": "x"}, {"best_of": 3},
                                    {"presence_penalty": 0.5}, {"frequency_penalty": -1}]))
        elif kind == 5:  # over the context
            body["max_tokens"] = 10_000 + rng.randrange(10_000)
        elif kind == 6:  # not a JSON object, or a missing prompt
            out.append((path, rng.choice([b"[]", b"42", b'"prompt"', b"null", json.dumps(
                {k: v for k, v in valid.items() if k != "prompt"}).encode()])))
            continue
        elif kind == 7:  # bad chat messages
            path = "/v1/chat/completions"
            body = {"model": model, "messages": rng.choice([[], [{"role": "robot", "content": "x"}],
                                                              [{"role": "user"}], "hi",
                                                              [{"role": "user", "content": 5}]])}
        elif kind == 8:  # deeply nested or oversized
            out.append((path, rng.choice([b"[" * 100_000 + b"]" * 100_000,
                                          json.dumps({**valid, "prompt": "x" * 1_100_000}).encode()])))
            continue
        else:  # empty prompt, bad token ids, bad stop strings, non-finite numbers, wrong model
            body.update(rng.choice([{"prompt": ""}, {"prompt": [1, 10**9]}, {"prompt": []}, {"stop": ""},
                                    {"stop": ["a"] * 40}, {"model": "no-such-model"}]))
            if rng.random() < 0.3:
                out.append((path, json.dumps(valid).replace('"temperature": 0', '"temperature": NaN').encode()))
                continue
        out.append((path, json.dumps(body).encode()))
    return out


NULLABLE = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop"}  # null means "the default" for these


def _fits(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, (list, str)) and all(isinstance(v, str) for v in value)  # stop: str or [str]
    return isinstance(value, kind)


async def fuzz_phase(args, model, prompts, offline, http) -> dict:
    bodies = fuzz_bodies(args.fuzz, args.seed, model)
    codes, error_objects = [], 0
    for path, body in bodies:
        r = await http.post(path, content=body, headers={"content-type": "application/json"})
        codes.append(r.status_code)
        try:
            error_objects += isinstance(r.json().get("error", {}).get("message"), str)
        except ValueError:
            pass
    still = await greedy_still_correct(http, model, prompts[2], offline[2], args.max_tokens)
    health = (await http.get("/health")).status_code == 200
    out = {"sent": len(bodies), "status_counts": {str(c): codes.count(c) for c in sorted(set(codes))},
           "all_4xx": all(400 <= c < 500 for c in codes), "openai_error_objects": error_objects,
           "server_correct_after": still, "healthy_after": health}
    out["ok"] = out["all_4xx"] and error_objects == len(bodies) and still and health
    print("fuzz:", out, flush=True)
    return out


if __name__ == "__main__":
    main()
