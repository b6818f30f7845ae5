"""Context limits (checked up front, with a message) and stop strings (streamed text == final text, nothing past a
stop ever shown, token ids cut consistently)."""
import pytest
import torch

import multispec
from engine_utils import greedy_reference
from helpers import save_tiny_pair, tiny_llama
from multispec import MultispecError
from multispec.api import Pair
from multispec.cli import main

POSITIONS = 256  # tiny_llama's max_position_embeddings


class IdTokenizer:
    """Decodes id i to the letter chr(97 + i % 26) (one character per token): enough for id prompts and stops."""

    bos_token_id = None
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, seed=0, scale=3.0)
    draft = tiny_llama(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, seed=1, scale=3.0)
    return Pair(target=target, draft=draft, tokenizer=IdTokenizer(), target_path="t", draft_path="d")


# ----------------------------------------------------------------------------------- context
def test_prompt_longer_than_the_positions_is_refused(tiny):
    with pytest.raises(MultispecError, match=f"the prompt has {POSITIONS + 44} tokens but the model has {POSITIONS}"):
        multispec.generate(tiny, [1] * (POSITIONS + 44), method="sd", max_new_tokens=4, temperature=0.0)
    with pytest.raises(MultispecError, match="positions"):
        multispec.generate(tiny, [1] * POSITIONS, method="ar", max_new_tokens=1, temperature=0.0)


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_prompt_plus_new_tokens_past_the_positions_is_capped_with_a_warning(tiny, backend):
    prompt = [3] * (POSITIONS - 6)
    r = multispec.generate(tiny, prompt, method="sd", k=4, max_new_tokens=100_000, temperature=0.0, backend=backend)
    assert len(r.token_ids) == 6 and r.finish_reason == "length" and r.stats["max_new_tokens"] == 6
    assert len(r.stats["warnings"]) == 1 and "capped from 100000 to 6" in r.stats["warnings"][0]
    assert r.token_ids == greedy_reference(tiny.target, prompt, 6)  # right output, not garbage past the limit


def test_the_smaller_of_target_and_draft_positions_is_the_limit():
    target = tiny_llama(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, seed=0)
    draft = tiny_llama(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, seed=1)
    draft.config.max_position_embeddings = 64
    pair = Pair(target=target, draft=draft, tokenizer=IdTokenizer(), target_path="t", draft_path="d")
    r = multispec.generate(pair, [1] * 60, method="sd", max_new_tokens=10, temperature=0.0)
    assert len(r.token_ids) == 4 and "64 positions" in r.stats["warnings"][0]
    r = multispec.generate(pair, [1] * 60, method="ar", max_new_tokens=10, temperature=0.0)  # ar runs no draft
    assert len(r.token_ids) == 10 and r.stats["warnings"] == []


def test_fast_backend_cache_is_sized_to_the_run():
    """A run longer than the fast backend's old fixed 4,096-row cache completes, equal to the hf backend."""
    target = tiny_llama(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, seed=0, scale=3.0)
    draft = tiny_llama(vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, seed=1, scale=3.0)
    for m in (target, draft):
        m.config.max_position_embeddings = 8192
    pair = Pair(target=target, draft=draft, tokenizer=IdTokenizer(), target_path="t", draft_path="d")
    prompt = [int(t) for t in torch.randint(0, 16, (4090,), generator=torch.Generator().manual_seed(0))]
    fast = multispec.generate(pair, prompt, method="sd", k=3, max_new_tokens=12, temperature=0.0, backend="fast")
    hf = multispec.generate(pair, prompt, method="sd", k=3, max_new_tokens=12, temperature=0.0, backend="hf")
    assert fast.token_ids == hf.token_ids and len(fast.token_ids) == 12


def test_cli_prints_the_cap_warning(capsys, tmp_path):
    dirs = save_tiny_pair(tmp_path)
    try:
        main(["generate", "def f(x):", "--target", str(dirs["target"]), "--draft", str(dirs["draft"]),
              "--max-new-tokens", "100000", "--temperature", "0", "--threads", "1"])
    except SystemExit as e:
        assert e.code in (0, None)
    err = capsys.readouterr().err
    assert "warning: max_new_tokens capped from 100000 to" in err and "256 positions" in err


# ----------------------------------------------------------------------------------- stop strings
METHODS = [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 1)}), ("ti-mcsd", {"tree": (1, 2, 1)}),
           ("dynamic", {"width": 2, "depth": 3})]


def _stop_inside(text: str) -> str:
    """A stop string taken from the middle of text, so the run must cut there."""
    return text[len(text) // 2: len(text) // 2 + 2]


@pytest.mark.parametrize("method,options", METHODS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_streamed_text_equals_final_text_and_never_passes_the_stop(tiny, method, options, temperature):
    prompt = [1, 2, 3]
    free = multispec.generate(tiny, prompt, method=method, max_new_tokens=30, temperature=temperature, seed=4,
                              **options)
    stop = _stop_inside(free.text)
    pieces = []
    r = multispec.generate(tiny, prompt, method=method, max_new_tokens=30, temperature=temperature, seed=4,
                           stop=stop, stream=pieces.append, **options)
    assert "".join(pieces) == r.text == free.text[:free.text.find(stop)]
    assert all(stop not in "".join(pieces[:i + 1]) for i in range(len(pieces)))
    assert r.finish_reason == "stop"
    assert IdTokenizer().decode(r.token_ids) == r.text  # one character per token: the ids end where the text does


@pytest.mark.parametrize("method,options", METHODS[:3])
def test_streaming_without_stops_adds_up_to_the_text(tiny, method, options):
    pieces = []
    r = multispec.generate(tiny, [5, 6], method=method, max_new_tokens=25, temperature=1.0, seed=2,
                           stream=pieces.append, **options)
    assert "".join(pieces) == r.text and len(r.token_ids) == 25


def test_stop_as_str_is_one_string_not_its_characters(tiny):
    free = multispec.generate(tiny, [1, 2, 3], method="sd", max_new_tokens=30, temperature=1.0, seed=9)
    stop = _stop_inside(free.text)
    as_str = multispec.generate(tiny, [1, 2, 3], method="sd", max_new_tokens=30, temperature=1.0, seed=9, stop=stop)
    as_list = multispec.generate(tiny, [1, 2, 3], method="sd", max_new_tokens=30, temperature=1.0, seed=9,
                                 stop=[stop])
    assert as_str.text == as_list.text == free.text[:free.text.find(stop)]
    assert as_str.token_ids == as_list.token_ids


def test_token_ids_stop_where_the_text_stops_with_multi_character_tokens(tmp_path):
    """A real BPE tokenizer: tokens span several characters, and the kept ids decode to a prefix of the text
    (the straddling token, if any, is dropped), never to text past the stop."""
    dirs = save_tiny_pair(tmp_path)
    pair = multispec.load_pair(target=str(dirs["target"]), draft=str(dirs["draft"]))
    free = multispec.generate(pair, "def f(x):", method="sd", max_new_tokens=30, temperature=1.0, seed=0)
    stop = _stop_inside(free.text)
    pieces = []
    r = multispec.generate(pair, "def f(x):", method="sd", max_new_tokens=30, temperature=1.0, seed=0, stop=stop,
                           stream=pieces.append)
    kept = pair.tokenizer.decode(r.token_ids, skip_special_tokens=True)
    assert r.text == free.text[:free.text.find(stop)] == "".join(pieces)
    assert r.text.startswith(kept) and stop not in kept
    assert len(r.token_ids) <= len(free.token_ids) and r.token_ids == free.token_ids[:len(r.token_ids)]


def test_cli_stream_with_stop_prints_only_the_final_text(capsys, tmp_path):
    dirs = save_tiny_pair(tmp_path)
    base = ["generate", "def f(x):", "--target", str(dirs["target"]), "--draft", str(dirs["draft"]),
            "--method", "sd", "--temperature", "1", "--seed", "0", "--max-new-tokens", "30", "--threads", "1"]
    main(base + ["--json"])
    import json

    text = json.loads(capsys.readouterr().out)["text"]
    stop = _stop_inside(text)
    main(base + ["--stream", "--stop", stop])
    out = capsys.readouterr().out
    assert out == "def f(x):" + text[:text.find(stop)] + "\n"
