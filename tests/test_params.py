"""The request object: SamplingParams is validated once, names the bad field, and is what the API, the Decoder,
batches and the server take (the CLI builds one before loading: test_bad_input)."""
import pytest

from multispec import MultispecError, generate
from multispec.decoding.batch_offline import generate_batch
from multispec.decoding.decoder import Decoder
from multispec.params import FIELDS, ParamError, SamplingParams

BAD = [  # (field, value, words of the message)
    ("max_new_tokens", 0, ">= 1"), ("max_new_tokens", 1.5, "integer"), ("temperature", -1, ">= 0"),
    ("temperature", "hot", "number"), ("top_k", -2, "top_k"), ("top_p", 0.0, "(0, 1]"), ("top_p", 1.5, "(0, 1]"),
    ("min_p", 2.0, "[0, 1]"), ("repetition_penalty", 0.0, "> 0"), ("presence_penalty", 3.0, "[-2, 2]"),
    ("frequency_penalty", -2.5, "[-2, 2]"), ("logit_bias", {1: 101}, "[-100, 100]"), ("logit_bias", [1], "mapping"),
    ("logit_bias", {-1: 1}, ">= 0"), ("min_tokens", -1, "min_tokens"), ("seed", -1, "[0, 2**63)"),
    ("seed", 2**63, "[0, 2**63)"), ("seed", 1.0, "integer"), ("stop", "", "empty"), ("stop", [3], "strings"),
    ("stop_token_ids", 5, "list"), ("stop_token_ids", [-1], ">= 0"), ("ignore_eos", 1, "True or False"),
    ("logprobs", 21, "[0, 20]"), ("prompt_logprobs", "yes", "True or False"), ("logprobs_mode", "log", "raw"),
    ("reproducible", "yes", "True, False or None"), ("json_schema", 3, "JSON object"), ("regex", "(", "regex"),
    ("choice", "yes", "list"), ("grammar", "start: x", "unknown name"),
]


@pytest.mark.parametrize("name,value,words", BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_a_bad_setting_names_its_field(name, value, words):
    with pytest.raises(ParamError) as e:
        SamplingParams(**{name: value})
    assert e.value.param == name and words in str(e.value)
    assert "\n" not in str(e.value)


def test_every_field_is_checked_and_normalised():
    assert {n for n, _, _ in BAD} == FIELDS  # a new field gets a bad-value case here
    p = SamplingParams(stop="\n", logit_bias={"7": -100, 3: 1}, stop_token_ids=[4], top_k=-1)
    assert p.stop == ("\n",) and p.logit_bias == ((3, 1.0), (7, -100.0)) and p.stop_token_ids == (4,)
    assert SamplingParams(max_new_tokens=0, prompt_logprobs=True).max_new_tokens == 0
    with pytest.raises(ParamError, match=r"min_tokens \(9\) must be at most max_new_tokens \(8\)"):
        SamplingParams(max_new_tokens=8, min_tokens=9)
    assert p.replace(seed=3).seed == 3 and p.seed is None
    with pytest.raises(ParamError):
        p.replace(top_p=7)


def test_params_or_keywords_not_both(pair):
    p = SamplingParams(max_new_tokens=4, temperature=0)
    with pytest.raises(MultispecError, match="not both"):
        generate(pair, "a", params=p, temperature=1.0)
    with pytest.raises(MultispecError, match="not both"):
        Decoder(pair, "ar").generate("a", p, top_k=3)
    with pytest.raises(ParamError, match="has no setting 'max_tokens'; did you mean max_new_tokens?"):
        Decoder(pair, "ar").generate("a", max_tokens=3)
    with pytest.raises(ParamError, match="did you mean temperature"):
        SamplingParams(temperture=0.5)


def test_the_model_checks_come_before_any_forward(pair):
    decoder = Decoder(pair, "sd")
    vocab = decoder.vocab_size
    for params in (SamplingParams(logit_bias={vocab: 1.0}), SamplingParams(stop_token_ids=[vocab])):
        with pytest.raises(MultispecError, match=rf"in \[0, {vocab}\)"):
            decoder.generate("a", params)
    assert decoder._target is None  # no backend was built: nothing ran


@pytest.mark.parametrize("method", ["ar", "sd", "auto"])
def test_one_request_object_gives_what_the_keywords_give(pair, method):
    settings = dict(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=4, stop=["\n\n"], repetition_penalty=1.1)
    params = SamplingParams(**settings)
    by_keywords = generate(pair, "def f(x):", method=method, **settings)
    by_params = generate(pair, "def f(x):", method=method, params=params)
    by_decoder = Decoder(pair, method).generate("def f(x):", params)
    assert by_keywords.token_ids == by_params.token_ids == by_decoder.token_ids
    batch = generate_batch(Decoder(pair, method), ["def f(x):", "x = 1"], params)
    assert [r.stats["seed"] for r in batch] == [4, 5]  # prompt i: seed + i
    assert batch[0].token_ids == by_params.token_ids
