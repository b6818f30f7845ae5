"""The few-row and packed linear products (models/rows.py): the same numbers as F.linear up to float rounding, taken
by the fast backend only where the table (given to it) says so, measured once per machine and cached; packed copies
kept beside the model and remade when a weight changes; nothing is patched into a model; and decoding through them
stays the target's own greedy output on both backends."""

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


def _table(**at) -> list[str]:
    """A table of "l" but at the given counts (at={"c3": "m"}: 3 rows take the few-row product)."""
    return [at.get(f"c{n}", "l") for n in rows.COUNTS]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 24), (3, 24), (6, 24), (17, 24), (2, 5, 24)])
def test_packed_is_f_linear_and_each_rows_result_is_its_own(shape, bias):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(40, 24, generator=g), (torch.randn(40, generator=g) if bias else None)
    x = torch.randn(*shape, generator=g)
    p = rows.pack(w)
    torch.testing.assert_close(rows.packed(x, p, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    flat = x.reshape(-1, 24)
    alone = torch.cat([rows.packed(flat[i:i + 1], p, b) for i in range(flat.shape[0])])
    assert torch.equal(rows.packed(flat, p, b), alone)  # a row's numbers do not depend on the rows beside it


def test_linear_takes_each_form_only_at_the_tables_row_counts(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8, bias=False))
    table = _table(c1="m", c3="m", c5="p", c16="p")
    monkeypatch.setattr(rows, "measure", lambda weights, with_packed: list(table))
    calls = []
    real_few, real_packed = rows.few_rows, rows.packed
    monkeypatch.setattr(rows, "few_rows", lambda *a: calls.append("m") or real_few(*a))
    monkeypatch.setattr(rows, "packed", lambda *a: calls.append("p") or real_packed(*a))
    assert rows.table(model)[0] == table
    packs = rows.Packs()
    want_forms = {1: "m", 2: None, 3: "m", 5: "p", 9: "p", 16: "p", 17: None, 70: None}
    for n, f in want_forms.items():
        x = torch.randn(n, 16)
        calls.clear()
        want = F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight)
        with torch.no_grad():
            got = rows.linear(model[1], rows.linear(model[0], x, table, packs), table, packs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert calls == ([f, f] if f else []), (n, calls)
        calls.clear()
        model(x)  # the model itself is the stock one
        rows.linear(model[0], x, None, packs)
        assert not calls
    assert all("forward" not in m.__dict__ for m in model)
    calls.clear()
    with torch.no_grad():
        rows.linear(model[0], torch.randn(5, 16), table)  # no packs: F.linear
    assert not calls
    rows.linear(model[0], torch.randn(5, 16), table, packs)  # autograd sees this product: not a packed copy
    assert not calls
    assert rows.table(torch.nn.Sequential(torch.nn.ReLU())) == (None, {})
    half = torch.nn.Linear(4, 4).to(torch.bfloat16)
    assert rows.table(half)[0] is None  # float32 only
    rows.linear(half, torch.randn(1, 4, dtype=torch.bfloat16), ["m"] * len(rows.COUNTS))
    assert not calls
    assert rows.signature(table) == "rows:" + "".join(table) and rows.signature(None) == ""


def test_a_packed_copy_is_made_once_and_again_when_its_weight_changes():
    layer = torch.nn.Linear(16, 8, bias=False)
    packs, table = rows.Packs(), ["p"] * len(rows.COUNTS)
    x = torch.randn(4, 16)
    with torch.no_grad():
        first = rows.linear(layer, x, table, packs)
        copy = packs.get(layer.weight)
        assert packs.get(layer.weight) is copy and packs.nbytes == 16 * 8 * 4  # kept
        layer.weight.mul_(2)  # a head learning online changes its weights in place (an optimiser's step)
        torch.testing.assert_close(rows.linear(layer, x, table, packs), 2 * first)
        assert packs.get(layer.weight) is not copy
        layer.weight = torch.nn.Parameter(torch.randn(8, 16))  # replaced
        torch.testing.assert_close(rows.linear(layer, x, table, packs), F.linear(x, layer.weight))
    assert packs.nbytes == 16 * 8 * 4  # the replaced weight's copy went with it
    del layer
    assert packs.nbytes == 0  # (an adapting head's per-request copy: nothing kept after it)


def test_the_table_is_measured_once_and_kept_in_the_profile(monkeypatch):
    from multispec.profile import MachineProfile

    model = torch.nn.Linear(16, 32)
    measured = []
    monkeypatch.setattr(rows, "measure", lambda weights, with_packed: measured.append(1) or ["m"] * len(rows.COUNTS))
    table, entries = rows.table(model)
    assert measured == [1] and list(entries.values()) == [table]
    profile = MachineProfile().with_entries("rows", entries)
    assert rows.table(torch.nn.Linear(16, 32), profile) == (table, {})  # the same shapes: read from the profile
    assert measured == [1]
    (key,) = entries
    broken = profile.with_entries("rows", {key: "x"})
    assert rows.table(torch.nn.Linear(16, 32), broken)[0] == table and measured == [1, 1]  # a bad entry: measured
    old = profile.with_entries("rows", {key: [False] + [True] * rows.ROWS})  # an older format: measured again
    assert rows.table(torch.nn.Linear(16, 32), old)[0] == table and measured == [1, 1, 1]


def test_the_fast_net_is_given_its_table():
    """A FastNet follows the table it is given (the sidecar's by default), never one it reads itself."""
    target, _ = tiny_pair(vocab=16, seed=5)
    forced = ["m"] * len(rows.COUNTS)
    assert FastNet(target, rows_table=forced).rows_table == forced
    assert FastNet(target).rows_table is None
    assert ModelSidecar(target, rows_table=forced).fast_net().rows_table == forced
    sidecar = ModelSidecar(target)
    assert sidecar.fast_net() is sidecar.fast_net()  # made once
    assert sidecar.fast_net().packs is sidecar.packs  # the packed copies are kept beside the model


@pytest.mark.parametrize("with_packed", [False, True])
def test_measure_returns_a_form_for_every_row_count(with_packed):
    table = rows.measure([torch.randn(64, 32), torch.randn(32, 64)], reps=1, with_packed=with_packed)
    assert len(table) == len(rows.COUNTS) and all(f in rows.FORMS for f in table)
    assert with_packed or "p" not in table
    assert all(f != "m" for n, f in zip(rows.COUNTS, table) if n > rows.ROWS)  # few_rows is timed up to ROWS only


def test_the_packed_form_is_measured_only_where_a_copy_fits(monkeypatch):
    weights = [torch.randn(64, 32)]
    monkeypatch.setattr(rows, "available_ram", lambda: 10 ** 9)
    assert rows._packs_fit(weights)
    monkeypatch.setattr(rows, "available_ram", lambda: 64 * 32 * 4)  # a copy would take all of it
    assert not rows._packs_fit(weights)
    packs, layer, calls = rows.Packs(), torch.nn.Linear(32, 64, bias=False), []  # and when a copy is made
    real = rows.packed
    monkeypatch.setattr(rows, "packed", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        x = torch.randn(5, 32)
        torch.testing.assert_close(rows.linear(layer, x, ["p"] * len(rows.COUNTS), packs), F.linear(x, layer.weight))
    assert not calls and packs.nbytes == 0  # it ran as F.linear, no copy made
    monkeypatch.setattr(rows, "available_ram", lambda: 10 ** 9)
    with torch.no_grad():
        layer.weight.mul_(1)  # (a new version: asked again)
        rows.linear(layer, x, ["p"] * len(rows.COUNTS), packs)
    assert calls == [1] and packs.nbytes == 64 * 32 * 4


@pytest.mark.parametrize("form", ["m", "p"])
@pytest.mark.parametrize("backend", ["hf", "fast"])
@pytest.mark.parametrize("method,options", [("ar", {}), ("sd", {"k": 3}), ("mcsd", {"tree": (3, 2, 1)})])
def test_decoding_through_each_form_is_the_targets_greedy(monkeypatch, backend, method, options, form):
    """Every row count through one form (the table forced): greedy output equals the target's own."""
    monkeypatch.setattr(rows, "measure", lambda weights, with_packed: [form] * len(rows.COUNTS))
    calls = []
    name = {"m": "few_rows", "p": "packed"}[form]
    real = getattr(rows, name)
    monkeypatch.setattr(rows, name, lambda *a: calls.append(1) or real(*a))
    target, draft = tiny_pair(vocab=16, seed=5)
    prompt = [1, 5, 2, 7]
    ref = greedy_reference(target, prompt, 24)
    ids, _ = run(target, draft, prompt, method, SamplingConfig(temperature=0.0), 24, backend=backend, **options)
    assert ids == ref
    assert all("forward" not in m.__dict__ for m in target.modules())  # nothing patched into the model
    assert bool(calls) == (backend == "fast")  # the fast backend took that form; hf the stock layers
