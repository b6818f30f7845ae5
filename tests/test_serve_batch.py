"""`multispec serve --max-batch`: continuous batching. Concurrent requests share batched forwards, each response
equals the library's result for its request, cancelled streams free their slots at once, and Prometheus shows
the batch sizes and queue times."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from helpers import assert_one_line_error, run_cli, save_tiny_pair  # noqa: E402
from test_serve import NAME, ServerThread, _eventually  # noqa: E402

from multispec import generate, load_pair  # noqa: E402
from multispec.errors import MultispecError  # noqa: E402
from multispec.serve import ServeSettings, create_app, memory  # noqa: E402

PROMPTS = ["def f(x):", "for n in range(2):\n    print(", "x = 1", "if x:", "print(", "return n"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = save_tiny_pair(tmp_path_factory.mktemp("serve_batch_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


@pytest.fixture(scope="module")
def server(pair):
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd", backend="fast", max_batch=4,
                                                    max_queue=8)))
    yield s
    s.close()


def test_concurrent_requests_share_forwards_and_each_equals_the_library(server, pair):
    """Six greedy requests sent at once through four slots (two wait, then join as others leave): each text is the
    library's for that prompt, token for token, and the target forwards carried more than one sequence."""
    texts = [None] * len(PROMPTS)

    def ask(i):
        texts[i] = server.client.completions.create(model=NAME, prompt=PROMPTS[i], max_tokens=24,
                                                    temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for prompt, text in zip(PROMPTS, texts):
        assert text == generate(pair, prompt, method="sd", max_new_tokens=24, temperature=0, backend="fast").text
    engine = server.app.state.scheduler.batch.engine
    assert engine.sequences[1] / engine.forwards[1] > 1.2
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("multispec:batch_size_count", "multispec:iteration_tokens_total_count",
                 "multispec:request_queue_time_seconds_count"):
        assert name in metrics


def test_streams_cancelled_mid_run_free_their_slots(pair):
    """Two slots, both taken by long streams that the clients abandon after their first chunk: the generations
    stop, and the next request is admitted and answered at once."""
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="ar", backend="fast", max_batch=2,
                                                    max_queue=2)))
    try:
        sched = s.app.state.scheduler
        for _ in range(2):
            with httpx.stream("POST", s.url + "/v1/completions", json={"prompt": "x", "stream": True,
                                                                       "max_tokens": 200}) as r:
                assert next(r.iter_lines()).startswith("data: ")
        assert _eventually(lambda: sched.cancelled == 2 and sched.running == 0)
        assert sched.batch.live == 0
        t0 = time.perf_counter()
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and time.perf_counter() - t0 < 10
    finally:
        s.close()


def test_serve_refuses_max_batch_on_the_transformers_backend(capsys):
    code, _, err = run_cli(capsys, "serve", "--max-batch", "4", "--backend", "hf")
    assert_one_line_error(code, err, "--max-batch batches on the fast backend")


def test_max_model_len_sizes_the_batch_slots_and_refuses_longer_requests(pair):
    """--max-model-len 48: each slot holds 48 tokens and a round's tree, no more; a request past 48 tokens is a
    400 naming the field to shorten; the start-up line gives the slots' memory."""
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd", backend="fast", max_batch=2,
                                                    max_model_len=48)))
    try:
        sched = s.app.state.scheduler
        rows = sched.decoder.cache_rows(48)
        assert sched.batch.rows == rows and sched.batch.target_cache.k[0].shape[:3] == (2, 1, rows)
        size = sched.batch.target_cache.nbytes + sched.batch.draft_cache.nbytes
        assert s.app.state.cache_report == (f"KV caches: 2 batch slots x {rows} rows = {size / 1e9:.2f} GB, "
                                            "allocated now (--max-model-len 48, as given)")
        assert httpx.get(s.url + "/v1/models").json()["data"][0]["max_model_len"] == 48
        for body, param in (({"prompt": [5] * 40, "max_tokens": 9}, "max_tokens"),
                            ({"prompt": [5] * 48, "max_tokens": 1}, "prompt")):
            r = httpx.post(s.url + "/v1/completions", json=body)
            error = r.json()["error"]
            assert r.status_code == 400 and error["param"] == param and error["code"] == "context_length_exceeded"
            assert error["message"].startswith("this server's maximum context length (--max-model-len) is 48 tokens")
        r = httpx.post(s.url + "/v1/completions", json={"prompt": [5] * 40, "max_tokens": 8, "ignore_eos": True},
                       timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    finally:
        s.close()


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory):
    """The tiny pair, configured for 32,768 positions (Gemma 3's; rotary positions need no weights)."""
    paths = save_tiny_pair(tmp_path_factory.mktemp("long_pair"))
    for name in ("target", "draft"):
        config = paths[name] / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 32768}))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


@pytest.mark.parametrize("available", [40e6, 400e6, 1e12])
def test_default_max_model_len_fits_the_memory_budget(long_pair, monkeypatch, available):
    """Without --max-model-len the batch slots take at most 5 % of the available memory (here pretended), in
    steps of 256 tokens, and never more than the model's positions; without batching, the same budget holds the
    --max-concurrent generations."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: int(available))
    app = create_app(long_pair, ServeSettings(model_name=NAME, method="sd", backend="fast", max_batch=4))
    sched = app.state.scheduler
    n, caches = sched.max_model_len, (sched.batch.target_cache, sched.batch.draft_cache)
    per_token = sum(c.nbytes for c in caches) / sched.batch.rows  # both models, every slot
    assert n % memory.ROUND_TO == 0 and 256 <= n <= 32768
    assert sched.batch.rows == sched.decoder.cache_rows(n)
    if n < 32768:
        assert per_token * sched.batch.rows <= 0.05 * available < per_token * (sched.batch.rows + memory.ROUND_TO)
        assert "what fits 5% of the" in app.state.cache_report
    else:
        assert available == 1e12 and "the model's positions" in app.state.cache_report
    single = create_app(long_pair, ServeSettings(model_name=NAME, method="sd", max_concurrent=2)).state
    m = single.scheduler.max_model_len  # two generations, allocated per request: at least the four slots' length
    assert m >= n and single.cache_report.startswith(f"KV caches: up to 2 generations x {m} tokens = at most ")


def test_max_model_len_past_the_model_s_positions_is_refused(pair):
    with pytest.raises(MultispecError, match="--max-model-len 257 is more than the model's 256 positions"):
        create_app(pair, ServeSettings(model_name=NAME, method="sd", backend="fast", max_batch=2, max_model_len=257))
