"""A fixed-length streaming load from guidellm (pinned 0.8.1) against `multispec serve`; the token counts guidellm
reports must equal the server's /metrics counters (issue 27).

guidellm sends what load generators send: streaming /v1/completions with `stream_options: {include_usage: true,
continuous_usage_stats: true}`, `ignore_eos: true` and `max_tokens` fixed, from synthetic prompts of a fixed token
count (tokenized with the served model's own tokenizer). C concurrent streams x N requests. The script starts the
server (the embedded default pair unless --target), runs `guidellm run`, reads its JSON report and the server's
Prometheus counters, and writes the comparison as JSON.

    PYTHONPATH=src python benchmarks/serve/guidellm_load.py --guidellm /path/to/env/bin/guidellm

guidellm may live in its own environment (`pip install guidellm==0.8.1`); without it the script says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from local_server import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
GUIDELLM_VERSION = "0.8.1"


def counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("multispec:") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = out.get(name, 0.0) + float(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guidellm", default=shutil.which("guidellm"), help="the guidellm executable")
    ap.add_argument("--target", help="default: the embedded default pair")
    ap.add_argument("--draft")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve" / "guidellm_load.json"))
    args = ap.parse_args()
    if not args.guidellm or not Path(args.guidellm).exists():
        print(f"skipped: guidellm is not installed (pip install guidellm=={GUIDELLM_VERSION}); nothing to measure")
        return
    version = subprocess.run([args.guidellm, "--version"], capture_output=True, text=True).stdout.strip()
    target_dir = args.target or str(ROOT / "src" / "multispec" / "default_pair" / "target")
    model = (["--target", args.target] + (["--draft", args.draft] if args.draft else [])) if args.target else []
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    server = subprocess.Popen([sys.executable, "-m", "multispec", "serve", *model, "--threads", "1", "--port",
                               str(port), "--served-model-name", "served", "--max-concurrent", str(args.streams),
                               "--max-queue", str(4 * args.streams)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, server)
        before = counters(port)
        with tempfile.TemporaryDirectory() as tmp:
            report_path = Path(tmp) / "guidellm.json"
            run = subprocess.run([
                args.guidellm, "run",
                "--backend", f"kind=openai_http,target=http://127.0.0.1:{port},model=served,"
                             "request_format=/v1/completions",
                "--profile", f"kind=concurrent,streams={args.streams}",
                "--constraint", f"kind=max_requests,count={args.requests}",
                "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                          f"output_tokens={args.output_tokens}",
                "--tokenizer", f"kind=huggingface_auto,model={target_dir}",
                "--output", f"kind=json,path={report_path}", "--disable-progress"],
                env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, cwd=tmp)
            if run.returncode != 0:
                raise SystemExit(f"guidellm failed ({run.returncode}): {run.stderr[-2000:]}")
            bench = json.loads(report_path.read_text())["benchmarks"][0]
        after = counters(port)
    finally:
        server.terminate()
        server.wait(30)
    done = bench["requests"]["successful"]
    reported = {"requests_successful": len(done), "requests_errored": len(bench["requests"]["errored"]),
                "prompt_tokens": sum(r["prompt_tokens"] for r in done),
                "output_tokens": sum(r["output_tokens"] for r in done)}
    moved = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    server_counts = {"requests_success": moved.get('multispec:request_success_total{finish_reason="length"}', 0)
                     + moved.get('multispec:request_success_total{finish_reason="stop"}', 0),
                     "prompt_tokens_total": moved.get("multispec:prompt_tokens_total", 0),
                     "generation_tokens_total": moved.get("multispec:generation_tokens_total", 0)}
    report = {"guidellm": version, "streams": args.streams, "requests": args.requests,
              "prompt_tokens_each": args.prompt_tokens, "output_tokens_each": args.output_tokens,
              "guidellm_reported": reported, "server_metrics_delta": server_counts,
              "pass": reported["requests_errored"] == 0 and reported["requests_successful"] == args.requests
              == server_counts["requests_success"] and reported["prompt_tokens"] == server_counts["prompt_tokens_total"]
              and reported["output_tokens"] == server_counts["generation_tokens_total"]
              == args.requests * args.output_tokens}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    if not report["pass"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
