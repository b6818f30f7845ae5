"""`multispec serve` speaks OpenAI the way real clients use it (issue 27): token-id and batched prompts, n > 1,
logprobs with echo (lm-evaluation-harness's log-likelihood requests), stream_options, /tokenize and /detokenize,
models.retrieve, explicit nulls, vLLM's extension fields; unsupported fields refused by name."""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from helpers import save_tiny_pair  # noqa: E402
from test_serve import ServerThread  # noqa: E402

from multispec import load_pair  # noqa: E402
from multispec.decoding.decoder import Decoder  # noqa: E402
from multispec.serve import ServeSettings, create_app  # noqa: E402

NAME = "tiny"
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = save_tiny_pair(tmp_path_factory.mktemp("openai_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


@pytest.fixture(scope="module")
def server(pair):
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd", method_options={"k": 3},
                                                    max_concurrent=2, max_queue=16, chat_template=TEMPLATE,
                                                    read_timeout=1.0)))
    yield s
    s.close()


def post(server, path, body, status=200):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def log_softmax_rows(pair, ids):
    with torch.no_grad():
        return torch.log_softmax(pair.target(input_ids=torch.tensor([ids])).logits[0].float(), -1)


def test_loglikelihood_request_as_lm_eval_sends_it(server, pair):
    """Two token-id prompts, echo, logprobs 1, max_tokens 0: the prompt's logprobs, equal to a full forward."""
    prompts = [pair.tokenizer("def f(x): return x")["input_ids"], pair.tokenizer("for n in range(2):")["input_ids"]]
    out = post(server, "/v1/completions", {"model": NAME, "prompt": prompts, "echo": True, "logprobs": 1,
                                           "max_tokens": 0, "temperature": 0.0, "seed": 1234})
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for prompt, choice in zip(prompts, out["choices"]):
        lp = choice["logprobs"]
        ref = log_softmax_rows(pair, prompt)
        assert len(lp["tokens"]) == len(prompt) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        for i in range(1, len(prompt)):
            assert abs(lp["token_logprobs"][i] - float(ref[i - 1, prompt[i]])) < 1e-4
            top = lp["top_logprobs"][i]  # the most likely token and the chosen one
            assert abs(max(top.values()) - float(ref[i - 1].max())) < 1e-4 and 1 <= len(top) <= 2
        assert choice["text"] == pair.tokenizer.decode(prompt, skip_special_tokens=True)
    assert out["usage"]["completion_tokens"] == 0 and out["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_greedy_logprobs_of_generated_tokens_with_echo(server, pair):
    prompt = "def f(x): return x"
    out = post(server, "/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 3, "max_tokens": 6,
                                           "temperature": 0, "return_token_ids": True})
    choice = out["choices"][0]
    assert choice["text"].startswith(prompt)
    ids = choice["prompt_token_ids"] + choice["token_ids"]
    ref = log_softmax_rows(pair, ids)
    values = choice["logprobs"]["token_logprobs"]
    assert len(values) == len(ids)
    assert max(abs(values[i] - float(ref[i - 1, ids[i]])) for i in range(1, len(ids))) < 1e-4
    assert all(1 <= len(t) <= 4 for t in choice["logprobs"]["top_logprobs"][1:])  # token strings may coincide


def test_list_of_strings_and_n_samples(server, pair):
    prompts = ["def f(x):", "for n in"]
    out = post(server, "/v1/completions", {"prompt": prompts, "n": 2, "max_tokens": 5, "temperature": 1.0,
                                           "seed": 7, "return_token_ids": True})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    decoder = Decoder(pair, "sd", k=3)
    for i, choice in enumerate(out["choices"]):
        want = decoder.generate(prompts[i // 2], max_new_tokens=5, temperature=1.0, seed=7 + i % 2)
        assert choice["token_ids"] == want.token_ids
    assert out["usage"]["prompt_tokens"] == sum(len(pair.tokenizer(p)["input_ids"]) for p in prompts)
    assert out["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in out["choices"])


def test_streaming_several_choices_with_usage(server):
    stream = server.client.completions.create(model=NAME, prompt=["def f(x):", "for n in"], max_tokens=6,
                                              temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    texts = {0: "", 1: ""}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.text
    whole = server.client.completions.create(model=NAME, prompt=["def f(x):", "for n in"], max_tokens=6,
                                             temperature=0)
    assert [texts[0], texts[1]] == [c.text for c in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_chat_logprobs_with_the_client(server, pair):
    r = server.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "def f(x):"}],
                                              max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)  # greedy: the chosen is the top
    streamed = list(server.client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "def f(x):"}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=2, stream=True))
    got = [t for c in streamed for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert [t.logprob for t in got] == [t.logprob for t in content]


def _in_text(pair, tokens: list[str]) -> str | None:
    """The text of token strings as the server returns them (special tokens add none), or None where one is part
    of a character (such tokens do not decode alone)."""
    if any("\ufffd" in t for t in tokens):
        return None
    return "".join("" if t in pair.tokenizer.all_special_tokens else t for t in tokens)


def test_streamed_completion_logprobs_come_with_the_chunks_of_their_tokens(server, pair):
    """OpenAI sends logprobs with each chunk's tokens, not all with the last chunk: each chunk's tokens spell its
    text, and over the chunks the logprobs (text_offset too) are the whole response's; an echoed prompt's come with
    the echo."""
    for echo in (False, True):
        kw = dict(model=NAME, prompt="while True:", max_tokens=24, temperature=0, logprobs=2, echo=echo)
        whole = server.client.completions.create(**kw).choices[0]
        chunks = [c.choices[0] for c in server.client.completions.create(**kw, stream=True) if c.choices]
        assert "".join(c.text for c in chunks) == whole.text
        carrying = [c for c in chunks if c.logprobs is not None and c.logprobs.tokens]
        assert len(carrying) >= 2 + echo, [c.text for c in chunks]
        spelt = [_in_text(pair, c.logprobs.tokens) for c in carrying]
        assert all(t in (None, c.text) for t, c in zip(spelt, carrying)), [(c.logprobs.tokens, c.text)
                                                                             for c in carrying]
        assert sum(t is not None and t != "" for t in spelt) >= 2
        for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [x for c in carrying for x in getattr(c.logprobs, field)] == getattr(whole.logprobs, field), field
        if echo:
            prompt = post(server, "/tokenize", {"prompt": "while True:"})["tokens"]
            assert chunks[0].text == "while True:" and len(chunks[0].logprobs.tokens) == len(prompt)


def test_streamed_chat_logprobs_come_with_the_chunks_of_their_tokens(server, pair):
    kw = dict(model=NAME, messages=[{"role": "user", "content": "while True:"}], max_tokens=24, temperature=0,
              logprobs=True, top_logprobs=2)
    whole = server.client.chat.completions.create(**kw).choices[0].logprobs.content
    chunks = [c.choices[0] for c in server.client.chat.completions.create(**kw, stream=True) if c.choices]
    carrying = [c for c in chunks if c.logprobs is not None and c.logprobs.content]
    assert len(carrying) >= 2, [c.delta.content for c in chunks]
    spelt = [_in_text(pair, [t.token for t in c.logprobs.content]) for c in carrying]
    assert all(t in (None, c.delta.content or "") for t, c in zip(spelt, carrying))
    assert sum(t is not None and t != "" for t in spelt) >= 2
    got = [t.model_dump() for c in carrying for t in c.logprobs.content]
    assert got == [t.model_dump() for t in whole] and len(got) == len(whole)


def test_tokenize_detokenize_and_models_retrieve(server, pair):
    out = post(server, "/tokenize", {"model": NAME, "prompt": "def f(x):"})
    assert out["tokens"] == pair.tokenizer("def f(x):")["input_ids"] and out["count"] == len(out["tokens"])
    assert post(server, "/tokenize", {"prompt": "def f(x):", "add_special_tokens": False})["tokens"] == \
        out["tokens"][1:]
    chat = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}], "return_token_strs": True})
    assert chat["count"] == len(chat["token_strs"]) > 0
    assert post(server, "/detokenize", {"tokens": out["tokens"]})["prompt"] == "def f(x):"
    assert server.client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError):
        server.client.models.retrieve("gpt-4")
    assert httpx.head(server.url + "/health").status_code == 200


def test_explicit_nulls_and_accepted_extensions(server):
    body = {"prompt": "x", "stream": None, "n": None, "max_tokens": None, "temperature": None, "stop": None,
            "logprobs": None, "seed": None, "stream_options": None, "best_of": None, "suffix": None}
    assert len(post(server, "/v1/completions", body)["choices"]) == 1
    vllm = {"prompt": "x", "max_completion_tokens": 3, "ignore_eos": True, "repetition_penalty": 1.0,
            "skip_special_tokens": True, "spaces_between_special_tokens": True, "priority": 0, "top_k": -1,
            "min_p": 0.0, "min_tokens": 3, "response_format": {"type": "text"}, "include_stop_str_in_output": False,
            "use_beam_search": False, "length_penalty": 1.0, "request_id": "r1", "add_special_tokens": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": False}}
    assert post(server, "/v1/completions", vllm)["usage"]["completion_tokens"] == 3
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "system", "content": None},
                                                              {"role": "user", "content": "x"}],
                                                 "max_tokens": 2, "tools": [], "tool_choice": "none"})
    assert chat["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("path,field,value", [
    ("/v1/completions", "best_of", 2), ("/v1/completions", "suffix", "x"),
    ("/v1/completions", "use_beam_search", True), ("/v1/completions", "prompt_logprobs", 1),
    ("/v1/completions", "include_stop_str_in_output", True), ("/v1/completions", "allowed_token_ids", [1]),
    ("/v1/chat/completions", "functions", [{"name": "f", "parameters": {}}]),  # the older form of tools
    ("/v1/chat/completions", "echo", True),
])
def test_unsupported_fields_are_refused_by_name(server, path, field, value):
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    err = post(server, path, {**body, field: value}, 400)["error"]
    assert err["param"] == field and f"{field} is not supported" in err["message"]


# every new field with a wrong type or range: (body additions, field named)
BAD = [
    ({"logprobs": -1}, "logprobs"), ({"logprobs": 21}, "logprobs"), ({"logprobs": True}, "logprobs"),
    ({"echo": "yes"}, "echo"), ({"n": 0}, "n"), ({"n": 17}, "n"), ({"n": 1.5}, "n"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": -1}, "max_tokens"),
    ({"max_completion_tokens": "3"}, "max_completion_tokens"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": "1"}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"), ({"min_p": -0.1}, "min_p"), ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 99, "max_tokens": 4}, "min_tokens"), ({"ignore_eos": 1}, "ignore_eos"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"), ({"logit_bias": [1]}, "logit_bias"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"stream_options": {"continuous_usage_stats": 1}}, "stream_options.continuous_usage_stats"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"logprobs_mode": "raw_logits"}, "logprobs_mode"), ({"prompt": []}, "prompt"), ({"prompt": [[]]}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"), ({"prompt": [[1], [10**9]]}, "prompt.1"), ({"prompt": [True]}, "prompt"),
    ({"add_special_tokens": 0}, "add_special_tokens"), ({"return_tokens_as_token_ids": "no"},
                                                         "return_tokens_as_token_ids"),
]


@pytest.mark.parametrize("extra,field", BAD, ids=[f for _, f in BAD])
def test_bad_new_fields_name_the_field(server, extra, field):
    err = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 4, **extra}, 400)["error"]
    assert (err["param"] == field or err["param"].startswith(field + ".")) and \
        err["type"] == "invalid_request_error", err
    assert "\n" not in err["message"]


@pytest.mark.parametrize("extra,field", [
    ({"logprobs": 1}, "logprobs"), ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
], ids=["logprobs-int", "top_logprobs-range", "top_logprobs-alone", "content-type"])
def test_bad_chat_fields_name_the_field(server, extra, field):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra}
    err = post(server, "/v1/chat/completions", body, 400)["error"]
    assert err["param"] == field or err["param"].startswith(field + "."), err


def test_a_half_sent_body_times_out_with_408(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\":")
        sock.settimeout(10)
        reply = b""
        while b"read_timeout" not in reply:  # headers and body may come in separate packets
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 408") and "read_timeout" in reply
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


@pytest.mark.slow
def test_fuzz_of_new_fields_leaves_the_server_healthy(server):
    """250 bodies mixing the new fields with good, wrong-typed and out-of-range values: never a 5xx, and the server
    answers normally afterwards."""
    import random

    rng = random.Random(27)
    good = {
        "prompt": ["x", ["x", "y"], [1, 2], [[1], [2, 3]]], "echo": [True, False, None],
        "logprobs": [0, 1, 5, 20, None], "max_tokens": [1, 3, None], "n": [1, 2, None],
        "presence_penalty": [0, 1.5, -2, None], "frequency_penalty": [0, 0.5, None],
        "repetition_penalty": [1, 1.3, 0.5, None], "min_p": [0, 0.1, None], "min_tokens": [0, 1, None],
        "ignore_eos": [True, False, None], "stop_token_ids": [[0], [], None], "logit_bias": [{"1": 5}, None],
        "stream_options": [{"include_usage": True}, None], "response_format": [{"type": "text"}, {"type": "json_object"}, None],
        "logprobs_mode": ["raw", "processed", None], "temperature": [0, 0.7, None], "seed": [0, 5, None],
        "add_special_tokens": [True, False, None], "best_of": [1, None], "stream": [False, True, None],
    }
    bad = {
        "prompt": [[], [[]], [1.5], 3, [[10**9]], "", {"a": 1}, [True]], "echo": ["1", 0],
        "logprobs": [21, -1, "2", 1.0, True], "max_tokens": [-2, "4", 10**6], "n": [0, 40, 2.0],
        "presence_penalty": [3, "x"], "frequency_penalty": [-2.5, []], "repetition_penalty": [0, -1, "1"],
        "min_p": [2, -1], "min_tokens": [50, -1], "ignore_eos": [0, "no"], "stop_token_ids": [[-1], [10**9], "a"],
        "logit_bias": [{"1": 200}, {"a": 1}, [], {"1": "x"}], "stream_options": [{"bogus": 1}, 5],
        "response_format": [{"type": "json_schema"}, "text"], "logprobs_mode": ["other", 1],
        "temperature": [-1, "hot"], "seed": [-5, 2**64], "add_special_tokens": [1], "best_of": [2, 0],
        "stream": ["yes"],
    }
    statuses = []
    for _ in range(250):
        body = {}
        for k in good:
            if rng.random() < 0.35:
                body[k] = rng.choice(bad[k] if rng.random() < 0.12 else good[k])
        body.setdefault("prompt", "x")
        r = httpx.post(server.url + "/v1/completions", content=json.dumps(body), timeout=60,
                       headers={"content-type": "application/json"})
        statuses.append(r.status_code)
        assert r.status_code < 500, (body, r.text)
        if r.status_code == 400:
            assert "error" in r.json() and r.json()["error"]["message"]
    assert statuses.count(200) > 20 and statuses.count(400) > 20
    time.sleep(0.1)
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2})["usage"]["completion_tokens"] >= 1


def test_continuous_batching_serves_logprobs_and_penalties(pair):
    """With --max-batch the request's prompts share batched forwards; each choice is still its own generation."""
    s = ServerThread(create_app(pair, ServeSettings(model_name=NAME, method="sd", method_options={"k": 3},
                                                    backend="fast", max_batch=2)))
    try:
        prompts = ["def f(x): return x", "for n in range(2):"]
        out = post(s, "/v1/completions", {"prompt": prompts, "max_tokens": 8, "temperature": 0, "logprobs": 2,
                                          "repetition_penalty": 1.4, "ignore_eos": True, "return_token_ids": True})
        for prompt, choice in zip(prompts, out["choices"]):
            alone = Decoder(pair, "sd", "fast", k=3).generate(prompt, max_new_tokens=8, temperature=0, logprobs=2,
                                                               repetition_penalty=1.4, ignore_eos=True)
            assert choice["token_ids"] == alone.token_ids
            assert max(abs(a - b.logprob) for a, b in zip(choice["logprobs"]["token_logprobs"],
                                                           alone.logprobs)) < 1e-4
    finally:
        s.close()


def test_too_many_prompts_name_prompt_and_too_many_samples_name_n(server):
    """The server holds 2 + 16 generations: 100 prompts are the prompt's fault, 2 prompts x n 16 are n's."""
    err = post(server, "/v1/completions", {"prompt": ["x"] * 100, "max_tokens": 1}, 400)["error"]
    assert err["param"] == "prompt" and "100 generations" in err["message"]
    err = post(server, "/v1/completions", {"prompt": ["x", "y"], "n": 16, "max_tokens": 1}, 400)["error"]
    assert err["param"] == "n" and "32 generations" in err["message"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": [5] * 250, "max_tokens": 10}, "max_tokens"),
    ("/v1/completions", {"prompt": [5] * 256, "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": [5] * 257, "max_tokens": 0, "echo": True}, "prompt"),  # 256 fit: scored alone
    ("/v1/completions", {"prompt": [[5], [5] * 300], "max_tokens": 1}, "prompt.1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 300}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 300}, "max_tokens"),
])
def test_requests_past_the_context_name_the_field_to_shorten(server, path, body, param):
    """The tiny model has 256 positions: the prompt alone too long names the prompt (or messages), a prompt that
    fits with max_tokens too large names max_tokens; vLLM's wording."""
    err = post(server, path, body, 400)["error"]
    assert err["param"] == param and err["code"] == "context_length_exceeded", err
    assert err["message"].startswith("this model's maximum context length is 256 tokens. However, ")
    assert post(server, "/v1/completions", {"prompt": [5] * 255, "max_tokens": 0, "echo": True})["choices"]


def test_echo_text_offsets_index_the_returned_text(server, pair):
    """The BOS is in the tokens but not in the echoed text: text_offset[i] is where token i starts in the choice's
    text (OpenAI's meaning), the BOS at 0 with no length. (logit_bias makes the random model write " x" tokens.)"""
    x = pair.tokenizer(" x", add_special_tokens=False)["input_ids"]
    assert len(x) == 1
    for body in ({"prompt": "def f(x): return x", "echo": True, "logprobs": 1, "max_tokens": 3},
                 {"prompt": [pair.tokenizer.bos_token_id] + x, "echo": True, "logprobs": 0, "max_tokens": 2},
                 {"prompt": "for n in", "logprobs": 0, "max_tokens": 4}):
        choice = post(server, "/v1/completions", {**body, "temperature": 0, "logit_bias": {str(x[0]): 100}})
        text, lp = choice["choices"][0]["text"], choice["choices"][0]["logprobs"]
        offsets = lp["text_offset"]
        assert len(offsets) == len(lp["tokens"]) and text.endswith(" x x")
        ends = offsets[1:] + [len(text)]
        want = ["" if t == pair.tokenizer.bos_token else t for t in lp["tokens"]]
        assert [text[a:b] for a, b in zip(offsets, ends)] == want, (offsets, lp["tokens"], text)
        assert "".join(want) == text


def test_top_k_0_and_minus_1_are_off_even_over_the_model_s_top_k(pair):
    """vLLM's top_k -1 (and 0) mean off: they are not replaced by the model's generation_config top_k when
    temperature is left to generation_config too. Here the config samples at T = 1 with top_k 1."""
    own = load_pair(target=pair.target_path, draft=pair.draft_path, device="cpu")
    own.target.generation_config.update(do_sample=True, temperature=1.0, top_k=1)
    s = ServerThread(create_app(own, ServeSettings(model_name=NAME, method="sd", method_options={"k": 3})))
    try:
        decoder = Decoder(own, "sd", k=3)
        full = decoder.generate("def f(x):", max_new_tokens=12, temperature=1.0, seed=3).token_ids
        top1 = decoder.generate("def f(x):", max_new_tokens=12, temperature=1.0, top_k=1, seed=3).token_ids
        assert full != top1
        body = {"prompt": "def f(x):", "max_tokens": 12, "seed": 3, "return_token_ids": True}
        for top_k in (-1, 0):
            assert post(s, "/v1/completions", {**body, "top_k": top_k})["choices"][0]["token_ids"] == full
        assert post(s, "/v1/completions", body)["choices"][0]["token_ids"] == top1  # not set: the model's
    finally:
        s.close()
