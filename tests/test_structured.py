"""Structured output through `generate` (issue 39): the sampled law at T = 1 (chi-square), greedy identity across
methods against an independent constrained argmax, and bad constraints refused before any model runs. The exact law
per verifier is tests/test_structured_exact.py; the server's fields are tests/test_serve_structured.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import multispec
from engine_utils import chi_square_pvalue, tiny_pair
from multispec.errors import MultispecError
from multispec.loading import Pair
from multispec.params import ParamError, SamplingParams
from test_structured_exact import EOS, LANGUAGE, REGEX, WORDS, tiny_tokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "kind": {"enum": ["a", "b"]}},
          "required": ["name", "n", "kind"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny():
    """A V = 4 pair (a, b, c, EOS) with a byte-level tokenizer: REGEX's four strings are every possible output."""
    target, draft = tiny_pair(vocab=4, seed=3, noise=0.3)
    for m in (target, draft):
        m.generation_config.eos_token_id = EOS
    return Pair(target=target, draft=draft, tokenizer=tiny_tokenizer(), target_path="tiny-v4", draft_path="d")


def masked_string_law(model) -> dict[str, float]:
    """The target's law of each string of REGEX's language (then EOS), by full forwards and plain masking."""
    law = {}
    with torch.no_grad():
        for s in LANGUAGE:
            ids, prob = [0], 1.0
            for i, tok in enumerate([WORDS.index(ch) for ch in s] + [EOS]):
                text = s[:i]
                allowed = [any(w.startswith(text + ch) for w in LANGUAGE) for ch in WORDS] + [text in LANGUAGE]
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
                logits[~torch.tensor(allowed)] = float("-inf")
                prob *= float(torch.softmax(logits, -1)[tok])
                ids.append(tok)
            law[s] = prob
    return law


@pytest.mark.slow
@pytest.mark.parametrize("method,options", [("sd", {"k": 3}), ("mcsd", {"tree": "2,2"})])
def test_sampled_law_under_a_regex_is_the_masked_target_law(tiny, method, options):
    want = masked_string_law(tiny.target)
    decoder = multispec.Decoder(tiny, method, "hf", **options)
    counts = dict.fromkeys(LANGUAGE, 0)
    for seed in range(600):
        r = decoder.generate([0], max_new_tokens=6, temperature=1.0, seed=seed, regex=REGEX)
        assert r.finish_reason == "stop" and r.token_ids[-1] == EOS, r
        counts["".join(WORDS[t] for t in r.token_ids[:-1])] += 1
    probs = np.array([want[s] for s in LANGUAGE])
    assert abs(probs.sum() - 1) < 1e-9
    assert min(probs) > 0.02  # every outcome is seen: the check has power
    assert chi_square_pvalue(np.array([counts[s] for s in LANGUAGE]), probs) > 1e-3, (counts, want)


def constrained_greedy(pair, prompt_ids, constraint, n) -> list[int]:
    """The target's own greedy output under the constraint, by full forwards, the grammar advanced token by token
    (no trees, no forced-token shortcut)."""
    from multispec.loading import eos_ids, vocab_rows
    from multispec.structured import bind

    state = bind(constraint, pair.tokenizer, vocab_rows(pair.target), eos_ids(pair)).start()
    ids, out = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(n):
            logits = pair.target(input_ids=torch.tensor([ids])).logits[0, -1]
            tok = int(logits.masked_fill(~state.mask(logits.shape[-1]), float("-inf")).argmax())
            out.append(tok)
            ids.append(tok)
            if tok in eos_ids(pair):
                break
            state.commit([tok])
    return out


@pytest.fixture(scope="module")
def default_pair():
    return multispec.load_pair()


@pytest.mark.parametrize("kind,value", [("json_schema", SCHEMA), ("regex", r"(0|[1-9][0-9]{0,3})( [a-z]+){2}"),
                                        ("choice", ["return x", "return None", "pass"])])
def test_greedy_output_is_the_constrained_argmax_under_every_method(default_pair, kind, value):
    prompt = "def f(x):\n    "
    ids = default_pair.tokenizer(prompt)["input_ids"]
    want = constrained_greedy(default_pair, ids, SamplingParams(**{kind: value}).constraint, 48)
    for method in ("ar", "sd", "mcsd", "lookup", "suffix", "auto"):
        r = multispec.generate(default_pair, prompt, method=method, max_new_tokens=48, temperature=0,
                               **{kind: value})
        assert r.token_ids == want, (method, r.text)
        assert r.stats["structured"]["kind"] == kind
    if kind == "json_schema" and r.finish_reason == "stop":
        import jsonschema

        jsonschema.validate(json.loads(r.text), SCHEMA)
    if kind != "regex":  # the schema's keys and the choices' shared prefixes are forced: committed for free
        assert r.stats["structured"]["forced_tokens"] > 0


def test_a_grammar_that_cannot_end_in_time_finishes_with_length_and_says_so(default_pair):
    r = multispec.generate(default_pair, "x = ", method="sd", max_new_tokens=6, temperature=0,
                           regex="[a-z]{20}")
    assert r.finish_reason == "length" and r.stats["structured"]["complete"] is False
    assert any("incomplete under the regex" in w for w in r.stats["warnings"])


@pytest.mark.parametrize("kwargs,param,words", [
    ({"json_schema": {"type": "objec"}}, "json_schema", "Invalid type"),
    ({"json_schema": "{not json"}, "json_schema", "not valid JSON"),
    ({"regex": "a(b"}, "regex", "unclosed group"),
    ({"regex": ""}, "regex", "non-empty string"),
    ({"choice": []}, "choice", "non-empty list"),
    ({"choice": ["a", 3]}, "choice", "non-empty list"),
    ({"grammar": "start: x"}, "grammar", "unknown name"),
    ({"regex": "a", "choice": ["a"]}, "choice", "at most one"),
    ({"regex": "a", "ignore_eos": True}, "ignore_eos", "ends the output with EOS"),
    ({"regex": "a", "min_tokens": 2}, "min_tokens", "decides where the output ends"),
])
def test_bad_constraints_are_refused_in_one_line_naming_the_field(kwargs, param, words):
    with pytest.raises(ParamError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param and words in str(e.value) and "\n" not in str(e.value)


def test_bad_constraints_are_refused_by_generate_before_any_forward(tiny, monkeypatch):
    from multispec.decoding import engine

    monkeypatch.setattr(engine, "generate_ids", lambda *a, **k: pytest.fail("a model ran"))
    with pytest.raises(MultispecError, match="unclosed group"):
        multispec.generate(tiny, [0], method="sd", regex="a(b")


def test_batched_sequences_equal_their_batch_1_outputs_under_a_schema(default_pair):
    prompts = ["def f(x):\n    ", "import os\n", "class A:\n    ", "x = "]
    alone = [multispec.generate(default_pair, p, method="sd", backend="fast", max_new_tokens=40, temperature=0,
                                json_schema=SCHEMA).token_ids for p in prompts]
    batched = multispec.generate(default_pair, prompts, method="sd", batch_size=4, max_new_tokens=40, temperature=0,
                                 json_schema=SCHEMA)
    assert [r.token_ids for r in batched] == alone
    assert all(r.stats["structured"]["forced_tokens"] > 0 for r in batched)


def test_an_output_the_grammar_forces_whole_finishes_with_stop(default_pair):
    """Every token forced before the first round (one choice): committed without a target call, cut at its EOS, and
    finished by "stop" as any output that ends with EOS."""
    r = multispec.generate(default_pair, "x = ", method="ar", max_new_tokens=20, temperature=0,
                           choice=["yes please"])
    assert r.text == "yes please" and r.finish_reason == "stop"
    assert r.stats["target_calls"] == 0 and r.stats["structured"]["forced_fraction"] == 1.0
