"""P1 decision models (design §6.3): features, save/load, the training loop, the data pipeline and the `dynamic`
method's stopping rule. Tiny in-process models only."""
from types import SimpleNamespace

import pytest
import torch

from engine_utils import greedy_reference, tiny_pair
from multispec.decoding.engine import generate_ids
from multispec.errors import MultispecError
from multispec.heads.decision import (DecisionModel, load_decision_model, save_decision_model, type1_sizes,
                                      type2_features)
from multispec.decoding.methods import build_method
from multispec.models import make_backend
from multispec.decoding.methods import build_policy
from multispec.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0)


def test_type2_features():
    q = torch.softmax(torch.randn(5, 30), -1)
    f = type2_features(q)
    assert f.shape == (5, 11)
    assert torch.allclose(f[:, 0], -(q * q.log()).sum(-1))
    assert torch.allclose(f[:, 1:], q.sort(-1, descending=True).values[:, :10])
    small = type2_features(torch.full((2, 4), 0.25))  # V < 10: zero-padded
    assert small.shape == (2, 11) and torch.allclose(small[:, 0], torch.tensor(4.0).log().expand(2))
    assert torch.equal(small[:, 5:], torch.zeros(2, 6))
    onehot = type2_features(torch.eye(12)[:3])  # 0 log 0 = 0
    assert torch.equal(onehot[:, 0], torch.zeros(3))


def test_predict_shapes_and_type1_checks():
    m1 = DecisionModel(1, 16, type1_sizes(16))
    assert m1.sizes == (32, 16) and type1_sizes(768) == (512, 256)
    out = m1.predict(torch.randn(4, 16), torch.softmax(torch.randn(4, 9), -1))
    assert out.shape == (4,) and bool(((out > 0) & (out < 1)).all())
    with pytest.raises(MultispecError, match="hidden size"):
        m1.predict(torch.randn(4, 8), torch.softmax(torch.randn(4, 9), -1))
    m2 = DecisionModel(2, 11, (44,))
    assert m2.predict(None, torch.softmax(torch.randn(3, 9), -1)).shape == (3,)
    with pytest.raises(MultispecError):
        DecisionModel(3, 11, (44,))
    with pytest.raises(MultispecError):
        DecisionModel(2, 12, (44,))


@pytest.mark.parametrize("kind,features", [(1, 16), (2, 11)])
def test_save_load_round_trip(tmp_path, kind, features):
    torch.manual_seed(0)
    model = DecisionModel(kind, features, type1_sizes(16) if kind == 1 else (44,))
    save_decision_model(model, tmp_path / "dm", {"validation": {"bce": 0.5}})
    loaded = load_decision_model(tmp_path / "dm", device="cpu")
    h, q = torch.randn(6, 16), torch.softmax(torch.randn(6, 20), -1)
    assert torch.equal(model.predict(h, q), loaded.predict(h, q))
    assert loaded.config["type"] == kind and loaded.config["validation"] == {"bce": 0.5}


def test_load_errors(tmp_path):
    with pytest.raises(MultispecError, match="not a directory"):
        load_decision_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MultispecError, match="missing config.json"):
        load_decision_model(tmp_path / "empty")
    save_decision_model(DecisionModel(2, 11, (44,)), tmp_path / "dm")
    cfg = (tmp_path / "dm" / "config.json")
    cfg.write_text(cfg.read_text().replace("multispec-decision-model", "multispec-acceptance-head"))
    with pytest.raises(MultispecError, match="format"):
        load_decision_model(tmp_path / "dm")
    save_decision_model(DecisionModel(2, 11, (44,)), tmp_path / "dm2")
    cfg = (tmp_path / "dm2" / "config.json")
    cfg.write_text(cfg.read_text().replace("44", "45"))
    with pytest.raises(MultispecError, match="do not match"):
        load_decision_model(tmp_path / "dm2")


def _run_dynamic(tmp_path, kind, beta, width=3, depth=4, target_init=False, n_new=30, seed=0):
    target, draft = tiny_pair(vocab=16, seed=7)
    torch.manual_seed(seed)
    path = tmp_path / f"dm{kind}"
    save_decision_model(DecisionModel(kind, 16 if kind == 1 else 11, type1_sizes(16) if kind == 1 else (44,)), path)
    config = build_method("dynamic", width=width, depth=depth, decision_model=str(path), beta=beta,
                          target_init=target_init)
    policy = build_policy(config, SimpleNamespace(draft=draft))
    prompt = [1, 3, 5, 7]
    ids, c = generate_ids(make_backend(target), make_backend(draft), prompt, config, GREEDY, n_new, 0, set(),
                             policy=policy)
    return ids, c, greedy_reference(target, prompt, n_new)


@pytest.mark.parametrize("kind", [1, 2])
def test_dynamic_with_random_decision_model_is_greedy_identical(tmp_path, kind):
    ids, c, ref = _run_dynamic(tmp_path, kind, beta=0.5)
    assert ids == ref
    assert c.rounds <= c.drafted_depth <= 4 * c.rounds


@pytest.mark.parametrize("kind", [1, 2])
def test_beta_one_stops_after_one_level_and_beta_zero_never(tmp_path, kind):
    ids, c, ref = _run_dynamic(tmp_path, kind, beta=1.0)
    assert ids == ref
    assert c.drafted_depth == c.rounds and c.draft_calls == c.rounds  # depth 1 only: one draft forward a round
    ids, c, ref = _run_dynamic(tmp_path, kind, beta=0.0)
    assert ids == ref
    assert 4 * (c.rounds - 1) < c.drafted_depth <= 4 * c.rounds  # the last round is capped by the token budget
    _, c, _ = _run_dynamic(tmp_path, kind, beta=1.0, width=1, target_init=True)  # target-initialized fork
    assert c.rounds - 1 <= c.drafted_depth <= c.rounds  # the last round may be capped by the token budget


def test_training_loop_keeps_best_epoch_and_saves(tmp_path):
    from multispec.training.decision_data import DataConfig
    from multispec.training.train_decision import TrainConfig, train_decision

    g = torch.Generator().manual_seed(0)
    m, h = 400, 16
    hidden = torch.randn(m, h, generator=g)
    soft = torch.sigmoid(2 * hidden[:, 0])
    feats2 = type2_features(torch.softmax(3 * torch.randn(m, 20, generator=g), -1))
    hard = (feats2[:, 1] > feats2[:, 1].median()).float()
    data = {"hidden": hidden, "feats2": feats2, "soft": soft, "hard": hard, "prompt": torch.arange(m) // 10,
            "val_prompts": list(range(0, 40, 5)), "config": {"note": "synthetic"}}
    dc = DataConfig(target="t", draft="d")
    for kind in (1, 2):
        out = tmp_path / f"type{kind}"
        saved = train_decision(dc, TrainConfig(kind=kind, out=str(out), epochs=4), data=data, log=lambda s: None)
        best = min(saved["history"], key=lambda r: r["val_bce"])
        assert saved["validation"]["epoch"] == best["epoch"]
        assert saved["validation"]["bce"] < saved["validation"]["bce_constant"]  # learns the planted signal
        model = load_decision_model(out)
        assert model.kind == kind and model.config["training"]["batch_size"] == 50
    with pytest.raises(MultispecError):
        TrainConfig(kind=3, out="x")


def test_position_data_shapes():
    from multispec.training.decision_data import position_data

    target, draft = tiny_pair(vocab=16, seed=1)
    ids = [1, 2, 3, 4, 5, 6, 7]
    d = position_data(target, draft, ids, 3, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert d["hidden"].shape == (4, 16) and d["feats2"].shape == (4, 11)
    assert d["soft"].shape == d["hard"].shape == (4,)
    assert bool(((d["soft"] >= 0) & (d["soft"] <= 1)).all())
    with torch.no_grad():  # soft label at the first response position: sum min(p, q) of the distributions there
        p = torch.softmax(target(input_ids=torch.tensor([ids[:3]])).logits[0, -1], -1)
        q = torch.softmax(draft(input_ids=torch.tensor([ids[:3]])).logits[0, -1], -1)
    assert float(d["soft"][0]) == pytest.approx(float(torch.minimum(p, q).sum()), abs=1e-5)


def test_cli_has_train_decision():
    from click.testing import CliRunner

    from multispec.cli import _register, cli

    _register()
    result = CliRunner().invoke(cli, ["heads", "train-decision", "--help"])
    assert result.exit_code == 0 and "--type" in result.output
