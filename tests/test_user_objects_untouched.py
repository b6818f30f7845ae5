"""A model handed over in memory comes back as it was: every registered method, on both backends, with an int8
draft and a reduced draft vocabulary, leaves each model's `__dict__` (and every submodule's and its config's: the
same keys holding the same objects), its parameters (storage and values) and its methods (no `forward` in any
module's `__dict__`) as they were. What multispec prepares for a model lives in the pair's sidecar of it
(models/sidecar.py), never on the model."""
from __future__ import annotations

import types

import pytest
import torch

import multispec
from helpers import save_tiny_pair, tiny_llama
from multispec.decoding.decoder import Decoder  # noqa: F401 - registers every method
from multispec.decoding.registry import get_method, method_names

# Methods that need trained files the tiny pair lacks; eagle runs on a fresh, untrained head saved for it (below).
NEEDS_TRAINED = {
    "dynamic": "its decision model is trained for the shipped pair (decision_model=...)",
    "specdecpp": "its acceptance head is trained for a given target (head=...)",
}


def snapshot(model: torch.nn.Module) -> dict:
    """What must not change: per module (and its config), the `__dict__` as {key: id(value)}; per parameter and
    buffer its storage and a copy of its values; whether any module holds an instance `forward`."""
    out = {}
    for name, m in model.named_modules():
        out[("module", name)] = {k: id(v) for k, v in vars(m).items()}
        out[("forward", name)] = "forward" in vars(m)
        cfg = getattr(m, "config", None)
        if cfg is not None:
            out[("config", name)] = {k: id(v) for k, v in vars(cfg).items()}
            out[("config id", name)] = id(cfg)
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        out[("tensor", name)] = (t.data_ptr(), t.dtype, t.device, tuple(t.shape), t.detach().clone())
    return out


def differences(before: dict, after: dict) -> list[str]:
    """Every entry of two snapshots that differs, in words (empty: untouched)."""
    found = []
    for key in sorted(set(before) | set(after), key=str):
        a, b = before.get(key), after.get(key)
        if key[0] == "tensor" and a is not None and b is not None:
            same = a[:4] == b[:4] and torch.equal(a[4], b[4])
        else:
            same = a == b
        if not same:
            extra = sorted(set(b) - set(a)) if isinstance(a, dict) and isinstance(b, dict) else ""
            found.append(f"{key[0]} {key[1] or '<model>'}: changed {extra}")
    return found


def test_the_comparison_finds_a_patched_forward_a_new_key_and_a_changed_weight():
    """The check can fail: each way of touching a model is reported."""
    model = tiny_llama(seed=3)
    before = snapshot(model)
    assert differences(before, snapshot(model)) == []
    layer = model.model.layers[0].mlp.down_proj
    layer.forward = types.MethodType(lambda self, x: torch.nn.functional.linear(x, self.weight), layer)
    found = differences(before, snapshot(model))
    assert any("forward model.layers.0.mlp.down_proj" in f for f in found), found
    del layer.forward
    assert differences(before, snapshot(model)) == []
    vars(model)["_cached_thing"] = object()
    assert any("_cached_thing" in f for f in differences(before, snapshot(model)))
    del vars(model)["_cached_thing"]
    model.config.some_note = "x"
    assert any(f.startswith("config ") for f in differences(before, snapshot(model)))
    del model.config.some_note
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1
    assert any("tensor lm_head.weight" in f for f in differences(before, snapshot(model)))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny saved pair loaded into memory by transformers (the caller's objects), its tokenizer, and an
    untrained feature head saved for the target."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from multispec.models.eagle import new_head
    from multispec.models.eagle_io import save_head

    root = tmp_path_factory.mktemp("pair")
    dirs = save_tiny_pair(root)
    target = AutoModelForCausalLM.from_pretrained(dirs["target"], dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(dirs["draft"], dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(dirs["target"])
    save_head(new_head(target), target, root / "head")
    return target, draft, tok, root / "head"


def _runs():
    """(method, options) for every registered method that the tiny pair can run."""
    for name in method_names():
        if name in NEEDS_TRAINED:
            continue
        yield name, {}


def test_every_method_and_backend_leaves_the_models_untouched(models):
    target, draft, tok, head_dir = models
    names = set(method_names())
    assert names >= {"auto", "ar", "sd", "mcsd", "eagle"}
    skipped = {n: why for n, why in NEEDS_TRAINED.items() if n in names}
    assert set(skipped) == names & set(NEEDS_TRAINED)  # said why for each
    before = {"target": snapshot(target), "draft": snapshot(draft)}
    pair = multispec.load_pair(target=target, draft=draft, tokenizer=tok)
    ran = []
    for backend in ("hf", "fast"):
        for name, options in _runs():
            if name == "eagle":
                options = {"head": str(head_dir), "k": 2}
            out = multispec.generate(pair, "def f(x):", method=name, max_new_tokens=8, temperature=0,
                                     backend=backend, **options)
            assert len(out.token_ids) <= 8
            ran.append((backend, name))
        for extra in ({"draft_dtype": "int8"}, {"draft_vocab": 8}, {"draft_dtype": "int8", "draft_vocab": 8}):
            multispec.generate(pair, "def f(x):", method="sd", max_new_tokens=8, temperature=0, backend=backend,
                               **extra)
            ran.append((backend, f"sd {extra}"))
        multispec.generate(pair, ["def f(x):", "print(1)"], method="sd", max_new_tokens=8, temperature=0,
                           backend=backend, batch_size=2)  # the batched path on the fast backend
    assert {n for _, n in ran} >= names - set(skipped)
    for role, model in (("target", target), ("draft", draft)):
        assert differences(before[role], snapshot(model)) == [], role
    # the pair keeps what it prepared beside the models
    assert pair.sidecar(target).fast_net() is pair.sidecar(target).fast_net()


def test_a_quantized_pair_from_models_in_memory_leaves_them_untouched(models):
    """dtype int8 quantizes a copy (the library's own object); the caller's models stay as they were, and the
    dtype is recorded in the pair's sidecar of the copy."""
    target, draft, tok, _ = models
    before = {"target": snapshot(target), "draft": snapshot(draft)}
    pair = multispec.load_pair(target=target, draft=draft, tokenizer=tok, dtype="int8")
    assert pair.target is not target and pair.sidecar(pair.target).weights_dtype == "int8"
    for backend in ("hf", "fast"):
        multispec.generate(pair, "def f(x):", method="sd", max_new_tokens=8, temperature=0, backend=backend)
    for role, model in (("target", target), ("draft", draft)):
        assert differences(before[role], snapshot(model)) == [], role


def test_the_default_pair_is_left_as_loaded():
    pair = multispec.load_pair()
    before = {"target": snapshot(pair.target), "draft": snapshot(pair.draft)}
    for backend in ("hf", "fast"):
        for name in ("auto", "ar", "sd", "mcsd"):
            multispec.generate(pair, "def f(x):", method=name, max_new_tokens=8, temperature=0, backend=backend)
        multispec.generate(pair, "def f(x):", method="sd", max_new_tokens=8, temperature=0, backend=backend,
                           draft_dtype="int8", draft_vocab=64)
    assert differences(before["target"], snapshot(pair.target)) == []
    assert differences(before["draft"], snapshot(pair.draft)) == []


def test_the_methods_needing_trained_files_are_named():
    for name, why in NEEDS_TRAINED.items():
        assert get_method(name) is not None and why
