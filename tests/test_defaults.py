"""Defaults that pay (issue 66, defect 5): with no backend given, the library, the CLI and the server run the fast
backend wherever the target (and the draft, when the method drafts with it) has one, `ar` included, else hf; and
`eagle` with no k, tree or nodes drafts the shape its head recorded as fastest (else a chain of 4). Broken
variants (the old "hf" default, a rule that ignores the draft, a head default not read) are caught."""
from __future__ import annotations

import json

import pytest
import torch

from helpers import assert_one_line_error, run_cli, save_tiny_pair
from multispec.decoding import pair_checks
from multispec.errors import MultispecError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture
def pair(paths):
    from multispec import load_pair

    return load_pair(target=str(paths["target"]), draft=str(paths["draft"]), device="cpu")


def _no_fast(pair, model, monkeypatch):
    """Make `model` a family the fast backend does not run (its sidecar refuses a FastNet, as models/fast.py does)."""
    def refuse():
        raise MultispecError("the fast backend supports ... models, not 'gpt2'; use --backend hf")
    monkeypatch.setattr(pair.sidecar(model), "fast_net", refuse)


def _defaults(pair) -> dict:
    """The backend each method's run takes with no backend given, as stats report it."""
    from multispec import generate

    return {m: generate(pair, "def f(x):", method=m, max_new_tokens=3, temperature=0).stats["backend"]
            for m in ("ar", "sd")}


def _check_rule(pair, monkeypatch) -> None:
    assert _defaults(pair) == {"ar": "fast", "sd": "fast"}
    _no_fast(pair, pair.draft, monkeypatch)  # a draft without a fast form: sd on hf, ar (no draft) still fast
    assert _defaults(pair) == {"ar": "fast", "sd": "hf"}
    _no_fast(pair, pair.target, monkeypatch)
    assert _defaults(pair) == {"ar": "hf", "sd": "hf"}


def test_the_default_backend_is_fast_where_the_models_have_it(pair, monkeypatch):
    _check_rule(pair, monkeypatch)


@pytest.mark.parametrize("mutant", ["old_hf_default", "ignores_the_draft", "always_counts_the_draft"])
def test_a_broken_default_rule_is_caught(pair, monkeypatch, mutant):
    real = pair_checks.default_backend
    broken = {"old_hf_default": lambda p, uses_draft=True: "hf",
              "ignores_the_draft": lambda p, uses_draft=True: real(p, False),
              "always_counts_the_draft": lambda p, uses_draft=True: real(p, True)}[mutant]
    monkeypatch.setattr(pair_checks, "default_backend", broken)
    with pytest.raises((AssertionError, MultispecError)):  # a wrong backend, or a fast one the model lacks
        _check_rule(pair, monkeypatch)


def test_the_cli_and_the_server_take_the_same_default(paths, capsys, monkeypatch):
    from multispec import load_pair
    from multispec.serve import ServeSettings, create_app

    code, out, err = run_cli(capsys, "generate", "def f(x):", "--target", str(paths["target"]), "--method", "ar",
                             "--max-new-tokens", "3", "--temperature", "0", "--threads", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["backend"] == "fast"
    code, out, err = run_cli(capsys, "generate", "def f(x):", "--target", str(paths["target"]), "--method", "ar",
                             "--max-new-tokens", "3", "--temperature", "0", "--threads", "1", "--json",
                             "--backend", "hf")
    assert code == 0 and json.loads(out)["backend"] == "hf", err
    pair = load_pair(target=str(paths["target"]), device="cpu")
    app = create_app(pair, ServeSettings(model_name="m", method="ar"))
    assert app.state.scheduler.decoder.backend == "fast"
    _no_fast(pair, pair.target, monkeypatch)
    assert create_app(pair, ServeSettings(model_name="m", method="ar")).state.scheduler.decoder.backend == "hf"


# ---------------------------------------------------------------- eagle: the head's recorded draft shape


def _head(pair, path, default=None):
    from multispec.models.eagle import new_head
    from multispec.models.eagle_io import save_head

    torch.manual_seed(1)
    out = save_head(new_head(pair.target), pair.target, path)
    if default is not None:
        config = json.loads((out / "config.json").read_text())
        config["default"] = default
        (out / "config.json").write_text(json.dumps(config))
    return out


def _tree(pair, head, **options):
    from multispec import Decoder

    return Decoder(pair, "eagle", head=str(head), **options).config.tree


def test_eagle_drafts_the_shape_its_head_recorded(pair, tmp_path, monkeypatch):
    from multispec import generate
    from multispec.models import eagle_io

    plain = _head(pair, tmp_path / "plain")
    assert _tree(pair, plain) == (1, 1, 1, 1)  # no recorded default: a chain of 4, as before
    k2 = _head(pair, tmp_path / "k2", {"k": 2, "measured": "a note, not an option"})
    assert _tree(pair, k2) == (1, 1)
    assert _tree(pair, k2, k=5) == (1,) * 5  # what is given wins
    assert _tree(pair, k2, tree=(2, 1)) == (2, 1)
    assert _tree(pair, k2, confidence=0.3) == (1, 1)
    assert _tree(pair, _head(pair, tmp_path / "tree", {"tree": [3, 1]})) == (3, 1)
    assert _tree(pair, _head(pair, tmp_path / "nodes", {"nodes": 6, "depth": 3})) == (6,)
    monkeypatch.setattr(eagle_io, "SHIPPED_DIR", tmp_path / "shipped")
    (tmp_path / "shipped").mkdir()
    k2.rename(tmp_path / "shipped" / "tiny")
    assert _tree(pair, "shipped") == (1, 1)  # found by the target's fingerprint, its default read the same way
    ar = generate(pair, "def f(x):", method="ar", max_new_tokens=12, temperature=0)
    got = generate(pair, "def f(x):", method="eagle", head="shipped", max_new_tokens=12, temperature=0)
    assert got.token_ids == ar.token_ids and got.stats["tree"] == [1, 1] and got.stats["backend"] == "fast"


def test_a_head_default_not_read_is_caught(pair, tmp_path, monkeypatch):
    """The eagle entry without its `complete` hook (the old behaviour) drafts a chain of 4 under a head that
    records k = 2: the assertions above fail on it."""
    from dataclasses import replace

    from multispec.decoding import registry

    head = _head(pair, tmp_path / "k2", {"k": 2})
    monkeypatch.setitem(registry.REGISTRY, "eagle", replace(registry.REGISTRY["eagle"], complete=None))
    assert _tree(pair, head) != (1, 1)


@pytest.mark.parametrize("bad", [{"k": 0}, {"tree": "x"}, [3]])
def test_a_bad_recorded_default_is_one_line(pair, paths, tmp_path, capsys, bad):
    head = _head(pair, tmp_path / "bad", bad)
    with pytest.raises(MultispecError, match=f"eagle head {tmp_path / 'bad'}") as e:
        _tree(pair, head)
    assert "\n" not in str(e.value)
    code, _, err = run_cli(capsys, "generate", "def f(x):", "--target", str(paths["target"]), "--method", "eagle",
                           "--head", str(head), "--max-new-tokens", "3", "--threads", "1")
    assert_one_line_error(code, err, "eagle head")


def test_the_shipped_heads_record_a_valid_draft_shape():
    """Every shipped head records its fastest draft shape (benchmarks/eagle/defaults_pay.py measures it), and the
    method accepts it."""
    from multispec.decoding.methods import build_method
    from multispec.models.eagle_io import DEFAULT_KEYS, SHIPPED_DIR

    heads = sorted(SHIPPED_DIR.glob("*/config.json"))
    assert heads
    for config in heads:
        default = json.loads(config.read_text()).get("default")
        assert isinstance(default, dict) and set(default) & {"k", "tree", "nodes"}, config
        build_method("eagle", head=str(config.parent), **{k: default[k] for k in DEFAULT_KEYS if k in default})
