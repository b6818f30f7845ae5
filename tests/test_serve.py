"""`multispec serve`: the real server on a loopback port (uvicorn in a thread) with a tiny pair, driven by the
official `openai` client; outputs checked against `multispec.generate` token for token."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from helpers import save_tiny_pair  # noqa: E402

from multispec import generate, load_pair  # noqa: E402
from multispec.api import GenerationResult  # noqa: E402
from multispec.serve import ServeSettings, create_app, uvicorn_config  # noqa: E402
from multispec.text import StopStrings, Streamer  # noqa: E402

NAME = "tiny"
PROMPTS = ["def f(x):", "for n in range(2):\n    print("]
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 (a free port) in a daemon thread."""

    def __init__(self, app, api_key: str = "none"):
        self.app = app
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        assert _eventually(lambda: self.server.started), "server did not start"
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=60)

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


def _eventually(condition, tries: int = 500) -> bool:
    for _ in range(tries):
        if condition():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = save_tiny_pair(tmp_path_factory.mktemp("serve_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


@pytest.fixture(scope="module")
def server(pair):
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, max_concurrent=2, max_queue=4)))
    yield s
    s.close()


@pytest.fixture(scope="module")
def chat_server(pair):
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, chat_template=TEMPLATE)))
    yield s
    s.close()


def _stream_text(stream) -> tuple[str, list]:
    chunks = list(stream)
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks


@pytest.fixture(scope="module")
def sd_server(pair):
    """A fixed method: bit-reproducible for a seed (auto's plans follow measured speed, so only its law is fixed)."""
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd")))
    yield s
    s.close()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_equals_library_token_for_token(server, sd_server, pair, prompt):
    # the default method (auto) gives the library's tokens; its spec metrics follow measured speed, so they are
    # compared on a fixed method
    auto = server.client.completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0,
                                            extra_body={"return_token_ids": True})
    assert auto.choices[0].model_extra["token_ids"] == generate(pair, prompt, max_new_tokens=24,
                                                                temperature=0.0).token_ids
    ref = generate(pair, prompt, method="sd", max_new_tokens=24, temperature=0.0)
    r = sd_server.client.completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0,
                                            extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert choice.model_extra["token_ids"] == ref.token_ids
    assert choice.text == ref.text
    assert choice.finish_reason == ref.finish_reason
    prompt_len = 1 + len(pair.tokenizer(prompt, add_special_tokens=False)["input_ids"])  # BOS + prompt
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (prompt_len, len(ref.token_ids))
    assert r.usage.total_tokens == prompt_len + len(ref.token_ids)
    spec = r.model_extra["spec_decode"]
    for key in ("method", "lossless", "num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens",
                "accepted_per_position"):
        assert spec[key] == ref.stats[key]


def test_token_id_prompt_and_length_finish(server, pair):
    ids = [pair.tokenizer.bos_token_id, 5, 9, 3]
    ref = generate(pair, ids, max_new_tokens=7, temperature=0.0)
    r = server.client.completions.create(model=NAME, prompt=ids, max_tokens=7, temperature=0)
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7


def test_streamed_text_concatenated_equals_whole(server):
    # a prompt no other test sends, streamed first: auto's suffix store would otherwise hold the whole continuation
    # and commit it in one round (one chunk)
    kw = dict(model=NAME, prompt="import math\n\ndef area(r):", max_tokens=30, temperature=0)
    text, chunks = _stream_text(server.client.completions.create(**kw, stream=True,
                                                                stream_options={"include_usage": True}))
    whole = server.client.completions.create(**kw)
    assert text == whole.choices[0].text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) >= 2  # it really streamed
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_strings_cut_whole_and_streamed_text(server, pair):
    full = generate(pair, PROMPTS[0], max_new_tokens=30, temperature=0.0).text
    stop = full[6:9]  # three characters from the middle of the greedy text
    assert len(stop) == 3
    ref = generate(pair, PROMPTS[0], max_new_tokens=30, temperature=0.0, stop=[stop])
    assert ref.finish_reason == "stop" and stop not in ref.text
    kw = dict(model=NAME, prompt=PROMPTS[0], max_tokens=30, temperature=0)
    for stops in (stop, [stop, "never-generated"]):
        r = server.client.completions.create(**kw, stop=stops)
        assert (r.choices[0].text, r.choices[0].finish_reason) == (ref.text, "stop")
        text, chunks = _stream_text(server.client.completions.create(**kw, stop=stops, stream=True))
        assert text == ref.text
        assert all(stop not in c.choices[0].text for c in chunks)


def test_same_seed_same_sampled_text_as_library(sd_server, pair):
    kw = dict(model=NAME, prompt=PROMPTS[1], max_tokens=20, temperature=1.0, seed=1234)
    a = sd_server.client.completions.create(**kw, extra_body={"top_k": 50})
    b = sd_server.client.completions.create(**kw, extra_body={"top_k": 50})
    ref = generate(pair, PROMPTS[1], method="sd", max_new_tokens=20, temperature=1.0, top_k=50, seed=1234)
    assert a.choices[0].text == b.choices[0].text == ref.text
    other = generate(pair, PROMPTS[1], method="sd", max_new_tokens=20, temperature=1.0, top_k=50, seed=99)
    c = sd_server.client.completions.create(**{**kw, "seed": 99}, extra_body={"top_k": 50})
    assert c.choices[0].text == other.text


def test_chat_uses_the_template_and_equals_library(chat_server, pair):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f(x):"}]
    ids = pair.tokenizer("<system>be brief\n<user>def f(x):\n<assistant>", add_special_tokens=False)["input_ids"]
    ref = generate(pair, ids, max_new_tokens=16, temperature=0.0)
    r = chat_server.client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(ids)
    stream = chat_server.client.chat.completions.create(model=NAME, messages=messages, max_tokens=16,
                                                        temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason


def test_chat_without_a_template_is_a_clear_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "no_chat_template" and "--chat-template" in e.value.message


def _scrape(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_parse_and_agree_with_per_request_metrics(server):
    before = _scrape(server)
    kw = dict(model=NAME, max_tokens=20, temperature=0)
    spec, completion = [], 0
    for prompt in PROMPTS:
        r = server.client.completions.create(prompt=prompt, **kw)
        spec.append(r.model_extra["spec_decode"])
        completion += r.usage.completion_tokens
    chunks = list(server.client.completions.create(prompt=PROMPTS[0], stream=True,
                                                   stream_options={"include_usage": True}, **kw))
    spec.append(next(c.model_extra["spec_decode"] for c in chunks if c.model_extra.get("spec_decode")))
    completion += chunks[-1].usage.completion_tokens
    after = _scrape(server)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("multispec:spec_decode_num_drafts_total") == sum(s["num_spec_steps"] for s in spec) > 0
    assert delta("multispec:spec_decode_num_draft_tokens_total") == sum(s["num_draft_tokens"] for s in spec)
    assert delta("multispec:spec_decode_num_accepted_tokens_total") == sum(
        s["num_accepted_draft_tokens"] for s in spec)
    depth = max(len(s["accepted_per_position"]) for s in spec)
    for pos in range(depth):
        want = sum(s["accepted_per_position"][pos] for s in spec if pos < len(s["accepted_per_position"]))
        assert delta("multispec:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == want
    assert delta("multispec:generation_tokens_total") == completion
    assert delta("multispec:e2e_request_latency_seconds_count") == 3
    assert delta("multispec:time_to_first_token_seconds_count") == 3


BAD = [
    ("/v1/completions", b'{"prompt": "x",', "not valid JSON"),
    ("/v1/completions", b'["prompt"]', "JSON object"),
    ("/v1/completions", b'{"prompt": "x", "max_token": 3}', "max_token"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": "3"}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "temperature": -1}', "temperature"),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', "temperature"),
    ("/v1/completions", b'{"prompt": "x", "top_p": 0}', "top_p"),
    ("/v1/completions", b'{"prompt": "x", "n": 17}', "n"),
    ("/v1/completions", b'{"prompt": "x", "logprobs": 21}', "logprobs"),
    ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "stream"),
    ("/v1/completions", b'{"prompt": "x", "stop": ""}', "stop"),
    ("/v1/completions", b'{"prompt": ""}', "empty"),
    ("/v1/completions", b'{"prompt": [1, 99999]}', "token ids"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1000}', "context length"),
    ("/v1/completions", b'{"max_tokens": 3}', "prompt"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', "role"),
]


@pytest.mark.parametrize("path,body,words", BAD)
def test_bad_requests_get_400_with_an_openai_error(server, path, body, words):
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"


def test_refusals_through_the_client_and_server_stays_healthy(server):
    with pytest.raises(openai.BadRequestError, match="suffix is not supported"):
        server.client.completions.create(model=NAME, prompt="x", suffix="y")
    with pytest.raises(openai.BadRequestError):
        server.client.completions.create(model=NAME, prompt="x", best_of=2)
    with pytest.raises(openai.NotFoundError):
        server.client.completions.create(model="gpt-4", prompt="x")
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert [m.id for m in server.client.models.list()] == [NAME]
    assert server.client.completions.create(model=NAME, prompt="x", max_tokens=2).usage.completion_tokens >= 1


def _fake_stats() -> dict:
    return {"method": "fake", "lossless": True, "reproducible": False, "num_spec_steps": 0, "num_draft_tokens": 0,
            "num_accepted_draft_tokens": 0, "mean_acceptance_length": None, "draft_acceptance_rate": None,
            "accepted_per_position": []}


class GatedGenerate:
    """A stand-in for multispec.generate that streams "x" until released (or cancelled through its callback)."""

    def __init__(self):
        self.release = threading.Event()
        self.unwound_by = []  # the exception type that ended each call, or None

    def __call__(self, pair, prompt, stream=None, **kwargs):
        try:
            for _ in range(2000):
                if self.release.wait(0.01):
                    break
                stream("x")
        except Exception as e:
            self.unwound_by.append(type(e).__name__)
            raise
        self.unwound_by.append(None)
        return GenerationResult(token_ids=[1], text="x", stats=_fake_stats(), finish_reason="length")


def test_queue_bound_gives_429_with_retry_after_and_keeps_serving(pair):
    gate = GatedGenerate()
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, max_concurrent=1, max_queue=1),
                                generate_fn=gate))
    try:
        sched = s.app.state.scheduler
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            httpx.post(s.url + "/v1/completions", json={"prompt": "x"}, timeout=60).status_code)) for _ in range(2)]
        for t in threads:
            t.start()
        assert _eventually(lambda: sched.running == 1 and sched.waiting == 1)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            s.client.completions.create(model=NAME, prompt="x")
        gate.release.set()
        for t in threads:
            t.join(30)
        assert results == [200, 200]
        assert s.client.completions.create(model=NAME, prompt="x").choices[0].text == "x"
    finally:
        gate.release.set()
        s.close()


def test_client_disconnect_cancels_the_generation(pair):
    gate = GatedGenerate()
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME), generate_fn=gate))
    try:
        with httpx.stream("POST", s.url + "/v1/completions", json={"prompt": "x", "stream": True}) as r:
            first = next(r.iter_lines())
            assert first.startswith("data: ")
        sched = s.app.state.scheduler
        assert _eventually(lambda: sched.cancelled == 1 and sched.running == 0)
        assert gate.unwound_by == ["Cancelled"]
    finally:
        gate.release.set()
        s.close()


def test_client_giving_up_on_a_whole_response_cancels_the_generation(pair):
    gate = GatedGenerate()
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME), generate_fn=gate))
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(s.url + "/v1/completions", json={"prompt": "x"}, timeout=0.5)
        sched = s.app.state.scheduler
        assert _eventually(lambda: sched.cancelled == 1 and sched.running == 0)
        assert gate.unwound_by == ["Cancelled"]
    finally:
        gate.release.set()
        s.close()


def test_request_timeout_cancels_and_answers_504(pair):
    gate = GatedGenerate()
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, request_timeout=0.3), generate_fn=gate))
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x"}, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert _eventually(lambda: gate.unwound_by == ["Cancelled"])
    finally:
        gate.release.set()
        s.close()


def test_stop_holdback_never_sends_a_split_stop_and_adds_up():
    """The one stop-string matcher (generate's, relayed as is by the server): a stop split across rounds is never
    half-sent, and the deltas add up to the final text."""

    class CharTok:  # one character per token id
        def decode(self, ids, skip_special_tokens=True):
            return "".join(map(chr, ids))

    stops = StopStrings(CharTok(), ["END"])
    sent = []
    streamer = Streamer(stops, sent.append)
    ids = []
    for chunk in ("abc E", "N", "xEN", "D tail"):
        ids += [ord(c) for c in chunk]
        streamer.on_tokens(ids)
    text, kept = stops.final(ids)
    streamer.flush(text)
    assert sent == ["abc ", "ENx"] and "".join(sent) == text == "abc ENx"
    assert stops.cut_ids(ids) == len("abc ENxEND") and "".join(map(chr, kept)) == text
    plain = StopStrings(CharTok(), [])
    out = []
    s2 = Streamer(plain, out.append)
    s2.on_tokens([97]), s2.on_tokens([97, 98]), s2.flush("abc")
    assert out == ["a", "b", "c"] and plain.cut_ids([97]) is None


def test_streamer_token_mode_sends_each_chunk_with_the_tokens_it_completes():
    """Token mode (the server's): a chunk carries the tokens whose text now lies within the text shown; a token held
    back with a tail that could grow into a stop string waits, a character split over two tokens goes with its
    second, a special token with the next text or the last chunk. The chunks' tokens and logprobs add up to the
    result's, the texts to its text, and the prompt's logprobs come with the first chunk only."""

    class Tok:  # ids < 256: that character; 300 + 301: "é" (alone, each is half of it); 0: special; 4xx: strings
        strings = {400: "ab", 401: "c E", 402: "ND", 403: "N", 404: "x"}

        def decode(self, ids, skip_special_tokens=True):
            out, i = [], 0
            while i < len(ids):
                if ids[i:i + 2] == [300, 301]:
                    out.append("é")
                    i += 2
                    continue
                t = ids[i]
                out.append(self.strings.get(t) or ("\ufffd" if t in (300, 301) else "" if t == 0 else chr(t)))
                i += 1
            return "".join(out)

    class Recorder:  # a LogprobRecorder's lists, filled as rounds commit
        prompt, prompt_tokens, tokens = True, [None, "p1"], []

    stops, rec, sent = StopStrings(Tok(), ["END"]), Recorder(), []
    streamer = Streamer(stops, sent.append, tokens=True, recorder=rec)
    ids = []
    for piece in ([400], [401], [403], [404, 300], [301, 0], [69, 402]):
        ids += piece
        rec.tokens += [f"lp{t}" for t in piece]
        streamer.on_tokens(ids)
    assert stops.cut_ids(ids) == len(ids)  # the engine stops here
    text, kept = stops.final(ids)
    streamer.flush(text, kept)
    assert [(c.text, c.token_ids) for c in sent] == [("ab", [400]), ("c ", []), ("ENxé", [401, 403, 404, 300, 301]),
                                                     ("", [0])]
    assert "".join(c.text for c in sent) == text == "abc ENxé" and [t for c in sent for t in c.token_ids] == kept
    assert all(c.logprobs == [f"lp{t}" for t in c.token_ids] for c in sent)
    assert sent[0].prompt_logprobs == [None, "p1"] and all(c.prompt_logprobs is None for c in sent[1:])
    plain = []  # without token mode, the callback gets bare deltas as before
    s2 = Streamer(stops, plain.append)
    s2.on_tokens([400, 401]), s2.flush("abc E", [400, 401])
    assert plain == ["abc ", "E"]


def test_generate_cli_reads_stdin_and_prompt_file_and_prints_finish_reason(tmp_path, pair):
    from click.testing import CliRunner

    from multispec.cli import _register, cli

    _register()
    args = ["--target", pair.target_path, "--draft", pair.draft_path, "--max-new-tokens", "5",
            "--temperature", "0", "--threads", "1"]
    ref = generate(pair, PROMPTS[0], max_new_tokens=5, temperature=0.0)
    runner = CliRunner()
    out = runner.invoke(cli, ["generate", "-", *args], input=PROMPTS[0])
    assert out.exit_code == 0, out.output
    assert PROMPTS[0] + ref.text in out.stdout and f"finished by {ref.finish_reason}" in out.stderr
    f = tmp_path / "prompt.txt"
    f.write_text(PROMPTS[0])
    out = runner.invoke(cli, ["generate", "--prompt-file", str(f), *args])
    assert out.exit_code == 0 and PROMPTS[0] + ref.text in out.stdout


def test_serve_cli_refuses_bad_settings_before_loading(tmp_path, capsys):
    from multispec.cli import main

    empty = tmp_path / "t.jinja"
    empty.write_text(" ")
    for argv, words in ((["serve", "--method", "sd", "--tree", "4,2"], "tree"),
                        (["serve", "--chat-template", str(empty)], "chat template file")):
        with pytest.raises(SystemExit) as e:
            main(argv + ["--target", str(tmp_path / "missing")])  # refused before this path is looked at
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and "missing" not in err and len(err.strip().splitlines()) == 1


def test_identical_seeded_requests_sent_concurrently_give_one_text(pair):
    """auto's plans follow measured speed and differ between concurrent runs; a seeded request to auto is
    reproducible by default (drafter-invariant verification): the seed alone fixes the text, equal to the
    library's."""
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, max_concurrent=3)))
    try:
        body = {"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 1.0, "seed": 42, "return_token_ids": True}
        out = []
        threads = [threading.Thread(target=lambda: out.append(httpx.post(s.url + "/v1/completions", json=body,
                                                                         timeout=120).json())) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        ids = {tuple(r["choices"][0]["token_ids"]) for r in out}
        ref = generate(pair, PROMPTS[0], method="ar", max_new_tokens=24, temperature=1.0, seed=42, reproducible=True)
        assert len(out) == 6 and ids == {tuple(ref.token_ids)}
        assert all(r["spec_decode"]["reproducible"] for r in out)
    finally:
        s.close()
