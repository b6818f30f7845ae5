"""The few-row linear product (models/rows.py): the same numbers as F.linear up to float rounding, used only where the
table measured it faster, undone by `plain`, measured once per machine and cached; and decoding through it stays
the target's own greedy output on both backends."""
import json
import warnings

import pytest
import torch
import torch.nn.functional as F

from engine_utils import greedy_reference, run, tiny_pair
from multispec.models import rows
from multispec.sampling import SamplingConfig


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rows, "_MEMORY", {})


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 24), (2, 24), (3, 24), (8, 24), (1, 3, 24), (2, 5, 24)])
def test_few_rows_is_f_linear(shape, bias):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(40, 24, generator=g), (torch.randn(40, generator=g) if bias else None)
    x = torch.randn(*shape, generator=g)
    torch.testing.assert_close(rows.few_rows(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    xt = torch.randn(shape[-1], *shape[:-1], generator=g).movedim(0, -1)  # a non-contiguous input
    torch.testing.assert_close(rows.few_rows(xt, w, b), F.linear(xt, w, b), rtol=1e-5, atol=1e-5)


def test_install_routes_only_the_measured_row_counts_and_plain_undoes_it(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8, bias=False))
    table = [False, True, False, True] + [False] * (rows.ROWS - 3)
    monkeypatch.setattr(rows, "measure", lambda weights: list(table))
    calls = []
    real = rows.few_rows
    monkeypatch.setattr(rows, "few_rows", lambda *a: calls.append(a[0].shape) or real(*a))
    assert rows.install(model) == table and rows.install(model) == table  # idempotent
    for n in (1, 2, 3, 9):
        x = torch.randn(n, 16)
        calls.clear()
        want = F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight)
        torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
        assert len(calls) == (2 if n in (1, 3) else 0), (n, calls)
        with rows.plain(model):
            calls.clear()
            model(x)
            assert not calls
    assert rows.install(torch.nn.Sequential(torch.nn.ReLU())) is None
    half = torch.nn.Linear(4, 4).to(torch.bfloat16)
    assert rows.install(half) is None and "forward" not in half.__dict__  # float32 only


def test_the_table_is_measured_once_and_read_back(monkeypatch, tmp_path):
    model = torch.nn.Linear(16, 32)
    measured = []
    monkeypatch.setattr(rows, "measure", lambda weights: measured.append(1) or [False] + [True] * rows.ROWS)
    rows.install(model)
    monkeypatch.setattr(rows, "_MEMORY", {})  # a new process: reads the file
    rows.install(torch.nn.Linear(16, 32))
    assert measured == [1]
    (tmp_path / rows.FILE).write_text("{broken")
    monkeypatch.setattr(rows, "_MEMORY", {})
    monkeypatch.setattr("multispec.paths._WARNED", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rows.install(torch.nn.Linear(16, 32))
    assert measured == [1, 1] and sum("few-row linear timings" in str(w.message) for w in seen) == 1
    assert json.loads((tmp_path / rows.FILE).read_text())  # rewritten


def test_measure_returns_a_table_of_every_row_count():
    table = rows.measure([torch.randn(64, 32), torch.randn(32, 64)], reps=1)
    assert len(table) == rows.ROWS + 1 and table[0] is False and all(isinstance(v, bool) for v in table)


@pytest.mark.parametrize("backend", ["hf", "fast"])
@pytest.mark.parametrize("method,options", [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (3, 2, 1)})])
def test_decoding_through_few_rows_is_the_targets_greedy(monkeypatch, backend, method, options):
    """Every row count through the few-row product (the table forced): greedy output equals the target's own."""
    monkeypatch.setattr(rows, "measure", lambda weights: [False] + [True] * rows.ROWS)
    target, draft = tiny_pair(vocab=16, seed=5)
    prompt = [1, 5, 2, 7]
    ref = greedy_reference(target, prompt, 24)
    ids, _ = run(target, draft, prompt, method, SamplingConfig(temperature=0.0), 24, backend=backend, **options)
    assert ids == ref
    assert "forward" in target.model.layers[0].mlp.down_proj.__dict__  # it did run through the few-row layers
