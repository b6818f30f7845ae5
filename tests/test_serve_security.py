"""`multispec serve` against clients it must not serve (issue 41): without the API key (`--api-key`,
`MULTISPEC_API_KEY`), /v1/*, /tokenize, /detokenize (every path but two) answer 401 while /health and /metrics
stay open; a client that stops part-way through its request headers is disconnected."""
from __future__ import annotations

import socket
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from helpers import assert_one_line_error, run_cli, save_tiny_pair  # noqa: E402
from test_serve import ServerThread  # noqa: E402

from multispec import load_pair  # noqa: E402
from multispec.serve import ServeSettings, create_app  # noqa: E402

NAME = "tiny"
KEY = "sekrit-key-41"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = save_tiny_pair(tmp_path_factory.mktemp("security_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


@pytest.fixture(scope="module")
def server(pair):
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd", api_key=KEY, read_timeout=1.0)),
                     api_key=KEY)
    yield s
    s.close()


def test_the_openai_client_needs_the_api_key(server):
    assert server.client.completions.create(model=NAME, prompt="x", max_tokens=2).usage.completion_tokens >= 1
    assert [m.id for m in server.client.models.list()] == [NAME]
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="not-" + KEY, max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.completions.create(model=NAME, prompt="x", max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
    ("GET", "/v1/models", None), ("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [1]}),
    ("POST", "/v1/tokenize", {"prompt": "x"}), ("GET", "/openapi.json", None)])
def test_protected_endpoints_answer_401_with_an_openai_error(server, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic " + KEY},
                    {"Authorization": "Bearer"}):
        r = httpx.request(method, server.url + path, json=body, headers=headers)
        error = r.json()["error"]
        assert r.status_code == 401 and error["code"] == "invalid_api_key" and error["type"] and error["message"]
        assert KEY not in r.text and r.headers["www-authenticate"] == "Bearer"
    r = httpx.request(method, server.url + path, json=body, headers={"Authorization": f"bearer {KEY}"})
    assert r.status_code != 401  # the scheme is case-insensitive (RFC 7235); chat: 400, the model has no template


def test_health_and_metrics_stay_open(server):
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert httpx.get(server.url + "/metrics").status_code == 200


def test_serve_refuses_an_empty_api_key_before_loading(capsys, monkeypatch, tmp_path):
    code, _, err = run_cli(capsys, "serve", "--api-key", " ", "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "--api-key")
    monkeypatch.setenv("MULTISPEC_API_KEY", "  ")  # read from the environment (an empty one is unset, as in click)
    code, _, err = run_cli(capsys, "serve", "--target", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "MULTISPEC_API_KEY")


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent on `sock` before closing it (recv returned b"") within `seconds`; None if it did not."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        return None
    return received


def test_a_client_that_stops_mid_headers_is_disconnected(server):
    """read_timeout 1 s: a connection that sends part of its headers, or nothing, is closed within a few seconds;
    so is one that stalls in its second request's headers after a first request was answered."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        assert _closed_within(sock, 5) == b""
    assert time.perf_counter() - t0 < 5
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        assert _closed_within(sock, 5) == b""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(1.5)  # idle past read_timeout: the header timer starts at the next request's first byte
        sock.sendall(b"GET /health HTTP/1.1\r\nHo")
        answered = _closed_within(sock, 5)
    assert answered is not None and answered.startswith(b"HTTP/1.1 200") and answered.count(b"HTTP/1.1") == 1
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
