"""`multispec serve --ray` and multispec.serve.ray: replicas of the server on a local Ray cluster kept on the loopback
address. The bad-input checks run without Ray; the cluster tests (slow) skip without it (pip install
'multispec[ray]'). The cluster test: 2 replicas of the embedded default pair, one thread each, every response equal to
the library's; then one replica's process killed by its pid mid-load, every request answered exactly once (the
client retries what the dead replica was answering), the replica replaced; then the cluster and every process it
started stopped."""
from __future__ import annotations

import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from helpers import assert_one_line_error, run_cli

try:
    import ray  # noqa: F401
    from ray import serve  # noqa: F401

    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray Serve is not installed (pip install 'multispec[ray]')")

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["def f(x):", "import os\n", "class A:", "for i in range(3):", "x = [", "return ", "# sum two numbers\n",
           "while True:"]
MAX_TOKENS = 24
FAULT_TOKENS = 96  # long enough that the killed replica is in the middle of generations


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- bad input, before any model loads

def test_replicas_below_one_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "serve", "--ray", "--replicas", "0", "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "--replicas")


def test_ray_options_need_ray(capsys, tmp_path):
    code, _, err = run_cli(capsys, "serve", "--replicas", "2", "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "--replicas needs --ray")
    assert "missing" not in err


def test_ray_without_the_extra_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the extra
    code, _, err = run_cli(capsys, "serve", "--ray", "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "pip install 'multispec[ray]'")
    assert "missing" not in err


@needs_ray
def test_unreachable_cluster_is_one_line(capsys, tmp_path):
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    t0 = time.perf_counter()
    code, _, err = run_cli(capsys, "serve", "--ray", "--ray-address", address, "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, f"--ray-address {address}: no Ray cluster answers")
    assert "missing" not in err and time.perf_counter() - t0 < 10
    code, _, err = run_cli(capsys, "serve", "--ray", "--ray-address", "nowhere", "--target", str(tmp_path / "m"))
    assert_one_line_error(code, err, "HOST:PORT")


@needs_ray
def test_autoscaling_bounds_and_options():
    from multispec.errors import MultispecError
    from multispec.serve import ray as ray_serve

    assert ray_serve.autoscaling_bounds(2, None, None) is None
    assert ray_serve.autoscaling_bounds(2, 1, 4) == (1, 4)
    assert ray_serve.autoscaling_bounds(3, None, None) is None
    assert ray_serve.autoscaling_bounds(3, 2, None) == (2, 3)
    with pytest.raises(MultispecError):
        ray_serve.autoscaling_bounds(1, 3, 2)
    app = ray_serve.deployment(replicas=2, min_replicas=1, max_replicas=4, threads=2,
                               settings={"max_concurrent": 3, "max_queue": 5})
    d = app._bound_deployment
    assert d.max_ongoing_requests == 8 and d.ray_actor_options["num_cpus"] == 2
    scaling = d._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas, scaling.initial_replicas) == (1, 4, 2)
    assert scaling.target_ongoing_requests == 3
    with pytest.raises(MultispecError, match="at least 1"):
        ray_serve.deployment(replicas=0)


# ---------------------------------------------------------------- a local cluster

def _children(pid: int) -> set[int]:
    """Every live descendant of pid (from /proc)."""
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


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def replica_pids() -> set[int]:
    """The pids of the multispec replicas' processes (Ray names them `ray::ServeReplica:APP:DEPLOYMENT`)."""
    pids = set()
    for pid in _children(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ServeReplica:multispec:multispec" in f.read() and _alive(pid):
                    pids.add(pid)
        except OSError:
            pass
    return pids


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def ask(url: str, prompt: str, retries: int = 6, max_tokens: int = MAX_TOKENS) -> tuple[dict, int]:
    """One completion, retried (with a short pause) while the answer is a server error or the connection fails:
    (the answer, the retries it took)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    for attempt in range(retries + 1):
        try:
            r = httpx.post(url + "/v1/completions", json=body, timeout=120)
            if r.status_code == 200:
                return r.json(), attempt
        except httpx.HTTPError:
            pass
        time.sleep(0.5 * (attempt + 1))
    raise AssertionError(f"no answer for {prompt!r} after {retries} retries")


@pytest.fixture(scope="module")
def cluster():
    if not HAVE_RAY:
        pytest.skip("Ray Serve is not installed (pip install 'multispec[ray]')")
    import ray
    from ray import serve

    from multispec.serve import ray as ray_serve

    ray_serve.init(num_cpus=2, object_store_memory=100 * 2**20)
    port, started = _free_port(), set()
    try:
        ray_serve.run(ray_serve.deployment(replicas=2, threads=1, settings={"model_name": "default", "max_concurrent": 2,
                                                                           "max_queue": 8}), port=port)
        started = _children(os.getpid())
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(p) for p in started):
        time.sleep(0.5)
    assert not [p for p in started if _alive(p)], "processes the cluster started are still running"


@pytest.fixture(scope="module")
def offline():
    """prompt -> {max_tokens: the library's greedy token ids}."""
    from multispec import generate, load_pair

    pair = load_pair()
    return {p: {n: generate(pair, p, max_new_tokens=n, temperature=0.0).token_ids for n in (MAX_TOKENS, FAULT_TOKENS)}
            for p in PROMPTS}


@pytest.mark.slow
def test_two_replicas_answer_as_the_library_and_survive_a_killed_replica(cluster, offline):
    assert len(replica_pids()) == 2
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: ask(cluster, p, retries=0), PROMPTS))
    for prompt, (answer, _) in zip(PROMPTS, answers):
        assert answer["choices"][0]["token_ids"] == offline[prompt][MAX_TOKENS], prompt
        assert answer["metrics"]["speculative_decoding"]["num_spec_steps"] >= 0

    # one replica's process killed by its pid while 16 requests are in flight or queued: once it is generating
    victim = min(replica_pids())
    prompts = PROMPTS * 2

    def timed(prompt):
        t0 = time.perf_counter()
        answer, retries = ask(cluster, prompt, max_tokens=FAULT_TOKENS)
        latencies.append(time.perf_counter() - t0)
        return answer, retries

    latencies: list[float] = []
    with ThreadPoolExecutor(16) as pool:
        ticks = _cpu_ticks(victim)
        futures = [pool.submit(timed, p) for p in prompts]
        deadline = time.time() + 20
        while _cpu_ticks(victim) < ticks + 30 and time.time() < deadline:  # 0.3 s of its CPU: it is generating
            time.sleep(0.02)
        os.kill(victim, signal.SIGKILL)
        answers = [f.result() for f in futures]
    retried = sum(n for _, n in answers)
    assert retried > 0  # the kill caught requests in flight, whose clients retried them
    ids = [a["id"] for a, _ in answers]
    assert len(set(ids)) == len(prompts)  # each request answered once, by one response of its own
    for prompt, (answer, retries) in zip(prompts, answers):
        got, want = answer["choices"][0]["token_ids"], offline[prompt][FAULT_TOKENS]
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, (prompt, len(got), len(want), first, retries, answer["spec_decode"])
    p99 = sorted(latencies)[max(0, round(0.99 * len(latencies)) - 1)]
    print(f"killed replica {victim}; {retried} retries; p99 latency during the fault {p99:.2f} s")
    deadline = time.time() + 120  # the controller replaces it
    while time.time() < deadline and not (len(replica_pids()) == 2 and victim not in replica_pids()):
        time.sleep(1)
    now = replica_pids()
    assert len(now) == 2 and victim not in now, now
    answer, _ = ask(cluster, PROMPTS[0])
    assert answer["choices"][0]["token_ids"] == offline[PROMPTS[0]][MAX_TOKENS]


@pytest.mark.slow
@needs_ray
def test_serve_cli_with_ray_serves_and_stops_on_sigterm(tmp_path):
    """`multispec serve --ray --replicas 1` as a user runs it: it answers through Serve's proxy, and SIGTERM stops
    the app, Serve and the cluster it started (exit 143, no process left)."""
    import subprocess

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH"))
                                                       if p)}
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "multispec", "serve", "--ray", "--replicas", "1", "--port",
                                 str(port), "--served-model-name", "dflt"], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and "serving 1 replica(s)" not in log.read_text() and proc.poll() is None:
            time.sleep(0.5)
        assert "serving 1 replica(s)" in log.read_text(), log.read_text()[-2000:]
        started = _children(proc.pid)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 4},
                       timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "dflt"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(p) for p in started):
            time.sleep(0.5)
        assert not [p for p in started if _alive(p)], "processes the cluster started are still running"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
