"""train-head's data cache (`--cache DIR`, training/data_cache.py) and its `own:FILE` prompts: the target's own text
and the features are kept between runs; a rerun goes on generating at the next prompt, a `--resume` run trains on
what is there without generating or collecting again; a cache of another recipe is refused in one line. Broken
variant (the cache's own text ignored) caught. No timing: what ran is counted by spies."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from helpers import save_tiny_pair
from multispec.errors import MultispecError
from multispec.training import eagle, onpolicy
from multispec.training.data_cache import DataCache
from multispec.training.eagle import HeadTrainConfig, train_head

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    paths = save_tiny_pair(root)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return x + {i}\n"}) + "\n"
                               for i in range(6)) + json.dumps({"message": "add two numbers"}) + "\n")
    return {**paths, "prompts": prompts}


def _spies(monkeypatch) -> dict:
    """Counts: prompts continued by the target (own text) and chunks the target collected features of."""
    seen = {"continued": [], "collected": 0}
    continuations, collect = onpolicy.continuations, eagle.collect_features

    def continuing(model, prompts, **kw):
        seen["continued"].append([list(p) for p in prompts])
        return continuations(model, prompts, **kw)

    def collecting(target, chunks, batch, deadline, done=None):
        out = collect(target, chunks, batch, deadline, done)
        seen["collected"] += out.shape[0] - (0 if done is None else done.shape[0])
        return out

    monkeypatch.setattr(onpolicy, "continuations", continuing)
    monkeypatch.setattr(eagle, "collect_features", collecting)
    return seen


def _config(paths, tmp_path, **kw) -> HeadTrainConfig:
    kw = {"minutes": 0.15, **kw}
    return HeadTrainConfig(target=str(paths["target"]), out=str(tmp_path / "head"), cache=str(tmp_path / "cache"),
                           data=(f"own:{paths['prompts']}",), seq_len=16, batch=2, eval_every=1e9, **kw)


def _assert_cache_is_used(paths, tmp_path, monkeypatch) -> None:
    seen = _spies(monkeypatch)
    train_head(_config(paths, tmp_path), log=lambda s: None)
    cache = tmp_path / "cache"
    rows = (cache / "own-prompts.jsonl").read_text().splitlines()
    assert len(rows) == 7 and (cache / "features.pt").is_file()  # every prompt continued, features kept
    assert sum(len(b) for b in seen["continued"]) == 7 and seen["collected"] > 0
    # an interrupted generation: the last 3 rows never written; a rerun continues at prompt 4 (batch of 16: one)
    (cache / "own-prompts.jsonl").write_text("\n".join(rows[:4]) + "\n")
    seen["continued"].clear()
    train_head(_config(paths, tmp_path, overwrite=True), log=lambda s: None)
    assert sum(len(b) for b in seen["continued"]) == 3, "the rerun did not go on at the next prompt"
    assert len((cache / "own-prompts.jsonl").read_text().splitlines()) == 7
    # --resume: no own text generated, no feature collected: the budget trains
    seen["continued"].clear()
    seen["collected"] = 0
    resumed = train_head(_config(paths, tmp_path, resume=True), log=lambda s: None)
    assert seen["continued"] == [] and seen["collected"] == 0, seen
    assert resumed["train_tokens"] > 0 and resumed["step"] >= 0


@pytest.mark.parametrize("broken", [False, True])
def test_the_cache_keeps_own_text_and_features(paths, tmp_path, monkeypatch, broken):
    if broken:  # the cache's own text ignored: every run generates it all again
        monkeypatch.setattr(DataCache, "own_rows", lambda self, name: [])
        with pytest.raises(AssertionError):
            _assert_cache_is_used(paths, tmp_path, monkeypatch)
    else:
        _assert_cache_is_used(paths, tmp_path, monkeypatch)


def test_a_cache_of_another_recipe_and_bad_data_are_refused_in_one_line(paths, tmp_path):
    train_head(_config(paths, tmp_path, minutes=0.1), log=lambda s: None)
    bad = HeadTrainConfig(target=str(paths["target"]), out=str(tmp_path / "h2"), cache=str(tmp_path / "cache"),
                          data=(f"own:{paths['prompts']}",), minutes=0.1, seq_len=32, batch=2)
    with pytest.raises(MultispecError, match="holds data for another target or recipe") as e:
        train_head(bad, log=lambda s: None)
    assert "\n" not in str(e.value)
    for data, says in (("own:missing.jsonl", "file not found"), (f"own:{paths['target']}", "file not found")):
        with pytest.raises(MultispecError, match=says):
            HeadTrainConfig(target=str(paths["target"]), out=str(tmp_path / "h3"), data=(data,)).check()
    (tmp_path / "p.txt").write_text("x")
    with pytest.raises(MultispecError, match="own:FILE takes a .jsonl prompt file"):
        HeadTrainConfig(target=str(paths["target"]), out=str(tmp_path / "h3"), data=(f"own:{tmp_path / 'p.txt'}",)
                        ).check()


def test_own_file_prompts_are_encoded_as_the_bench_feeds_them(paths):
    """own:FILE: `prompt` rows as raw text (a HumanEval prompt), `message` rows through the chat template when the
    tokenizer has one (else raw)."""
    from multispec import load_pair
    from multispec.text import encode_prompt

    pair = load_pair(target=str(paths["target"]), device="cpu")
    ids = onpolicy.file_prompts(pair, str(paths["prompts"]), 64)
    assert len(ids) == 7
    v = pair.target.config.vocab_size
    assert ids[0] == encode_prompt(pair.tokenizer, v, "def f0(x):\n    return x + 0\n")[-64:]
    assert ids[6] == encode_prompt(pair.tokenizer, v, "add two numbers")[-64:]  # (no chat template here)


@pytest.mark.parametrize("broken", [False, True])
def test_a_resumed_head_is_replaced_only_by_a_better_one(paths, tmp_path, monkeypatch, broken):
    """--resume evaluates the saved head before its first step: a run that only makes it worse (lr 1.0) leaves it
    as it was. Broken variant (the first evaluation after the budget's first eval_every, as before) caught: the
    worse head is saved."""
    from multispec.models.eagle_io import load_head

    first = train_head(_config(paths, tmp_path, minutes=0.1), log=lambda s: None)
    pair_target = eagle_target(paths)
    before = load_head(tmp_path / "head", pair_target)[0].fc.weight.clone()
    if broken:
        real = eagle._loop
        monkeypatch.setattr(eagle, "_loop", lambda cfg, *a: real(replace(cfg, resume=False), *a))
    worse = train_head(_config(paths, tmp_path, minutes=0.1, resume=True, lr=1.0), log=lambda s: None)
    after = load_head(tmp_path / "head", pair_target)[0].fc.weight
    if broken:
        assert worse["alpha"] < first["alpha"] and not torch.equal(before, after)
    else:
        assert worse["step"] == 0 and worse["alpha"] >= first["alpha"] - 1e-3 and torch.equal(before, after)


def eagle_target(paths):
    from multispec import load_pair

    return load_pair(target=str(paths["target"]), device="cpu").target
