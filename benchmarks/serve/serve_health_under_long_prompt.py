"""How long /health waits while the server tokenizes a 1 MB prompt (issue 27: tokenizing runs off the event loop).

Starts `multispec serve` (the embedded default pair) from the source tree given by --src, sends one /v1/completions
request whose prompt is 950,000 characters (about 1 MB of JSON) (it is refused after tokenizing: longer than the context), and
polls /health every 20 ms meanwhile; reports the slowest /health answer and the request's own time. Run it on two
source trees to compare.

    python benchmarks/serve/serve_health_under_long_prompt.py --src src --label branch
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(ROOT / "src"))
    ap.add_argument("--label", default="branch")
    ap.add_argument("--chars", type=int, default=950_000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve" / "health_under_long_prompt.json"))
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "multispec", "serve", "--threads", "1", "--port", str(port)],
                              env={**os.environ, "PYTHONPATH": args.src}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        words = "def f(x):\n    return x + 1\n"
        prompt = (words * (args.chars // len(words) + 1))[:args.chars]
        body = json.dumps({"prompt": prompt, "max_tokens": 1}).encode()
        waits, done = [], threading.Event()

        def poll() -> None:
            while not done.is_set():
                t0 = time.perf_counter()
                urllib.request.urlopen(base + "/health", timeout=60).read()
                waits.append(time.perf_counter() - t0)
                time.sleep(0.02)

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.2)
        t0 = time.perf_counter()
        req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        try:
            status = urllib.request.urlopen(req, timeout=600).status
        except urllib.error.HTTPError as e:
            status = e.code
        request_s = time.perf_counter() - t0
        time.sleep(0.2)
        done.set()
        poller.join()
    finally:
        server.terminate()
        server.wait(30)
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.is_file() else {}
    report[args.label] = {"src": args.src, "prompt_chars": args.chars, "request_status": status,
                          "request_s": round(request_s, 3), "health_polls": len(waits),
                          "health_max_s": round(max(waits), 3), "health_median_s": round(sorted(waits)[len(waits) // 2], 4)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report[args.label], indent=1))


if __name__ == "__main__":
    main()
