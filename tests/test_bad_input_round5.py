"""Issue 41's fresh hostile sweep (benchmarks/hostile/hostile_sweep.py, round 5): what it found in the server and the CLI
modules, each pinned here. Server errors are OpenAI error objects naming the field the client sent."""
import pytest
from fastapi.testclient import TestClient

from multispec.serve import ServeSettings, create_app

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def client(pair):
    app = create_app(pair, ServeSettings(model_name="m", chat_template=TEMPLATE, max_model_len=64))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**6},
     "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_completion_tokens": 10**6}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**6}, "max_tokens"),
])
def test_context_error_names_the_budget_field_the_client_sent(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "context_length_exceeded"


def test_scoring_a_prompt_may_fill_the_context(client):
    """echo + logprobs with max_tokens 0 (lm-evaluation-harness's loglikelihood) scores a prompt as long as the
    context (64 here); one token more, or one new token, is a 400."""
    full = {"prompt": [3] * 64, "max_tokens": 0, "echo": True, "logprobs": 0}
    r = client.post("/v1/completions", json=full)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["logprobs"]["token_logprobs"]) == 64
    for body in ({**full, "prompt": [3] * 65}, {**full, "max_tokens": 1}):
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
