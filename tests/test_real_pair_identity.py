"""The real pair (Qwen2.5-Coder-1.5B-Instruct, its 0.5B sibling as the draft) at int8: every lossless method with a
draft or a proposer of its own gives the int8 target's own `ar` output on the fast backend, on one HumanEval prompt
through the chat template. The wide check is benchmarks/real_pair/identity.py. The pair comes from
scripts/fetch_models.py (CI does not fetch it): the test skips, saying why, without it or without the HumanEval file.
Loading the int8 pair takes minutes the first time (quantized as the files are read, ~4.5 GB), seconds after."""
from __future__ import annotations

import pytest

import multispec
import real_models
from helpers import DATA

pytestmark = pytest.mark.slow
MAX_NEW = 24
METHODS = [("sd", {"k": 4}), ("mcsd", {}), ("lookup", {}), ("suffix", {}), ("auto", {})]
HUMANEVAL_ASK = "Complete the following Python function:\n\n```python\n{prompt}\n```"  # as benchmarks/real_pair


def humaneval_first() -> str:
    from multispec.data import FILES, load_prompts

    if not (DATA / FILES["humaneval"]).is_file():
        pytest.skip(f"HumanEval ({FILES['humaneval']}) is not in {DATA}; set MULTISPEC_DATA to its folder")
    return load_prompts("humaneval", DATA, limit=1)[0].text


@pytest.fixture(scope="module")
def int8_case():
    target, draft = real_models.qwen_coder()
    pair = multispec.load_pair(target=str(target), draft=str(draft), device="cpu", dtype="int8")
    messages = [{"role": "user", "content": HUMANEVAL_ASK.format(prompt=humaneval_first())}]
    ids = list(pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
    expected = multispec.generate(pair, ids, method="ar", backend="fast", max_new_tokens=MAX_NEW,
                                  temperature=0).token_ids
    assert len(expected) == MAX_NEW
    return pair, ids, expected


@pytest.mark.parametrize("method,options", METHODS, ids=[m for m, _ in METHODS])
def test_int8_pair_methods_equal_int8_ar(int8_case, method, options):
    pair, ids, expected = int8_case
    got = multispec.generate(pair, ids, method=method, backend="fast", max_new_tokens=MAX_NEW, temperature=0,
                             **options)
    assert got.token_ids == expected, method
