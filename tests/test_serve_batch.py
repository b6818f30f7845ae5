"""`multispec serve --max-batch`: continuous batching. Concurrent requests share batched forwards, each response
equals the library's result for its request, cancelled streams free their slots at once, and Prometheus shows
the batch sizes and queue times."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from helpers import assert_one_line_error, run_cli, save_tiny_pair  # noqa: E402
from test_serve import NAME, ServerThread, _eventually  # noqa: E402

from multispec import generate, load_pair  # noqa: E402
from multispec.serve import ServeSettings, create_app  # noqa: E402

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
    batcher = server.app.state.scheduler.group.batcher
    assert batcher.sequences[1] / batcher.forwards[1] > 1.2
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
        assert sched.group.batcher.live == 0
        t0 = time.perf_counter()
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and time.perf_counter() - t0 < 10
    finally:
        s.close()


def test_serve_refuses_max_batch_on_the_transformers_backend(capsys):
    code, _, err = run_cli(capsys, "serve", "--max-batch", "4", "--backend", "hf")
    assert_one_line_error(code, err, "--max-batch batches on the fast backend")
