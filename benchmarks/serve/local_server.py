"""What the benchmarks that start `multispec serve` (or a proxy) on this machine share: a free port, and waiting
until /health answers. The serving scripts run as `python benchmarks/serve/NAME.py`, so this module is importable
beside them."""
from __future__ import annotations

import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, seconds: float = 300) -> None:
    """Return once http://127.0.0.1:port/health answers; SystemExit if `proc` exits first or `seconds` pass."""
    end = time.time() + seconds
    while time.time() < end:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"a process exited with {proc.returncode} before answering /health")
            time.sleep(0.3)
    raise SystemExit(f"nothing answered /health on port {port} within {seconds} s")
