"""Two `multispec serve` replicas behind nginx on loopback; one replica is killed mid-run and no request is lost.

nginx comes from the distribution's packages (`apt-get install nginx`, run by this script when `nginx` is missing
and apt-get can; otherwise the script says why and exits 0). The configuration is docs/serve.md's: least
connections, `proxy_next_upstream` on connection errors, timeouts, 429 and 5xx (non-idempotent POSTs included: a
completion that has not sent its response header yet has done nothing a client can see, so it is safe to replay),
unbuffered for streaming. C clients send R non-streamed greedy completions each through nginx; after a third of
them have been answered, replica 1 gets SIGKILL. Every request must come back complete (200, a finish_reason) and
equal the text of the same request answered before the kill. Writes one JSON file.

    PYTHONPATH=src python benchmarks/serve/nginx_scale_out.py          # the embedded default pair, 4 x 25 requests
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from local_server import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
    uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
    upstream multispec {{ least_conn; {servers} }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://multispec; proxy_http_version 1.1; proxy_set_header Connection "";
            proxy_buffering off; proxy_read_timeout 600s;
            proxy_next_upstream error timeout http_429 http_502 http_503 http_504 non_idempotent;
            proxy_next_upstream_tries 3;
        }}
    }}
}}
"""


def ensure_nginx() -> str | None:
    """The nginx binary, installed from the distribution's packages if missing; None (and why) when impossible."""
    found = shutil.which("nginx") or (Path("/usr/sbin/nginx").is_file() and "/usr/sbin/nginx")
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        print("skipped: nginx is not installed and apt-get cannot install it here (not root or no apt-get)")
        return None
    subprocess.run(["apt-get", "install", "-y", "-q", "nginx"], check=False, capture_output=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    found = shutil.which("nginx") or (Path("/usr/sbin/nginx").is_file() and "/usr/sbin/nginx")
    if not found:
        print("skipped: `apt-get install nginx` did not give an nginx binary")
    return found or None


def complete(port: int, prompt: str, max_tokens: int) -> tuple[int, str | None]:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.loads(r.read())
            choice = out["choices"][0]
            return r.status, choice["text"] if choice.get("finish_reason") else None
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError):
        return 0, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="default: the embedded default pair")
    ap.add_argument("--draft")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests-per-client", type=int, default=25)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve" / "nginx_scale_out.json"))
    args = ap.parse_args()
    nginx = ensure_nginx()
    if nginx is None:
        return
    prompts = ["def fibonacci(n):", "import os\n\ndef walk(root):", "class Queue:", "def is_prime(n):",
               "for line in open(path):", "def mean(xs):"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    model = (["--target", args.target] + (["--draft", args.draft] if args.draft else [])) if args.target else []
    ports = [free_port(), free_port()]
    replicas = [subprocess.Popen([sys.executable, "-m", "multispec", "serve", *model, "--threads", "1", "--port",
                                  str(p), "--max-concurrent", "2", "--max-queue", "32"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    tmp = tempfile.mkdtemp()
    front = free_port()
    servers = " ".join(f"server 127.0.0.1:{p} max_fails=1 fail_timeout=30s;" for p in ports)
    Path(tmp, "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, servers=servers, port=front))
    proxy = None
    try:
        for p, proc in zip(ports, replicas):
            wait_healthy(p, proc)
        proxy = subprocess.Popen([nginx, "-p", tmp, "-c", f"{tmp}/nginx.conf", "-g", "daemon off;"])
        wait_healthy(front, proxy, 30)
        expected = {p: complete(ports[0], p, args.max_tokens)[1] for p in prompts}  # the reference texts
        results: list[tuple[int, str | None, str]] = []
        lock = threading.Lock()
        total = args.clients * args.requests_per_client
        killed_at = {}

        def client(c: int) -> None:
            for r in range(args.requests_per_client):
                prompt = prompts[(c + r) % len(prompts)]
                status, text = complete(front, prompt, args.max_tokens)
                with lock:
                    results.append((status, text, prompt))
                    if len(results) >= total // 3 and not killed_at:
                        replicas[0].send_signal(signal.SIGKILL)  # mid-run: other requests are in flight on it
                        killed_at.update(answered=len(results), time=time.time())

        start = time.time()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - start
        complete_ok = sum(1 for s, t, _ in results if s == 200 and t is not None)
        equal = sum(1 for s, t, p in results if s == 200 and t == expected[p])
        log = Path(tmp, "error.log").read_text() if Path(tmp, "error.log").is_file() else ""
        # nginx logs each request it had to move off the dead replica (connection refused / reset / closed)
        moved = sum(1 for line in log.splitlines() if "upstream" in line and "127.0.0.1:%d" % ports[0] in line)
        report = {"nginx": subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip(),
                  "replicas": 2, "killed": "replica 1 (SIGKILL)", "killed_after_answered": killed_at.get("answered"),
                  "upstream_errors_logged_for_the_killed_replica": moved,
                  "sent": total, "received_complete": complete_ok, "equal_to_reference_text": equal,
                  "statuses": sorted({s for s, _, _ in results}), "wall_s": round(wall, 2),
                  "pass": complete_ok == total == equal}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report, indent=1))
        if not report["pass"]:
            raise SystemExit(1)
    finally:
        for proc in replicas + ([proxy] if proxy else []):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
