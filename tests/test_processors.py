"""Sampling processors through the Decoder (issue 27): greedy with a repetition penalty equals transformers' own
`generate(repetition_penalty=...)` under every method (trees included); min_tokens, ignore_eos, stop_token_ids and
logit_bias do what OpenAI and vLLM say."""
from __future__ import annotations

import pytest
import torch

from helpers import save_tiny_pair
from multispec import load_pair
from multispec.decoding.decoder import Decoder
from multispec.errors import MultispecError

PROMPT = "def f(x): return x"
METHODS = [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (3, 2, 2)}), ("ti-mcsd", {"tree": (2, 2, 1)}),
           ("lookup", {}), ("auto", {})]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    paths = save_tiny_pair(tmp_path_factory.mktemp("proc_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


@pytest.mark.parametrize("method,options", METHODS, ids=[m for m, _ in METHODS])
def test_greedy_repetition_penalty_equals_transformers(pair, method, options):
    enc = pair.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = pair.target.generate(**enc, max_new_tokens=30, do_sample=False, repetition_penalty=1.6,
                                   eos_token_id=None, pad_token_id=0)
    expected = out[0, enc["input_ids"].shape[1]:].tolist()
    plain = Decoder(pair, method, **options).generate(PROMPT, max_new_tokens=30, temperature=0, ignore_eos=True)
    got = Decoder(pair, method, **options).generate(PROMPT, max_new_tokens=30, temperature=0, ignore_eos=True,
                                                    repetition_penalty=1.6)
    assert got.token_ids == expected
    assert plain.token_ids != expected  # the penalty changes this output: the check above is not vacuous


def test_min_tokens_ignore_eos_and_stop_token_ids(pair):
    d = Decoder(pair, "sd", k=3)
    forced = {0: 100}  # logit_bias makes EOS (id 0) the only likely token
    assert d.generate(PROMPT, max_new_tokens=8, temperature=0, logit_bias=forced).token_ids == [0]
    held = d.generate(PROMPT, max_new_tokens=8, temperature=0, logit_bias=forced, min_tokens=5)
    assert len(held.token_ids) == 6 and held.token_ids[-1] == 0 and 0 not in held.token_ids[:5]
    assert d.generate(PROMPT, max_new_tokens=8, temperature=0, logit_bias=forced, ignore_eos=True).token_ids == \
        [0] * 8
    free = d.generate(PROMPT, max_new_tokens=12, temperature=0, ignore_eos=True).token_ids
    stop_at = free[4]
    cut = d.generate(PROMPT, max_new_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=[stop_at])
    assert cut.token_ids == free[:free.index(stop_at) + 1] and cut.finish_reason == "stop"


@pytest.mark.parametrize("bad,needle", [
    ({"repetition_penalty": 0}, "repetition_penalty must be a number > 0"),
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2]"),
    ({"frequency_penalty": "1"}, "frequency_penalty must be a number"),
    ({"min_p": 1.5}, "min_p must be in [0, 1]"),
    ({"logit_bias": {"5": 101}}, "logit_bias values must be in [-100, 100]"),
    ({"logit_bias": {"999999": 1}}, "logit_bias token ids must be in"),
    ({"logit_bias": [1, 2]}, "logit_bias must be a mapping"),
    ({"min_tokens": 9}, "min_tokens (9) must be at most max_new_tokens (4)"),
    ({"min_tokens": -1}, "min_tokens must be an integer >= 0"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids must be token ids in"),
    ({"ignore_eos": 1}, "ignore_eos must be True or False"),
])
def test_bad_processor_settings_are_one_line_errors(pair, bad, needle):
    with pytest.raises(MultispecError) as e:
        Decoder(pair, "ar").generate(PROMPT, max_new_tokens=4, **bad)
    assert needle in str(e.value) and "\n" not in str(e.value)
