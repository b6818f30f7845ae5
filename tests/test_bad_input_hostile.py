"""Issue 28, a hostile user again: state files that are malformed, SIGTERM, text that is not UTF-8, settings that
must mean what they say. Each case: a one-line refusal (CLI: exit 2; server: a 400 error object), a warning and
recovery (state files), or the documented behaviour; never a traceback, a 500 or a silently wrong setting."""
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import multispec
import multispec.paths
from helpers import assert_one_line_error, run_cli
from multispec import MultispecError
from multispec.decoding.methods import build_method
from multispec.errors import parse_bool

SRC = str(Path(__file__).resolve().parents[1] / "src")


# ----------------------------------------------------------------------------------- 4. settings mean what they say
@pytest.mark.parametrize("value,expected", [(True, True), (False, False), (1, True), (0, False), ("true", True),
                                            ("FALSE", False), (" True ", True), ("1", True), ("0", False)])
def test_parse_bool_accepts(value, expected):
    assert parse_bool(value, "x") is expected


@pytest.mark.parametrize("value", ["yes", "no", "", "2", 2, -1, 0.5, 1.0, None, [], "on", "off", "t"])
def test_parse_bool_refuses(value):
    with pytest.raises(MultispecError, match="x must be a boolean"):
        parse_bool(value, "x")


def test_false_strings_are_false_in_build_method():
    assert build_method("dynamic", target_init="false").target_init is False
    assert build_method("dynamic", target_init="false").lossless  # the draft-initialized tree, not the lossy one
    assert build_method("dynamic", target_init="true").target_init is True
    assert build_method("sd", heuristic="0").heuristic is False
    with pytest.raises(MultispecError, match="target_init must be a boolean"):
        build_method("dynamic", target_init="nope")
    with pytest.raises(MultispecError, match="heuristic must be a boolean"):
        build_method("sd", heuristic="yes")


@pytest.mark.parametrize("spec,field,value", [
    ("dynamic:target_init=false", "target_init", False), ("dynamic:target_init=False", "target_init", False),
    ("dynamic:target_init=0", "target_init", False), ("dynamic:target_init=true", "target_init", True),
    ("sd:heuristic=false", "heuristic", False), ("sd:heuristic=1", "heuristic", True),
    ("auto:proposers=draft+lookup", "proposers", ("draft", "lookup")), ("auto:proposers=lookup", "proposers",
                                                                        ("lookup",)),
    ("mcsd:tree=4-2", "tree", (4, 2)), ("auto:max_nodes=64", "max_nodes", 64),
])
def test_bench_specs_parse_booleans_and_lists(spec, field, value):
    from multispec.bench.specs import parse_method_spec

    assert getattr(parse_method_spec(spec).config, field) == value


@pytest.mark.parametrize("spec,needle", [
    ("dynamic:target_init=yes", "target_init must be a boolean"), ("sd:heuristic=2", "heuristic must be a boolean"),
    ("auto:max_nodes=100000", "max_nodes must be at most"), ("auto:proposers=draft+x", "proposers must be among"),
    ("auto:max_nodes=0", "max_nodes"),
])
def test_bench_specs_refuse(spec, needle):
    from multispec.bench.specs import parse_method_spec

    with pytest.raises(MultispecError, match=needle):
        parse_method_spec(spec)


@pytest.mark.parametrize("args,needle", [
    (["--max-nodes", "100000"], "--max-nodes"), (["--max-nodes", "0"], "--max-nodes"),
    (["--prompt-file", "{f}", "--prompt-file", "{f}", "--stream"], "--baseline and --stream take one prompt"),
    (["--method", "auto", "--proposers", "draft", "--target", "{t}"], "--proposers draft needs a draft model"),
    (["--method", "dynamic", "--target-init", "--width", "x"], "--width"),
])
def test_generate_refuses_bad_settings(capsys, tmp_path, dirs, args, needle):
    f = tmp_path / "p.txt"
    f.write_text("x = 1")
    args = [a.format(f=f, t=dirs["target"]) for a in args]
    prompt = [] if "--prompt-file" in args else ["x = 1"]
    code, _, err = run_cli(capsys, "generate", *prompt, *args, "--max-new-tokens", "2")
    assert_one_line_error(code, err, needle)


# ----------------------------------------------------------------------------------- 3. text that is not UTF-8
@pytest.mark.parametrize("data,needle", [(b"\xff\xfe\x00\x01binary", "not valid UTF-8"),
                                         (b"def f():\n    return '\xe9'\n", "not valid UTF-8"),
                                         (b"\x89PNG\r\n\x1a\n\x00\x00", "not valid UTF-8"),
                                         (b"abc\x00def", "NUL")])
def test_binary_prompt_file_is_one_line(capsys, tmp_path, data, needle):
    f = tmp_path / "bin.dat"
    f.write_bytes(data)
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(f), "--max-new-tokens", "2")
    assert_one_line_error(code, err, needle)
    assert str(f) in err


def test_bad_stdin_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x = \xff\n")))
    code, _, err = run_cli(capsys, "generate", "-", "--max-new-tokens", "2")
    assert_one_line_error(code, err, "stdin is not valid UTF-8")


def test_surrogate_prompt_argument_is_one_line(capsys):
    code, _, err = run_cli(capsys, "generate", "x = \udcff", "--max-new-tokens", "2")
    assert_one_line_error(code, err, "not valid UTF-8")


def test_bom_is_stripped_from_prompt_files(tmp_path, monkeypatch):
    from multispec.cli.generate_cmd import _read_prompt

    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbfdef f(x):")
    assert _read_prompt(None, (str(f),)) == "def f(x):"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfx = 1")))
    assert _read_prompt("-", ()) == "x = 1"


# ----------------------------------------------------------------------------------- 1. state files never crash a run
@pytest.mark.parametrize("content", [b"[]", b'"costs"', b"0", b"null", b"{", b"\xff\xfe", b'{"k": 1}',
                                     b"[1, 2, 3]", b'{"multispec_profile": 1, "costs": []}'])
def test_malformed_profile_file_is_ignored_with_one_warning(pair, tmp_path, monkeypatch, content):
    from multispec.profile import MachineProfile

    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(multispec.paths, "_WARNED", set())
    cache = tmp_path / "profile-v1.json"
    cache.write_bytes(content)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = multispec.generate(pair, "x = 1", method="auto", max_new_tokens=3, temperature=0.0)
    assert out.stats["new_tokens"] >= 1
    named = [w for w in seen if str(cache) in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in seen]
    assert MachineProfile.load(cache).sections["costs"]  # measured and written back as a profile


@pytest.mark.parametrize("entry", [[], "x", 0, {"target": []}, {"target": [0.0] * 7, "draft": [0.0] * 7},
                                   {"target": [1e-3] * 3, "draft": [1e-3] * 7},
                                   {"target": [1e-3] * 7, "draft": [1e-3, "a"] + [1e-3] * 5},
                                   {"target": [float("nan")] * 7, "draft": [1e-3] * 7},
                                   {"target": [1e-3] * 7, "draft": [1e-3] * 7, "overhead": []},
                                   {"target": [1e-3] * 7, "draft": [1e-3] * 7, "overhead": {"round_s": "x"}},
                                   {"target": [-1.0] * 7, "draft": [1e-3] * 7}])
def test_implausible_costs_entry_in_the_profile_is_ignored_and_measured_again(pair, tmp_path, monkeypatch, entry):
    from multispec.drafting import costs
    from multispec.profile import MachineProfile

    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(multispec.paths, "_WARNED", set())
    multispec.generate(pair, "x = 1", method="auto", max_new_tokens=2, temperature=0.0)  # writes a valid profile
    cache = tmp_path / "profile-v1.json"
    data = json.loads(cache.read_text())
    data["costs"] = {k: entry for k in data["costs"]}
    cache.write_text(json.dumps(data))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = multispec.generate(pair, "x = 1", method="auto", max_new_tokens=3, temperature=0.0)
    assert out.stats["new_tokens"] >= 1
    assert sum(str(cache) in str(w.message) for w in seen) == 1
    (key,) = data["costs"]
    assert costs.valid_entry(MachineProfile.load(cache).sections["costs"][key], True)


@pytest.mark.parametrize("config,needle", [(b"[]", "not a JSON object"), (b"\xff", "not UTF-8 JSON"),
                                           (b'{"format": "multispec-decision"', "not UTF-8 JSON")])
def test_malformed_decision_model_is_one_line(tmp_path, config, needle):
    from multispec.heads.decision import load_decision_model

    (tmp_path / "config.json").write_bytes(config)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(MultispecError, match=needle):
        load_decision_model(tmp_path)


# ----------------------------------------------------------------------------------- 2. SIGTERM keeps the work
def _spawn(*args):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "multispec", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def test_sigterm_during_generate_prints_the_partial_text_and_exits_143():
    proc = _spawn("generate", "def f(x):", "--method", "ar", "--max-new-tokens", "100000", "--temperature", "1",
                  "--seed", "0", "--stream", "--threads", "1")
    seen = b""
    deadline = time.time() + 120
    while len(seen) < 30 and time.time() < deadline:
        seen += os.read(proc.stdout.fileno(), 64)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()
    assert b"Traceback" not in err and b"terminated" in err
    assert (seen + out).startswith(b"def f(x):") and len(seen + out) > 30


@pytest.mark.slow
def test_sigterm_during_bench_writes_the_partial_results(tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"def f{i}(x):"}) + "\n" for i in range(2000)))
    out = tmp_path / "out"
    proc = _spawn("bench", "--dataset", str(data), "--methods", "ar", "--max-new-tokens", "64", "--warmup", "0",
                  "--out", str(out), "--threads", "1")
    err = b""
    deadline = time.time() + 120
    while not re.search(rb"\| *([3-9]|\d\d+)/2000", err) and time.time() < deadline:  # progress bar: >= 3 done
        chunk = os.read(proc.stderr.fileno(), 256)
        if not chunk:
            break
        err += chunk
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=60)
    err += rest
    assert proc.returncode == 143, err.decode()[-2000:]
    assert b"Traceback" not in err
    results = json.loads((out / "results.json").read_text())
    assert "partial" in results and len(results["records"]) >= 3


# ----------------------------------------------------------------------------------- server: text, start-up, signals
@pytest.fixture(scope="module")
def client(pair):
    from fastapi.testclient import TestClient

    from multispec.serve import ServeSettings, create_app

    with TestClient(create_app(pair, ServeSettings(model_name="tiny"))) as c:
        yield c


@pytest.mark.parametrize("body,needle", [
    (b'{"prompt": "x\xff", "max_tokens": 2}', "not valid UTF-8"),
    (b'\xff\xfe{"prompt": "x"}', "not valid UTF-8"),
    (b'{"prompt": "x \\ud800", "max_tokens": 2}', "lone surrogate"),
    (b'{"prompt": "x", "model": "\\udcff", "max_tokens": 2}', "lone surrogate"),
    (b'{"prompt": ["\\ud83d"], "max_tokens": 2}', "lone surrogate"),
    (b'{"prompt": "x", "stop": ["\\udfff"], "max_tokens": 2}', "lone surrogate"),
])
def test_server_text_that_is_not_utf8_is_a_400(client, body, needle):
    r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_server_chat_with_a_lone_surrogate_is_a_400(client):
    body = b'{"messages": [{"role": "user", "content": "hi \\ud800"}]}'
    r = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"]


def test_serve_refuses_a_port_in_use_before_loading(capsys, tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_cli(capsys, "serve", "--port", str(port), "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, f"port {port} on 127.0.0.1 is already in use")


@pytest.mark.parametrize("template,needle", [("{% for m in messages %}{{ m['content'] }}", "does not parse"),
                                             ("{{ messages[0]['content'] | nosuchfilter }}", "does not parse"),
                                             ("{% if %}x{% endif %}", "does not parse")])
def test_serve_refuses_a_chat_template_that_does_not_parse_before_loading(capsys, tmp_path, template, needle):
    f = tmp_path / "t.jinja"
    f.write_text(template)
    code, _, err = run_cli(capsys, "serve", "--chat-template", str(f), "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize("template", ["{{ raise_exception('no system messages') }}",
                                      "{{ messages[5]['content'] }}", "{{ 1 / 0 }}", "{% if false %}x{% endif %}"])
def test_serve_refuses_a_chat_template_that_does_not_render(dirs, template):
    from multispec.cli.serve_cmd import check_template_renders

    tok = multispec.load_pair(target=str(dirs["target"]), draft=str(dirs["draft"])).tokenizer
    with pytest.raises(MultispecError, match="chat template t.jinja .*(cannot render|as empty text)"):
        check_template_renders(tok, template, "t.jinja")


def test_serve_refuses_a_binary_chat_template(capsys, tmp_path):
    f = tmp_path / "t.jinja"
    f.write_bytes(b"\x89PNG\xff\xfe")
    code, _, err = run_cli(capsys, "serve", "--chat-template", str(f), "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "not valid UTF-8")


SERVER_SCRIPT = r'''
import sys, threading, time
import uvicorn
from multispec import load_pair
from multispec.api import GenerationResult
from multispec.cli import install_sigterm_handler
from multispec.cli.serve_cmd import _Server
from multispec.serve import ServeSettings, create_app

ended = []

def gated(pair, prompt, stream=None, **kw):  # streams "x" forever unless cancelled through its callback
    try:
        while True:
            time.sleep(0.01)
            stream("x")
    except Exception as e:
        ended.append(time.time())
        print("generation ended by", type(e).__name__, file=sys.stderr, flush=True)
        raise

pair = load_pair(target=sys.argv[1], draft=sys.argv[2])
app = create_app(pair, ServeSettings(model_name="tiny"), generate_fn=gated)
config = uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
print("ready", file=sys.stderr, flush=True)
install_sigterm_handler()  # as `multispec serve` runs under multispec.cli.main
try:
    _Server(config, app, float(sys.argv[4])).run()
except KeyboardInterrupt:  # uvicorn raises the captured signal again once it has stopped
    print("interrupted", file=sys.stderr, flush=True)
'''


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("signals,drain", [((signal.SIGINT, signal.SIGINT), 60.0), ((signal.SIGTERM,), 1.0)],
                         ids=["second-ctrl-c", "sigterm-drain-bound"])
def test_server_stop_answers_in_flight_requests_with_an_error_object(dirs, signals, drain):
    import threading

    import httpx

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(dirs["target"]), str(dirs["draft"]),
                             str(port), str(drain)], stderr=subprocess.PIPE, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        replies = []
        t = threading.Thread(target=lambda: replies.append(httpx.post(url + "/v1/completions", json={
            "prompt": "x", "max_tokens": 100}, timeout=60)))
        t.start()
        time.sleep(1.0)  # the request is in flight
        t0 = time.time()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.2)
        t.join(30)
        _, err = proc.communicate(timeout=30)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert replies and replies[0].status_code == 503, (replies, err.decode()[-2000:])
    assert replies[0].json()["error"]["code"] == "shutting_down"
    assert b"generation ended by Cancelled" in err and b"Traceback" not in err, err.decode()[-2000:]
    assert took < drain + 10, took


# ----------------------------------------------------------------------------------- 5. compiled code cached where said
COMPILE_SCRIPT = r'''
import os, sys, torch
from torch._inductor.runtime.cache_dir_utils import cache_dir
torch_default = cache_dir()  # torch fills TORCHINDUCTOR_CACHE_DIR in with its own default first
import multispec
import multispec.paths
from multispec.models import make_backend
pair = multispec.load_pair(target=sys.argv[1], draft=sys.argv[2])
backend = make_backend(pair.target, "compiled", max_len=64)
backend.forward(torch.zeros(3, dtype=torch.long), torch.arange(3))
print("TORCH_DEFAULT", torch_default)
print("ENV", os.environ["TORCHINDUCTOR_CACHE_DIR"])
'''


@pytest.mark.slow
def test_compiled_code_goes_to_multispec_cache_dir_even_after_torch_set_its_default(dirs, tmp_path):
    from multispec.models.fast_compile import has_cpp_compiler

    if not has_cpp_compiler():
        pytest.skip("torch inductor needs a C++ compiler on the CPU")
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "MULTISPEC_CACHE_DIR": str(tmp_path)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, str(dirs["target"]), str(dirs["draft"])],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"ENV {tmp_path / 'inductor'}" in out.stdout
    assert any((tmp_path / "inductor").rglob("*")), "nothing was cached under $MULTISPEC_CACHE_DIR/inductor"
    progress = [ln for ln in out.stderr.splitlines() if ln.startswith("multispec: compiling")]
    assert progress and "target (" in progress[0] and f"1 of {7}" in progress[0] and "6 to go" in progress[0]


@pytest.mark.slow
def test_serve_compiled_backend_answers_concurrent_requests_like_the_library(dirs):
    """`multispec serve --compile`: the server's compiled pair answers concurrent requests, each equal to
    multispec.generate on the same pair (greedy), with no recompilation mid-request."""
    import threading

    from fastapi.testclient import TestClient

    from multispec.models.fast_compile import has_cpp_compiler
    from multispec.serve import ServeSettings, create_app

    if not has_cpp_compiler():
        pytest.skip("torch inductor needs a C++ compiler on the CPU")
    compiled = multispec.load_pair(target=str(dirs["target"]), draft=str(dirs["draft"]), compile=True)
    prompts = ["def f(x):", "for n in range(2):", "x = 1", "print("]
    want = {p: multispec.generate(compiled, p, method="sd", max_new_tokens=8, temperature=0.0).text for p in prompts}
    settings = ServeSettings(model_name="tiny", method="sd", backend="compiled", max_concurrent=2)
    got, errors = {}, []
    with TestClient(create_app(compiled, settings)) as client:
        def ask(p):
            try:
                r = client.post("/v1/completions", json={"prompt": p, "max_tokens": 8, "temperature": 0})
                got[p] = (r.status_code, r.json())
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert not errors
    for p in prompts:
        status, body = got[p]
        assert status == 200 and body["choices"][0]["text"] == want[p], body


def test_a_cache_saved_by_many_threads_at_once_is_always_whole(tmp_path):
    """The server's workers save the cost and acceptance caches from their own threads: a reader never sees a
    half-written file (each thread writes its own temporary file, renamed whole over the cache)."""
    import threading

    from multispec.paths import save_cache_json

    path, bad, stop = tmp_path / "c.json", [], threading.Event()
    data = [{f"k{i}": list(range(20_000 + t)) for i in range(3)} for t in range(8)]

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads(path.read_bytes())
            except FileNotFoundError:
                pass
            except ValueError:
                bad.append(1)

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=lambda t=t: [save_cache_json(path, data[t]) for _ in range(30)])
               for t in range(8)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    reader.join()
    assert not bad and json.loads(path.read_bytes()) in data
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]  # no temporary file left
