"""Tools (OpenAI function calling): the parser of Hermes-style calls, the grammar that forces them (every call's
arguments valid under its schema, the same tokens under every method, greedy), `generate(tools=...)`, and
`multispec serve` with `tools` driven by the `openai` client; bad tools are a 400 naming the field."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from multispec import MultispecError, generate
from multispec.params import ParamError
from multispec.text import encode_chat
from multispec.tools import HERMES_TEMPLATE, ToolCallParser, Tools, calls_of, parse_tool_calls

jsonschema = pytest.importorskip("jsonschema")

# a short template that renders tools (the tiny model has 256 positions; the Hermes one takes ~900 tokens here)
TEMPLATE = ("{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
            "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}"
            "\n{% endfor %}<assistant>")
NO_TOOLS = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                                 "b": {"type": "boolean"}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "def f(x):"}]


def call_text(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


# ---- the parser ----

def test_one_call():
    content, calls = parse_tool_calls(call_text("get_weather", {"city": "Paris", "days": 2}))
    assert content is None and len(calls) == 1
    c = calls[0]
    assert c["type"] == "function" and c["id"].startswith("call_") and c["function"]["name"] == "get_weather"
    assert json.loads(c["function"]["arguments"]) == {"city": "Paris", "days": 2}


def test_parallel_calls_get_their_own_ids():
    text = call_text("add", {"a": 1, "b": True}) + "\n" + call_text("get_weather", {"city": "Oslo", "days": 1})
    content, calls = parse_tool_calls(text)
    assert content is None and [c["function"]["name"] for c in calls] == ["add", "get_weather"]
    assert len({c["id"] for c in calls}) == 2


def test_text_beside_a_call_is_the_content():
    content, calls = parse_tool_calls("Let me look.\n" + call_text("add", {"a": 1, "b": False}) + "\nDone.")
    assert content == "Let me look.Done." and len(calls) == 1
    assert parse_tool_calls("no calls here") == ("no calls here", [])


@pytest.mark.parametrize("body", ['{"name": "add", "arguments": {"a": 1', '[1, 2]', '{"arguments": {}}',
                                  '{"name": "add", "arguments": 3}'])
def test_malformed_calls_stay_in_the_text(body):
    text = f"<tool_call>\n{body}\n</tool_call>"
    assert parse_tool_calls(text) == (text, [])


def test_an_unclosed_call_at_the_end_counts_if_its_json_is_whole():
    assert len(parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 1}}')[1]) == 1
    text = '<tool_call>\n{"name": "add", "argu'
    assert parse_tool_calls(text) == (text, [])


def test_streamed_pieces_add_up_to_the_whole_parse():
    text = "Sure: " + call_text("add", {"a": 1, "b": True}) + "\n" + call_text("get_weather", {"city": "x", "days": 3})
    whole_content, whole_calls = parse_tool_calls(text)
    for step in (1, 3, 7):
        parser = ToolCallParser()
        events = []
        for i in range(0, len(text), step):
            events += parser.feed(text[i:i + step])
            assert all("<" not in v for k, v in events if k == "content")  # a tag's start is held back
        events += parser.finish()
        assert "".join(v for k, v in events if k == "content") == whole_content
        assert [v["function"] for k, v in events if k == "call"] == [c["function"] for c in whole_calls]


def _events(parser: ToolCallParser, text: str, step: int) -> list:
    events = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i:i + step])
    return events + parser.finish()


def test_a_forced_call_streams_its_arguments_as_they_are_written():
    args = '{"s": "x}\\"</tool_call>{", "n": [1, {"b": true}]}'  # braces and the closing tag inside a string
    text = f'<tool_call>\n{{"name": "add", "arguments": {args}}}\n</tool_call>\n' + call_text("get_weather", {})
    parser = ToolCallParser(forced=True)
    events = []
    for i, ch in enumerate(text):  # one character at a time
        new = parser.feed(ch)
        events += new
        if i == text.index("{", text.index('"arguments"')):  # the call comes with its arguments' first brace
            assert [k for k, _ in new] == ["call", "arguments"] and new[0][1]["function"] == \
                {"name": "add", "arguments": ""} and new[1][1] == "{"
    events += parser.finish()
    assert [k for k, _ in events].count("arguments") == len(args) + 2 and not parser.cut
    calls: list[dict] = []
    assert calls_of(events, calls) == []
    assert [c["function"] for c in calls] == [{"name": "add", "arguments": args},
                                              {"name": "get_weather", "arguments": "{}"}]
    for step in (2, 5, 1000):  # however the text is cut, the same calls
        again: list[dict] = []
        calls_of(_events(ToolCallParser(forced=True), text, step), again)
        assert [c["function"] for c in again] == [c["function"] for c in calls]
    assert [c["function"] for c in parse_tool_calls(text, forced=True)[1]] == [c["function"] for c in calls]


def test_arguments_are_the_text_the_model_wrote():
    text = '<tool_call>\n{"arguments":{ "a":1,"b" :"\\u00e9"} , "name": "add"}\n</tool_call>'
    assert parse_tool_calls(text)[1][0]["function"]["arguments"] == '{ "a":1,"b" :"\\u00e9"}'
    text = '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    assert parse_tool_calls(text)[1][0]["function"]["arguments"] == '{"a": 1}'
    assert parse_tool_calls('<tool_call>\n{"name": "add"}\n</tool_call>')[1][0]["function"]["arguments"] == "{}"


def test_a_forced_call_cut_off_at_the_end_stays_a_call():
    parser = ToolCallParser(forced=True)
    calls: list[dict] = []
    calls_of(_events(parser, '<tool_call>\n{"name": "add", "arguments": {"a": 1', 3), calls)
    assert parser.cut and [c["function"] for c in calls] == [{"name": "add", "arguments": '{"a": 1'}]
    parser = ToolCallParser(forced=True)  # whole arguments, unclosed envelope: a whole call
    calls_of(_events(parser, '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool', 3), [])
    assert parser.calls == 1 and not parser.cut


@pytest.mark.parametrize("text", [
    'Hi <tool_call>\n{"name": "add", "arguments": {"a": 1',  # text first: the grammar no longer forces calls
    ' <tool_call>\n{"name": "add", "arguments": {"a": 1',
    '<tool_call>\n{"name": "add", "arguments": 3}\n</tool_call>',  # not an object: comes whole, or stays text
])
def test_only_a_call_the_grammar_forces_is_streamed(text):
    parser = ToolCallParser(forced=True)
    events = _events(parser, text, 1)
    assert "arguments" not in [k for k, _ in events] and not parser.cut
    assert "".join(v for k, v in events if k == "content") == text.strip()


# ---- checking tools ----

@pytest.mark.parametrize("tools,choice,param", [
    ("nope", None, "tools"),
    ([3], None, "tools.0"),
    ([{"type": "function", "function": {"description": "x"}}], None, "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "has space"}}], None, "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "object"}}], None, "tools.0.function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}], None,
     "tools.0.function.parameters"),
    ([{"type": "retrieval"}], None, "tools.0.type"),
    ([WEATHER, WEATHER], None, "tools.1.function.name"),
    (TOOLS, "sometimes", "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "nowhere"}}, "tool_choice.function.name"),
    (None, "required", "tool_choice"),
])
def test_bad_tools_name_the_field(tools, choice, param):
    with pytest.raises(ParamError) as e:
        Tools.of(tools, choice)
    assert e.value.param == param and "\n" not in str(e.value)


def test_no_tools_and_choices():
    assert Tools.of(None) is None and Tools.of([], "none") is None
    t = Tools.of(TOOLS)
    assert t.choice == "auto" and t.parse and t.grammar(None) is None
    assert not Tools.of(TOOLS, "none").parse
    named = Tools.of(TOOLS, {"type": "function", "function": {"name": "add"}})
    assert named.choice == "function" and named.name == "add"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_calls_may_end_after_the_newline_models_write_after_them(pair, choice):
    """Qwen2.5-Coder writes a newline after </tool_call> (P = 0.9998) and then ends. The grammar let that newline
    only separate parallel calls, so under "required" the model was made to call again until max_tokens (20 of 40
    agent requests). After a call, with or without that newline, the output may end; a second call stays allowed
    where parallel calls are."""
    from multispec.loading import eos_ids, vocab_rows
    from multispec.structured import Constraint, bind

    grammar = bind(Constraint.of(grammar=Tools.of(TOOLS, choice).grammar(pair.tokenizer)), pair.tokenizer,
                   vocab_rows(pair.target), eos_ids(pair))

    def after(text: str) -> bool | None:
        """None: the grammar refuses the text; else whether the output may end after it."""
        state = grammar.start()
        try:
            state.commit(pair.tokenizer(text, add_special_tokens=False)["input_ids"])
        except MultispecError:
            return None
        return state.accepting

    one, parallel = call_text("add", {"a": 1, "b": True}), choice == "required"
    assert after(one) is True and after(one + "\n") is True
    assert after(one + "\n<tool_call>") is (False if parallel else None)
    assert after(one + "\n" + one + "\n") is (True if parallel else None)


def test_a_gguf_target_ends_where_llama_cpp_ends():
    """A GGUF file names one eos token; the model's own config may list more (Qwen2.5: <|im_end|> and
    <|endoftext|>). A GGUF target's generation ends at the special tokens llama.cpp ends at, where its vocabulary
    has them; a folder's generation config is taken as it is."""
    from types import SimpleNamespace

    from multispec.loading import eos_ids

    class Tok:
        eos_token_id = 5

        def get_added_vocab(self):
            return {"<|im_start|>": 1, "<|im_end|>": 2, "<|endoftext|>": 0, "<tool_call>": 7}

    target = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=2))
    gguf = SimpleNamespace(target=target, tokenizer=Tok(), models={"target": {"path": "q.gguf", "file": "q.gguf"}})
    folder = SimpleNamespace(target=target, tokenizer=Tok(), models={"target": {"path": "q"}})
    assert eos_ids(gguf) == {0, 2} and eos_ids(folder) == {2}
    target.generation_config = None
    assert eos_ids(folder) == {5} and eos_ids(gguf) == {0, 2, 5}


# ---- rendering ----

def test_the_template_sees_tools_tool_calls_and_tool_messages(pair):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": true}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "2"}]
    ids = encode_chat(pair.tokenizer, 10**9, history, TEMPLATE, Tools.of(TOOLS).template_tools())
    text = 'tools: get_weather add<user>def f(x):<assistant>[add {"a": 1, "b": true}]<tool>2<assistant>'  # trim_blocks
    assert ids == pair.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_hermes_template_renders_a_tool_conversation(pair):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": true}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "2"}]
    template = open(HERMES_TEMPLATE).read()
    text = pair.tokenizer.decode(encode_chat(pair.tokenizer, 10**9, history, template,
                                             Tools.of(TOOLS).template_tools()))
    assert '"name": "get_weather"' in text and '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": true}}' \
        in text and "<tool_response>\n2\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("kwargs,words", [
    (dict(chat_template=NO_TOOLS, tools=TOOLS), "has no tool support"),
    (dict(chat_template=TEMPLATE, tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    (dict(chat_template=TEMPLATE, tools=TOOLS, messages=MESSAGES + [{"role": "tool", "content": "2"}]),
     "tool_call_id"),
    (dict(chat_template=TEMPLATE, tools=TOOLS, tool_choice="required", json_schema={"type": "object"}),
     "cannot be combined"),
    (dict(prompt="def f(x):", tools=TOOLS), "tools apply to messages"),
])
def test_bad_tool_requests_are_one_line(pair, kwargs, words):
    kwargs = {"messages": MESSAGES, **kwargs} if "prompt" not in kwargs else kwargs
    with pytest.raises(MultispecError, match=words) as e:
        generate(pair, max_new_tokens=4, **kwargs)
    assert "\n" not in str(e.value)


# ---- constrained calls ----

def valid_calls(result, names=None) -> list[dict]:
    """The result's calls, each checked against its tool's schema (every call the text holds was parsed)."""
    assert result.tool_calls, result.text
    for c in result.tool_calls:
        name = c["function"]["name"]
        assert names is None or name in names
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[name])
    closed = result.text.count("</tool_call>")
    assert len(result.tool_calls) in (closed, closed + 1)
    return result.tool_calls


@pytest.mark.parametrize("method", ["ar", "auto"])
def test_required_calls_validate_at_t1(pair, method):
    for seed in range(4):
        r = generate(pair, messages=MESSAGES, chat_template=TEMPLATE, tools=TOOLS, tool_choice="required",
                     method=method, max_new_tokens=100, temperature=1.0, seed=seed)
        assert r.text.startswith("<tool_call>\n{\"name\": \"")
        valid_calls(r)


@pytest.mark.parametrize("method", ["ar", "auto"])
def test_a_named_function_is_called_once_and_the_reply_ends(pair, method):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for seed in range(3):
        r = generate(pair, messages=MESSAGES, chat_template=TEMPLATE, tools=TOOLS, tool_choice=choice,
                     method=method, max_new_tokens=100, temperature=1.0, seed=seed)
        assert r.finish_reason == "stop" and r.stats["structured"]["complete"], r.text
        assert len(valid_calls(r, {"get_weather"})) == 1


def test_strict_under_auto_is_text_or_valid_calls(pair):
    strict = [dict(WEATHER, function=dict(WEATHER["function"], strict=True))]
    for seed in range(4):
        r = generate(pair, messages=MESSAGES, chat_template=TEMPLATE, tools=strict, method="ar",
                     max_new_tokens=60, temperature=1.0, seed=seed)
        assert r.stats["structured"]["kind"] == "grammar"
        if r.text.startswith("<tool_call>"):
            valid_calls(r)
        else:
            assert r.tool_calls == [] and "<tool_call>" not in r.text[:11]


@pytest.mark.slow
def test_every_required_and_strict_call_validates_over_100_seeds_at_t1(pair):
    strict = [dict(t, function=dict(t["function"], strict=True)) for t in TOOLS]
    made = stopped = 0
    for seed in range(100):
        r = generate(pair, messages=MESSAGES, chat_template=TEMPLATE, tools=strict if seed % 2 else TOOLS,
                     tool_choice="required", method="auto", max_new_tokens=200, temperature=1.0, seed=seed)
        closed = r.text.count("</tool_call>")  # the limit may cut a last call (its arguments as far as written)
        assert closed >= 1 and len(r.tool_calls) in (closed, closed + 1), r.text
        assert r.finish_reason == "length" or len(r.tool_calls) == closed, r
        for c in r.tool_calls[:closed]:
            jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
        made, stopped = made + closed, stopped + (r.finish_reason == "stop")
    assert made >= 100 and stopped >= 50
    for seed in range(100):  # strict under auto: text, or calls that validate (this model writes text: it never
        # opens with the whole tag)
        r = generate(pair, messages=MESSAGES, chat_template=TEMPLATE, tools=strict, method="auto",
                     max_new_tokens=20, temperature=1.0, seed=seed)
        if r.text.startswith("<tool_call>"):
            valid_calls(r)
        else:
            assert r.tool_calls == []


F_ENUM = {"type": "object", "properties": {"x": {"enum": ["a", "b"]}}, "required": ["x"], "additionalProperties": False}
G_ENUM = {"type": "object", "properties": {"x": {"enum": ["c", "dd", "e"]}}, "required": ["x"],
          "additionalProperties": False}
LAW_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": F_ENUM}},
             {"type": "function", "function": {"name": "g", "parameters": G_ENUM}}]


def masked_call_law(pair, prompt: list[int], grammar: str) -> dict[str, float]:
    """The target's law of each output under the grammar, by full forwards token by token: at each step the
    softmax of its logits over the tokens the grammar allows (every tokenization of every output), no trees, no
    drafts, no forced-token shortcut."""
    import torch

    from multispec.loading import eos_ids, vocab_rows
    from multispec.structured import Constraint, bind

    rows, eos = vocab_rows(pair.target), eos_ids(pair)
    state = bind(Constraint.of(grammar=grammar), pair.tokenizer, rows, eos).start()
    law: dict[str, float] = {}

    def visit(path: list[int], prob: float) -> None:
        allowed = state.mask(rows)
        with torch.no_grad():
            logits = pair.target(input_ids=torch.tensor([prompt + path])).logits[0, -1].double()
        probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
        for t in allowed.nonzero().flatten().tolist():
            if t in eos:
                text = pair.tokenizer.decode(path)
                law[text] = law.get(text, 0.0) + prob * float(probs[t])
                continue
            state.commit([t])
            visit(path + [t], prob * float(probs[t]))
            state.m.rollback(1)

    visit([], 1.0)
    return law


def sampled_calls(pair, method: str, options: dict, prompt: list[int], grammar: str, n: int) -> dict[str, int]:
    from multispec import Decoder

    decoder = Decoder(pair, method, "hf", **options)
    counts: dict[str, int] = {}
    for seed in range(n):
        r = decoder.generate(prompt, max_new_tokens=80, temperature=1.0, seed=seed, grammar=grammar)
        assert r.finish_reason == "stop", r
        counts[r.text] = counts.get(r.text, 0) + 1
    return counts


@pytest.fixture(scope="module")
def law_request(pair):
    """A prompt and the grammar of one call of f or g (parallel calls off): five calls, each ended with or without
    the newline models write after a call, ten outputs in all."""
    from multispec.loading import vocab_rows

    tools = Tools.of(LAW_TOOLS, "required", parallel_tool_calls=False)
    grammar = tools.grammar(pair.tokenizer)
    prompt = encode_chat(pair.tokenizer, vocab_rows(pair.target), MESSAGES, TEMPLATE, tools.template_tools())
    law = masked_call_law(pair, prompt, grammar)
    assert len(law) == 10 and abs(sum(law.values()) - 1) < 1e-9 and min(law.values()) > 0.05, law
    assert all(parse_tool_calls(text, forced=True)[1] for text in law)
    return prompt, grammar, law


@pytest.mark.slow
@pytest.mark.parametrize("method,options", [("sd", {"k": 3}), ("mcsd", {"tree": "2,2"}), ("auto", {})])
def test_sampled_calls_follow_the_masked_target_law(pair, law_request, method, options):
    from engine_utils import chi_square_pvalue

    prompt, grammar, law = law_request
    # 200 runs (500 until the suite passed 15 minutes): five outputs of probability > 0.05, so every expected count is
    # above 10; the jump-forward variant below fails this test at 100 runs already (p = 2e-68; 200: 4e-138)
    counts = sampled_calls(pair, method, options, prompt, grammar, 200)
    assert set(counts) <= set(law), counts
    assert chi_square_pvalue(np.array([counts.get(t, 0) for t in law]), np.array(list(law.values()))) > 1e-3, \
        (counts, law)


def test_a_jump_forward_over_a_branch_fails_the_law(pair, law_request, monkeypatch):
    """The check has power: forced tokens that take the first allowed token where the grammar allows several (a
    jump-forward that skips a branch) make a law the chi-square refuses."""
    from engine_utils import chi_square_pvalue

    from multispec.structured import GrammarState

    def forced(self, vocab: int, limit: int) -> list[int]:
        out: list[int] = []
        while len(out) < limit and not self.ended:
            allowed = self.mask(vocab).nonzero()
            if len(allowed) == 0:
                break
            out.append(int(allowed[0]))
            self.commit(out[-1:])
        return out

    monkeypatch.setattr(GrammarState, "forced", forced)
    prompt, grammar, law = law_request
    counts = sampled_calls(pair, "sd", {"k": 3}, prompt, grammar, 100)
    assert chi_square_pvalue(np.array([counts.get(t, 0) for t in law]), np.array(list(law.values()))) < 1e-6


def test_greedy_calls_are_the_same_under_every_method(pair):
    outs = {m: generate(pair, messages=MESSAGES, chat_template=TEMPLATE, tools=TOOLS, tool_choice="required",
                        method=m, max_new_tokens=100, temperature=0) for m in ("ar", "sd", "lookup", "auto")}
    ids = {m: r.token_ids for m, r in outs.items()}
    assert all(v == ids["ar"] for v in ids.values()), ids
    valid_calls(outs["ar"])


def test_tool_choice_none_renders_tools_and_parses_nothing(pair):
    r = generate(pair, messages=MESSAGES, chat_template=TEMPLATE, tools=TOOLS, tool_choice="none",
                 max_new_tokens=6, temperature=0)
    plain = generate(pair, encode_chat(pair.tokenizer, 10**9, MESSAGES, TEMPLATE, Tools.of(TOOLS).template_tools()),
                     max_new_tokens=6, temperature=0)
    assert r.token_ids == plain.token_ids and r.tool_calls is None


# ---- the server ----

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def server(pair):
    from test_serve import ServerThread

    from multispec.serve import ServeSettings, create_app

    s = ServerThread(create_app(pair, ServeSettings(model_name="tiny", method="sd", method_options={"k": 3},
                                                    chat_template=TEMPLATE)))
    yield s
    s.close()


@pytest.fixture(scope="module")
def plain_server(pair):
    from test_serve import ServerThread

    from multispec.serve import ServeSettings, create_app

    s = ServerThread(create_app(pair, ServeSettings(model_name="tiny", method="ar", chat_template=NO_TOOLS)))
    yield s
    s.close()


def test_the_client_gets_required_calls(server, pair):
    r = server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                              max_tokens=100, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for c in choice.message.tool_calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    lib = generate(pair, messages=MESSAGES, chat_template=TEMPLATE, tools=TOOLS, tool_choice="required",
                   method="ar", max_new_tokens=100, temperature=0)
    assert [c.function.model_dump() for c in choice.message.tool_calls] == [c["function"] for c in lib.tool_calls]


def test_the_client_streams_tool_call_deltas(server):
    choice = {"type": "function", "function": {"name": "add"}}
    kwargs = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=100, temperature=0)
    whole = server.client.chat.completions.create(**kwargs).choices[0]
    calls, finish, _ = _streamed(server, **kwargs)
    assert finish == "tool_calls" == whole.finish_reason
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls)


def _streamed(server, **kwargs) -> tuple[list[dict], str | None, list]:
    """The calls a stream adds up to (id, name, arguments), its finish_reason, each call's argument pieces."""
    calls: dict[int, dict] = {}
    pieces: dict[int, list] = {}
    finish = None
    for chunk in server.client.chat.completions.create(stream=True, **kwargs):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
                c["arguments"] += d.function.arguments or ""
                pieces.setdefault(d.index, []).append(d.function.arguments or "")
            finish = ch.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, [pieces[i] for i in sorted(pieces)]


def test_streamed_arguments_come_as_they_are_written_and_add_up(server):
    for seed in range(3):  # the same seed streamed and not: the same calls
        kwargs = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=100,
                      temperature=1.0, seed=seed)
        whole = server.client.chat.completions.create(**kwargs).choices[0]
        calls, finish, pieces = _streamed(server, **kwargs)
        assert finish == whole.finish_reason
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        assert all(len([p for p in ps if p]) > 1 for ps in pieces), pieces  # not one burst at the end
    cut = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {
        "name": "get_weather"}}, max_tokens=60, temperature=0)
    whole = server.client.chat.completions.create(**cut).choices[0]
    calls, finish, _ = _streamed(server, **cut)
    assert finish == whole.finish_reason == "length"  # the limit cut the call: its arguments as far as written
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_streamed_calls_keep_every_token_s_logprobs(server):
    kwargs = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=40,
                  temperature=0, logprobs=True)
    whole = server.client.chat.completions.create(**kwargs)
    chunks = list(server.client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                        **kwargs))
    streamed = [e.logprob for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
    assert streamed == [e.logprob for e in whole.choices[0].logprobs.content]
    assert len(streamed) == chunks[-1].usage.completion_tokens


def test_a_tool_conversation_goes_through_the_client(server):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": true}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "2"}]
    r = server.client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=5,
                                              temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    none = server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                                 max_tokens=5, temperature=0)
    assert none.choices[0].message.tool_calls is None and isinstance(none.choices[0].message.content, str)


def _status(server, body):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 5, **body},
                   timeout=60)
    return r.status_code, r.json()


@pytest.mark.parametrize("body,param", [
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools.0.function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
     "tools.0.function.parameters"),
    ({"tools": "all"}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": MESSAGES + [{"role": "tool", "content": "2"}]}, "messages"),
])
def test_bad_tool_requests_are_400_naming_the_field(server, body, param):
    status, out = _status(server, body)
    assert status == 400 and out["error"]["param"] == param, out


def test_a_template_without_tools_is_refused_naming_the_model(plain_server):
    status, out = _status(plain_server, {"tools": TOOLS})
    assert status == 400 and out["error"]["param"] == "tools" and "tiny" in out["error"]["message"]
    assert "--chat-template" in out["error"]["message"]
    assert _status(plain_server, {})[0] == 200  # without tools the template is fine


# ---- a real tool model ----

@pytest.mark.slow
def test_qwen_coder_makes_a_required_call_through_the_client():
    import real_models

    from test_serve import ServerThread

    from multispec.serve import ServeSettings, create_app

    qwen = real_models.qwen_coder_small()
    s = ServerThread(create_app(qwen, ServeSettings(model_name="qwen", method="lookup")))
    ask = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    try:
        r = s.client.chat.completions.create(model="qwen", messages=ask, tools=TOOLS, tool_choice="required",
                                             max_tokens=100, temperature=0)
        streamed = list(s.client.chat.completions.create(model="qwen", messages=ask, tools=TOOLS, tool_choice=named,
                                                         max_tokens=100, temperature=0, stream=True))
    finally:
        s.close()
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) >= 1, choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    for c in choice.message.tool_calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    deltas = [d for chunk in streamed for ch in chunk.choices for d in ch.delta.tool_calls or []]
    assert deltas[0].function.name == "get_weather" and {d.index for d in deltas} == {0}
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


# ---- the CLI ----

def test_chat_cli_shows_the_calls(dirs, tmp_path):
    from click.testing import CliRunner

    from multispec.cli import cli

    (tmp_path / "t.jinja").write_text(TEMPLATE)
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    args = ["chat", "--target", str(dirs["target"]), "--draft", str(dirs["draft"]), "--chat-template",
            str(tmp_path / "t.jinja"), "--tools", str(tmp_path / "tools.json"), "--max-new-tokens", "100",
            "--temperature", "0", "--method", "sd"]
    r = CliRunner().invoke(cli, args + ["--tool-choice", "add"], input="def f(x):\n")
    assert r.exit_code == 0, r.output
    assert "[tool call call_" in r.stderr and "add({" in r.stderr, r.stderr
    bad = CliRunner().invoke(cli, args + ["--tool-choice", "nowhere"], input="")
    assert isinstance(bad.exception, MultispecError) and "not among the tools" in str(bad.exception)


@pytest.mark.slow
def test_smollm2_calls_through_the_shipped_template_under_every_method():
    import real_models

    from multispec import load_pair

    path = real_models.smollm2()
    smol = load_pair(target=str(path), device="cpu")
    ask = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    with pytest.raises(MultispecError, match=f"{path.name}.* has no tool support.*--chat-template"):
        generate(smol, messages=ask, tools=TOOLS, max_new_tokens=4)
    template = open(HERMES_TEMPLATE).read()
    choice = {"type": "function", "function": {"name": "get_weather"}}
    outs = {m: generate(smol, messages=ask, chat_template=template, tools=TOOLS, tool_choice=choice, method=m,
                        max_new_tokens=40, temperature=0, **({"head": "shipped"} if m == "eagle" else {}))
            for m in ("ar", "lookup", "suffix", "eagle", "auto")}
    assert all(r.token_ids == outs["ar"].token_ids for r in outs.values())
    assert outs["ar"].finish_reason == "stop" and len(valid_calls(outs["ar"], {"get_weather"})) == 1
