"""Logprobs (issue 27): each committed token's log-probability and top alternatives come from the verification
forward that committed it, and equal log_softmax of the target's own full forward over prompt + output (fp32,
within 1e-4) for every method, including tokens accepted deep in a tree; processed mode equals the processed law;
prompt logprobs equal the prefill's rows."""
from __future__ import annotations

import pytest
import torch

from helpers import save_tiny_pair
from multispec import load_pair
from multispec.decoding.decoder import Decoder
from multispec.errors import MultispecError
from multispec.sampling import History, SamplingConfig, process_logits

PROMPT = "def f(x): return x"
METHODS = [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 2)}), ("ti-mcsd", {"tree": (2, 2, 1)}),
           ("dynamic", {"width": 2, "depth": 3}), ("lookup", {}), ("suffix", {}), ("auto", {})]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The draft is the target itself: every draft is accepted, so tokens are committed from deep tree nodes."""
    paths = save_tiny_pair(tmp_path_factory.mktemp("lp_pair"))
    return load_pair(target=str(paths["target"]), draft=str(paths["target"]), device="cpu")


def full_logits(pair, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return pair.target(input_ids=torch.tensor([ids])).logits[0].float()  # [L, V]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method,options", METHODS, ids=[m for m, _ in METHODS])
def test_logprobs_equal_the_targets_full_forward(pair, method, options, temperature):
    decoder = Decoder(pair, method, **options)
    result = decoder.generate(PROMPT, max_new_tokens=24, temperature=temperature, seed=3, logprobs=5,
                              prompt_logprobs=True)
    prompt = pair.tokenizer(PROMPT)["input_ids"]
    ids = prompt + result.token_ids
    ref = torch.log_softmax(full_logits(pair, ids), -1)
    assert len(result.logprobs) == len(result.token_ids) > 0
    for i, lp in enumerate(result.logprobs):
        row = ref[len(prompt) - 1 + i]
        assert lp.token_id == result.token_ids[i]
        assert abs(lp.logprob - float(row[lp.token_id])) < 1e-4
        top = row.topk(5)
        assert [t for t, _ in lp.top] == top.indices.tolist() or \
            max(abs(v - float(row[t])) for t, v in lp.top) < 1e-4  # ties may order differently
        assert max(abs(v - w) for (_, v), w in zip(lp.top, top.values.tolist())) < 1e-4
    assert result.prompt_logprobs[0] is None and len(result.prompt_logprobs) == len(prompt)
    for i, lp in enumerate(result.prompt_logprobs[1:], 1):
        assert lp.token_id == prompt[i] and abs(lp.logprob - float(ref[i - 1, prompt[i]])) < 1e-4
    if method == "mcsd" and temperature == 0:  # the claim covers tokens accepted at depth 3 of a tree
        assert result.stats["accepted_per_position"][2] > 0


@pytest.mark.parametrize("method,options", [("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 2)}),
                                            ("ti-mcsd", {"tree": (2, 2, 1)})], ids=["sd", "mcsd", "ti-mcsd"])
def test_processed_logprobs_are_the_processed_law(pair, method, options):
    kw = dict(temperature=0.9, top_k=8, repetition_penalty=1.3, frequency_penalty=0.4)
    result = Decoder(pair, method, **options).generate(PROMPT, max_new_tokens=20, seed=5, logprobs=3,
                                                       logprobs_mode="processed", **kw)
    prompt = pair.tokenizer(PROMPT)["input_ids"]
    logits = full_logits(pair, prompt + result.token_ids)
    sampling = SamplingConfig(**kw)
    v = logits.shape[-1]
    for i, lp in enumerate(result.logprobs):
        out = result.token_ids[:i]
        history = History(seen=torch.tensor([[t in prompt + out for t in range(v)]]),
                          counts=torch.tensor([[float(out.count(t)) for t in range(v)]]),
                          out_len=torch.tensor([len(out)]))
        p = process_logits(logits[len(prompt) - 1 + i][None], sampling, history)[0]
        assert abs(lp.logprob - float(p[lp.token_id].log())) < 1e-4
    assert result.stats["logprobs_mode"] == "processed"


def test_prompt_logprobs_with_no_new_tokens(pair):
    result = Decoder(pair, "sd").generate(PROMPT, max_new_tokens=0, prompt_logprobs=True, logprobs=2)
    assert result.token_ids == [] and result.logprobs == []
    prompt = pair.tokenizer(PROMPT)["input_ids"]
    ref = torch.log_softmax(full_logits(pair, prompt), -1)
    assert [round(x.logprob, 4) for x in result.prompt_logprobs[1:]] == \
        [round(float(ref[i - 1, prompt[i]]), 4) for i in range(1, len(prompt))]
    with pytest.raises(MultispecError, match="max_new_tokens must be an integer >= 1"):
        Decoder(pair, "sd").generate(PROMPT, max_new_tokens=0)


@pytest.mark.parametrize("bad,needle", [({"logprobs": 21}, "logprobs must be an integer in [0, 20]"),
                                        ({"logprobs": 1, "logprobs_mode": "raw_logits"}, "logprobs_mode")])
def test_bad_logprob_settings_are_refused(pair, bad, needle):
    with pytest.raises(MultispecError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        Decoder(pair, "ar").generate(PROMPT, max_new_tokens=2, **bad)


def test_a_batch_gives_each_sequence_its_own_logprobs_and_penalties(pair):
    """Lanes of a batch (decoding/batch.py) carry the processors and logprobs like a lone run."""
    from multispec import generate

    prompts = [PROMPT, "for n in range(2):"]
    kw = dict(method="sd", k=3, max_new_tokens=12, temperature=0, logprobs=2, repetition_penalty=1.4,
              ignore_eos=True)
    batch = generate(pair, prompts, backend="fast", **kw)
    for prompt, result in zip(prompts, batch):
        alone = generate(pair, prompt, backend="fast", **kw)
        assert result.token_ids == alone.token_ids
        ids = pair.tokenizer(prompt)["input_ids"]
        ref = torch.log_softmax(full_logits(pair, ids + result.token_ids), -1)
        assert max(abs(lp.logprob - float(ref[len(ids) - 1 + i, lp.token_id]))
                   for i, lp in enumerate(result.logprobs)) < 1e-4


def test_specdecpp_logprobs_on_the_default_pair():
    """specdecpp needs its trained acceptance head: the embedded default pair ships one."""
    pair = load_pair(device="cpu", dtype="float32")
    result = Decoder(pair, "specdecpp").generate(PROMPT, max_new_tokens=24, temperature=0, logprobs=3)
    prompt = pair.tokenizer(PROMPT)["input_ids"]
    ref = torch.log_softmax(full_logits(pair, prompt + result.token_ids), -1)
    assert result.stats["num_accepted_draft_tokens"] > 0
    assert max(abs(lp.logprob - float(ref[len(prompt) - 1 + i, lp.token_id]))
               for i, lp in enumerate(result.logprobs)) < 1e-4


def test_the_prompt_alone_may_fill_every_position(pair):
    """Scoring a prompt (max_new_tokens 0, prompt_logprobs) needs no position after it: a prompt as long as the
    context is scored; one token more, or any new token, is refused in one line."""
    from multispec.decoding.decoder import Decoder
    from multispec.errors import MultispecError

    d = Decoder(pair, "ar")
    ids = [3] * d.context
    r = d.generate(ids, max_new_tokens=0, prompt_logprobs=True)
    assert len(r.prompt_logprobs) == d.context and r.token_ids == []
    for bad in (dict(prompt=ids + [3], max_new_tokens=0, prompt_logprobs=True), dict(prompt=ids, max_new_tokens=1)):
        with pytest.raises(MultispecError, match="positions"):
            d.generate(bad.pop("prompt"), **bad)
