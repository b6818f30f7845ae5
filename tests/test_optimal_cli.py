"""`multispec optimal`: option validation before any model loads, and the per-position summary on toy logits."""
import numpy as np
import pytest
import torch

from multispec.cli import main
from multispec.optimal.report import (
    ALPACA_TEMPLATE,
    OptimalRunConfig,
    load_prompts,
    markdown,
    position_rates,
    summarize,
)
from multispec.errors import MultispecError
from multispec.optimal import optimal_acceptance


@pytest.mark.parametrize("args, message", [
    (["--temperatures", "0.5,x"], "--temperatures"),
    (["--temperatures", "0"], "> 0"),
    (["--drafts", "0"], ">= 1"),
    (["--dataset", "nope"], "--dataset"),
])
def test_bad_options_fail_before_loading(tmp_path, capsys, args, message):
    for name in ("t", "d"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["optimal", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d"), *args])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_model_dir_is_an_error(tmp_path):
    with pytest.raises(MultispecError, match="config.json"):
        OptimalRunConfig(target=str(tmp_path), draft=str(tmp_path), dataset="humaneval", data_dir=None)


def test_load_prompts_formats_alpaca(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"instruction": "Add 1 and 2."}\n{"prompt": "def f():"}\n')
    assert load_prompts(str(path), None, 5) == [ALPACA_TEMPLATE.format(instruction="Add 1 and 2."), "def f():"]


def test_position_rates_and_summary_on_toy_logits(tmp_path):
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(0)
    per_position = []
    for _ in range(3):
        lt = rng.normal(0, 2, 50)
        ld = lt + rng.normal(0, 1, 50)
        r = position_rates(lt, ld, 0.7, (2, 3), 0.0, 8, gen)
        p, q = np.exp(lt / 0.7), np.exp(ld / 0.7)
        assert r[("opt_wor", 3)][0] == pytest.approx(optimal_acceptance(p / p.sum(), q / q.sum(), 3, False), abs=1e-9)
        per_position.append(r)
    rows = summarize(per_position, 0.7, (2, 3))
    assert [row["n"] for row in rows] == [2, 3]
    for row in rows:
        assert row["frac_wor_ge_iid"] == 1.0
        assert row["rrs_gap"] <= 1e-12 and row["kseq_gap"] <= 1e-12 and abs(row["greedy-md_gap"]) < 1e-12
    assert abs(rows[0]["spechub_gap"]) < 1e-12 and rows[1]["spechub"] is None
    (tmp_path / "config.json").write_text("{}")
    config = OptimalRunConfig(target=str(tmp_path), draft=str(tmp_path), dataset="toy.jsonl", data_dir=None)
    assert "| 0.7 | 2 |" in markdown(rows, config)


def test_a_feature_head_as_the_draft(tmp_path):
    """--head: the head's teacher-forced logits at each position are what `eagle` drafts from after that text
    (HeadBackend reading a FeatureTap's features), and the whole report runs with it; --draft and --head together
    are refused before any model loads."""
    from helpers import save_tiny_pair
    from multispec import load_pair
    from multispec.models import make_backend
    from multispec.models.eagle import FeatureTap, HeadBackend, TargetParts, new_head
    from multispec.models.eagle_io import load_head, save_head
    from multispec.optimal.report import _head_as_model, run_report

    paths = save_tiny_pair(tmp_path)
    pair = load_pair(target=str(paths["target"]), device="cpu")
    torch.manual_seed(0)
    head_dir = save_head(new_head(pair.target), pair.target, tmp_path / "head", token_ids=torch.arange(0, 40))
    ids = torch.tensor([[3, 9, 4, 17, 5, 8]])
    teacher = _head_as_model(str(head_dir), pair.target)(input_ids=ids).logits[0]  # [6, V]
    tap = FeatureTap(make_backend(pair.target, "hf"))
    head, token_ids = load_head(head_dir, pair.target)
    backend = HeadBackend(head, TargetParts.of(pair.target), tap, token_ids)
    tap.forward(ids[0, :5], torch.arange(5))
    backend.forward(ids[0, :5], torch.arange(5))
    step = backend.forward(ids[0, 5:], torch.tensor([5])).logits[0]
    torch.testing.assert_close(torch.softmax(step, -1), torch.softmax(teacher[5], -1), atol=1e-5, rtol=1e-4)
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "def f(x):"}\n{"prompt": "x = 1"}\n')
    record = run_report(OptimalRunConfig(target=str(paths["target"]), draft=None, head=str(head_dir),
                                         dataset=str(data), data_dir=None, limit=2, max_new_tokens=4,
                                         temperatures=(1.0,), drafts=(2,), out=str(tmp_path / "o.json")))
    row = record["rows"][0]
    assert 0 <= row["opt_n1"] <= row["opt_iid"] <= 1
    with pytest.raises(MultispecError, match="--draft.*or a feature head"):
        OptimalRunConfig(target=str(paths["target"]), draft=str(paths["target"]), head=str(head_dir),
                         dataset=str(data), data_dir=None)
