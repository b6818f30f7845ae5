"""The few-row linear product (models/rows.py): the same numbers as F.linear up to float rounding, taken by the fast
backend only where the table (given to it) says so, measured once per machine and cached; nothing is patched into
a model; and decoding through it stays the target's own greedy output on both backends."""

import pytest
import torch
import torch.nn.functional as F

from engine_utils import greedy_reference, run, tiny_pair
from multispec.models import rows
from multispec.models.fast import FastNet
from multispec.models.sidecar import ModelSidecar
from multispec.sampling import SamplingConfig


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 24), (2, 24), (3, 24), (8, 24), (1, 3, 24), (2, 5, 24)])
def test_few_rows_is_f_linear(shape, bias):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(40, 24, generator=g), (torch.randn(40, generator=g) if bias else None)
    x = torch.randn(*shape, generator=g)
    torch.testing.assert_close(rows.few_rows(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    xt = torch.randn(shape[-1], *shape[:-1], generator=g).movedim(0, -1)  # a non-contiguous input
    torch.testing.assert_close(rows.few_rows(xt, w, b), F.linear(xt, w, b), rtol=1e-5, atol=1e-5)


def test_linear_takes_the_few_row_product_only_at_the_tables_row_counts(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8, bias=False))
    table = [False, True, False, True] + [False] * (rows.ROWS - 3)
    monkeypatch.setattr(rows, "measure", lambda weights: list(table))
    calls = []
    real = rows.few_rows
    monkeypatch.setattr(rows, "few_rows", lambda *a: calls.append(a[0].shape) or real(*a))
    assert rows.table(model)[0] == table
    for n in (1, 2, 3, 9):
        x = torch.randn(n, 16)
        calls.clear()
        want = F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight)
        got = rows.linear(model[1], rows.linear(model[0], x, table), table)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert len(calls) == (2 if n in (1, 3) else 0), (n, calls)
        calls.clear()
        model(x)  # the model itself is the stock one
        rows.linear(model[0], x, None)
        assert not calls
    assert all("forward" not in m.__dict__ for m in model)
    assert rows.table(torch.nn.Sequential(torch.nn.ReLU())) == (None, {})
    half = torch.nn.Linear(4, 4).to(torch.bfloat16)
    assert rows.table(half)[0] is None  # float32 only
    calls.clear()
    rows.linear(half, torch.randn(1, 4, dtype=torch.bfloat16), [True] * (rows.ROWS + 1))
    assert not calls
    assert rows.signature(table) == "rows:10100000" and rows.signature(None) == ""


def test_the_table_is_measured_once_and_kept_in_the_profile(monkeypatch):
    from multispec.profile import MachineProfile

    model = torch.nn.Linear(16, 32)
    measured = []
    monkeypatch.setattr(rows, "measure", lambda weights: measured.append(1) or [False] + [True] * rows.ROWS)
    table, entries = rows.table(model)
    assert measured == [1] and list(entries.values()) == [table]
    profile = MachineProfile().with_entries("rows", entries)
    assert rows.table(torch.nn.Linear(16, 32), profile) == (table, {})  # the same shapes: read from the profile
    assert measured == [1]
    (key,) = entries
    broken = profile.with_entries("rows", {key: "x"})
    assert rows.table(torch.nn.Linear(16, 32), broken)[0] == table and measured == [1, 1]  # a bad entry: measured


def test_the_fast_net_is_given_its_table():
    """A FastNet follows the table it is given (the sidecar's by default), never one it reads itself."""
    target, _ = tiny_pair(vocab=16, seed=5)
    forced = [False] + [True] * rows.ROWS
    assert FastNet(target, rows_table=forced).rows_table == forced
    assert FastNet(target).rows_table is None
    assert ModelSidecar(target, rows_table=forced).fast_net().rows_table == forced
    sidecar = ModelSidecar(target)
    assert sidecar.fast_net() is sidecar.fast_net()  # made once


def test_measure_returns_a_table_of_every_row_count():
    table = rows.measure([torch.randn(64, 32), torch.randn(32, 64)], reps=1)
    assert len(table) == rows.ROWS + 1 and table[0] is False and all(isinstance(v, bool) for v in table)


@pytest.mark.parametrize("backend", ["hf", "fast"])
@pytest.mark.parametrize("method,options", [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (3, 2, 1)})])
def test_decoding_through_few_rows_is_the_targets_greedy(monkeypatch, backend, method, options):
    """Every row count through the few-row product (the table forced): greedy output equals the target's own."""
    monkeypatch.setattr(rows, "measure", lambda weights: [False] + [True] * rows.ROWS)
    calls = []
    real = rows.few_rows
    monkeypatch.setattr(rows, "few_rows", lambda *a: calls.append(1) or real(*a))
    target, draft = tiny_pair(vocab=16, seed=5)
    prompt = [1, 5, 2, 7]
    ref = greedy_reference(target, prompt, 24)
    ids, _ = run(target, draft, prompt, method, SamplingConfig(temperature=0.0), 24, backend=backend, **options)
    assert ids == ref
    assert all("forward" not in m.__dict__ for m in target.modules())  # nothing patched into the model
    assert bool(calls) == (backend == "fast")  # the fast backend took the few-row product; hf the stock layers
