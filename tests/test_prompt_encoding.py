"""Prompt encoding follows the tokenizer (issue 27): a str prompt is encoded as `tokenizer(prompt)` encodes it (the
special tokens its post-processor adds, vLLM's add_special_tokens=True), so `multispec generate` continues the
prompt that the user's own transformers code would (`model.generate(**tokenizer(prompt))`)."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import run_cli, save_tiny_pair
from multispec.loading import DEFAULT_PAIR_DIR
from multispec.text import encode_prompt

PROMPT = "def f(x): return x"


@pytest.fixture(scope="module", params=[True, False], ids=["bos-adding", "no-bos"])
def pair_dir(request, tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"), bos=request.param), request.param


def test_encoding_is_the_tokenizers_own(pair_dir):
    paths, bos = pair_dir
    tok = AutoTokenizer.from_pretrained(paths["target"])
    ids = encode_prompt(tok, 10_000, PROMPT)
    assert ids == tok(PROMPT)["input_ids"]
    assert (ids[0] == tok.bos_token_id) == bos  # the BOS is there exactly when the tokenizer adds it


@pytest.mark.parametrize("method", ["ar", "sd", "auto"])
def test_cli_generate_equals_transformers_generate(pair_dir, method, capsys):
    paths, _ = pair_dir
    tok = AutoTokenizer.from_pretrained(paths["target"])
    model = AutoModelForCausalLM.from_pretrained(paths["target"]).float().eval()
    enc = tok(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    expected = out[0, enc["input_ids"].shape[1]:].tolist()
    code, stdout, err = run_cli(capsys, "generate", PROMPT, "--target", str(paths["target"]), "--draft",
                                str(paths["draft"]), "--method", method, "--temperature", "0",
                                "--max-new-tokens", "12", "--json")
    assert code == 0, err
    got = json.loads(stdout)
    assert got["token_ids"] == expected
    assert got["prompt_tokens"] == enc["input_ids"].shape[1]


def test_default_pair_tokenizer_adds_its_bos():
    """The embedded pair's tokenizer puts <|endoftext|> first itself (re-exported with the zoo's post-processor),
    so following the tokenizer keeps the BOS the default pair was trained after."""
    tok = AutoTokenizer.from_pretrained(DEFAULT_PAIR_DIR / "target")
    ids = tok(PROMPT)["input_ids"]
    assert ids[0] == tok.bos_token_id == 0
    assert ids[1:] == tok(PROMPT, add_special_tokens=False)["input_ids"]
