"""The model-server protocol of the Kubernetes Gateway API Inference Extension and vLLM's per-request metrics: the
gauges its endpoint picker routes on (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`) scraped under load, vLLM's `vllm:spec_decode_*` counters beside multispec's, and the
`metrics.speculative_decoding` object of a response, checked against vLLM's field names."""
from __future__ import annotations

import threading

import httpx
import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from helpers import save_tiny_pair  # noqa: E402
from test_serve import NAME, TEMPLATE, GatedGenerate, ServerThread, _eventually  # noqa: E402

from multispec import generate, load_pair  # noqa: E402
from multispec.serve import ServeSettings, create_app  # noqa: E402
from multispec.serve.protocol import SpeculativeDecoding  # noqa: E402

# vLLM's `metrics.speculative_decoding` at its `--per-request-spec-decode-metrics summary`
VLLM_FIELDS = {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram", "num_spec_steps",
               "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = save_tiny_pair(tmp_path_factory.mktemp("gateway_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


def _scrape(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _gauge(samples: dict, name: str) -> float:
    return samples[(name, (("model_name", NAME),))]


def _post_in_thread(url: str, out: list) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(
        httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=60).status_code))
    t.start()
    return t


def test_gauges_under_load_one_sequence_per_worker(pair):
    """--max-concurrent 1: one runs, the others wait; the cache in use is busy workers / workers."""
    gate = GatedGenerate()
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, max_concurrent=1, max_queue=4),
                                generate_fn=gate))
    try:
        idle = _scrape(s.url)
        assert (_gauge(idle, "vllm:num_requests_waiting"), _gauge(idle, "vllm:num_requests_running"),
                _gauge(idle, "vllm:kv_cache_usage_perc")) == (0, 0, 0)
        sched, out = s.app.state.scheduler, []
        threads = [_post_in_thread(s.url, out) for _ in range(3)]
        assert _eventually(lambda: sched.running == 1 and sched.waiting == 2)
        busy = _scrape(s.url)
        assert _gauge(busy, "vllm:num_requests_waiting") == 2
        assert _gauge(busy, "vllm:num_requests_running") == 1
        assert _gauge(busy, "vllm:kv_cache_usage_perc") == 1.0
        assert busy[("multispec:num_requests_waiting", ())] == 2  # multispec's own gauges agree
        gate.release.set()
        for t in threads:
            t.join(30)
        assert out == [200] * 3
        done = _scrape(s.url)
        assert _gauge(done, "vllm:num_requests_waiting") == 0 and _gauge(done, "vllm:kv_cache_usage_perc") == 0
    finally:
        gate.release.set()
        s.close()


def test_gauges_under_load_continuous_batching(pair):
    """A batch of 2 slots, 4 requests: 2 wait, usage is busy slots / slots, always in [0, 1]."""
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd", backend="fast", max_batch=2,
                                                    max_queue=4)))
    try:
        sched, out, seen = s.app.state.scheduler, [], []
        body = {"prompt": "def f(x):", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
        threads = [threading.Thread(target=lambda: out.append(httpx.post(
            s.url + "/v1/completions", json=body, timeout=120).status_code)) for _ in range(4)]
        for t in threads:
            t.start()

        def queued() -> bool:
            samples = _scrape(s.url)
            seen.append((_gauge(samples, "vllm:num_requests_waiting"), _gauge(samples, "vllm:kv_cache_usage_perc")))
            return seen[-1][0] > 0 and seen[-1][1] == 1.0

        assert _eventually(queued, tries=1500), seen[-5:]
        for t in threads:
            t.join(120)
        assert out == [200] * 4
        assert all(0.0 <= usage <= 1.0 for _, usage in seen)
        assert sched.cache_usage() == 0.0
    finally:
        s.close()


def test_vllm_spec_decode_counters_equal_multispec_ones(pair):
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd")))
    try:
        for prompt in ("def f(x):", "for n in range(2):\n    print("):
            s.client.completions.create(model=NAME, prompt=prompt, max_tokens=16, temperature=0)
        samples = _scrape(s.url)
        ours = {(name.removeprefix("multispec:"), labels): v for (name, labels), v in samples.items()
                if name.startswith("multispec:spec_decode_") and name.endswith("_total")}
        assert ours[("spec_decode_num_drafts_total", ())] > 0
        for (name, labels), value in ours.items():
            assert samples[("vllm:" + name, tuple(sorted(labels + (("model_name", NAME),))))] == value, name
    finally:
        s.close()


def _check_vllm_object(obj: dict, stats: dict) -> None:
    spec = obj["speculative_decoding"]
    assert set(spec) == VLLM_FIELDS
    assert spec["num_spec_steps"] == stats["num_spec_steps"] > 0
    assert spec["num_draft_tokens"] == stats["num_draft_tokens"]
    assert spec["num_accepted_draft_tokens"] == stats["num_accepted_draft_tokens"]
    hist = spec["acceptance_histogram"]
    assert len(hist) == spec["num_spec_tokens"] + 1 and all(isinstance(h, int) and h >= 0 for h in hist)
    assert sum(hist) == spec["num_spec_steps"]
    assert sum(j * h for j, h in enumerate(hist)) == spec["num_accepted_draft_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["num_accepted_draft_tokens"] /
                                                           spec["num_spec_steps"])
    assert spec["draft_acceptance_rate"] == pytest.approx(spec["num_accepted_draft_tokens"] /
                                                          spec["num_draft_tokens"])
    assert 0.0 <= spec["draft_acceptance_rate"] <= 1.0


def test_per_request_metrics_object_in_vllm_shape(pair):
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd", chat_template=TEMPLATE)))
    try:
        prompt = "def f(x):"
        ref = generate(pair, prompt, method="sd", max_new_tokens=24, temperature=0.0)
        body = {"model": NAME, "prompt": prompt, "max_tokens": 24, "temperature": 0}
        whole = httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()
        _check_vllm_object(whole["metrics"], ref.stats)
        assert whole["spec_decode"]["num_spec_steps"] == ref.stats["num_spec_steps"]  # kept beside it
        # streamed: in the final usage chunk (choices []), as vLLM streams it
        chunks = list(s.client.completions.create(stream=True, stream_options={"include_usage": True}, **body))
        last = chunks[-1]
        assert last.choices == [] and last.usage is not None
        _check_vllm_object(last.model_extra["metrics"], ref.stats)
        assert not any(c.model_extra.get("metrics") for c in chunks[:-1])
        # several choices: none, as vLLM (one request, one sequence)
        several = httpx.post(s.url + "/v1/completions", json={**body, "n": 2}, timeout=60).json()
        assert several.get("metrics") is None and several["spec_decode"] is not None
        # chat: the same object, whole and in the final usage chunk
        chat = {"model": NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0}
        whole = httpx.post(s.url + "/v1/chat/completions", json=chat, timeout=60).json()
        assert set(whole["metrics"]["speculative_decoding"]) == VLLM_FIELDS
        assert whole["metrics"]["speculative_decoding"]["num_spec_steps"] == whole["spec_decode"]["num_spec_steps"]
        chunks = list(s.client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **chat))
        assert chunks[-1].choices == [] and set(chunks[-1].model_extra["metrics"]["speculative_decoding"]) == \
            VLLM_FIELDS
    finally:
        s.close()


def test_histogram_from_per_position_counts():
    # 5 rounds of depth 3: accepted 0, 1, 3, 3, 2 -> at depth 1: 4 rounds, depth 2: 3, depth 3: 2
    stats = {"num_spec_steps": 5, "num_draft_tokens": 15, "num_accepted_draft_tokens": 9,
             "accepted_per_position": [4, 3, 2]}
    spec = SpeculativeDecoding.of(stats)
    assert spec.acceptance_histogram == [1, 1, 1, 2] and spec.num_spec_tokens == 3
    assert spec.mean_acceptance_length == pytest.approx(1 + 9 / 5) and spec.draft_acceptance_rate == 0.6
    none = SpeculativeDecoding.of({"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0,
                                   "accepted_per_position": []})
    assert none.acceptance_histogram == [0] and none.mean_acceptance_length == 1.0
    assert none.draft_acceptance_rate == 0.0
