"""Exact enumeration of every node verifier's output law (design §11.1, §11.5).

The draft law is enumerated exactly (spec.law_fn) and each tuple is pushed through the production plan with
coins replaced by their probabilities (VerifierSpec.exact -> evaluate_plan), so the numbers come from the code
that samples. Deliberately broken variants (mutants) must fail the same check; MCNS must be lossy.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from multispec.errors import MultispecError
from multispec.verify import REGISTRY, get_verifier
from multispec.verify.base import EPS, Plan, gather, normalize_or, top_tokens
from multispec.verify.kseq import kseq_beta, kseq_rho
from multispec.verify.mcns import naive_match_acceptance

F64 = torch.float64
TOL = 1e-9


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def _instances() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(label, p, q) float64 [V] pairs: random Dirichlet instances plus the edge cases of design §11.1."""
    rng = np.random.default_rng(20240910)
    out = []
    for v, alpha, mix in [(3, 0.1, 0.05), (4, 0.3, 0.05), (5, 1.0, 0.05), (6, 3.0, 0.05), (6, 0.1, 0.0), (4, 1.0, 0.0)]:
        p = (1 - mix) * rng.dirichlet([alpha] * v) + mix / v
        q = (1 - mix) * rng.dirichlet([alpha] * v) + mix / v
        out.append((f"dirichlet-V{v}-a{alpha}", _t(p), _t(q)))
    p5 = _t(rng.dirichlet([1.0] * 5))
    out += [
        ("p=q", p5, p5.clone()),
        ("disjoint", _t([0.5, 0.5, 0, 0, 0]), _t([0, 0, 0.2, 0.3, 0.5])),
        ("one-hot-p", _t([0, 0, 1.0, 0]), _t(rng.dirichlet([1.0] * 4))),
        ("q-zeros", _t(rng.dirichlet([1.0] * 5)), _t([0.6, 0, 0.4, 0, 0])),
        ("q-argmax-tie", _t(rng.dirichlet([1.0] * 4)), _t([0.3, 0.3, 0.2, 0.2])),
        ("one-hot-q", _t(rng.dirichlet([1.0] * 4)), _t([0, 1.0, 0, 0])),
        ("p-zeros", _t([0, 0.7, 0.3, 0]), _t([0.25, 0.25, 0.25, 0.25])),
        ("fixture-1", _t([0.5, 0.3, 0.2]), _t([0.2, 0.2, 0.6])),
        ("fixture-2", _t([0.1, 0.2, 0.3, 0.4]), _t([0.4, 0.3, 0.2, 0.1])),
    ]
    return out


INSTANCES = _instances()
SAMPLING_VERIFIERS = [name for name in REGISTRY if name != "greedy"]  # greedy needs a one-hot p


def supported(name: str, n: int, v: int) -> bool:
    """Whether verifier `name` can run with n drafts on a vocabulary of v tokens."""
    spec = REGISTRY[name]
    if spec.drafts != "any" and spec.drafts != n:
        return False
    return not (name in ("rrs-wor", "greedy-md", "greedy") and n > v)


def max_error(spec, p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """max_y |out(y) - p(y)| of the exact output law: the losslessness check used for verifiers AND mutants."""
    out, _ = spec.exact(p, q, n)
    return float((out - p).abs().max())


def greedy_md_rate(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """p(T) + sum_{y not in T} min(p(y), q_T(y)), T = top-(n-1) of q (design §4.6; naive match when q_T = 0)."""
    order = top_tokens(q[None], n)[0]
    top = order[: n - 1]
    q_t = q.clone()
    q_t[top] = 0
    if float(q_t.sum()) <= 0:
        return float(p[order].sum())
    q_t = q_t / q_t.sum()
    off = torch.ones_like(p, dtype=torch.bool)
    off[top] = False
    return float(p[top].sum() + torch.minimum(p, q_t)[off].sum())


# ----------------------------------------------------------------------------------- losslessness
@pytest.mark.parametrize("name", SAMPLING_VERIFIERS)
def test_exact_output_equals_target(name):
    spec = REGISTRY[name]
    checked = 0
    for label, p, q in INSTANCES:
        for n in range(1, 5):
            if not supported(name, n, p.shape[0]):
                continue
            out, acc = spec.exact(p, q, n)
            err = float((out - p).abs().max())
            assert spec.lossless is (name != "mcns")
            if spec.lossless:
                assert err < TOL, f"{name} n={n} on {label}: max |out - p| = {err:.3g}"
            assert abs(float(out.sum()) - 1) < TOL and float(out.min()) > -TOL
            assert -TOL <= acc <= 1 + TOL
            checked += 1
    assert checked >= len(INSTANCES)


def test_single_draft_verifiers_agree_at_n1():
    # sd, rrs, rrs-wor, kseq (rho = 1) and greedy-md (T empty) are all plain speculative sampling at n = 1
    for _, p, q in INSTANCES:
        rate = float(torch.minimum(p, q).sum())  # 1 - TV
        for name in ("sd", "rrs", "rrs-wor", "kseq", "greedy-md", "mcns"):
            _, acc = REGISTRY[name].exact(p, q, 1)
            assert abs(acc - rate) < TOL, name


def test_kseq_acceptance_formula():
    for label, p, q in INSTANCES:
        for n in range(1, 5):
            _, acc = REGISTRY["kseq"].exact(p, q, n)
            rho = kseq_rho(p[None], q[None], n)
            beta = float(kseq_beta(p[None], q[None], rho))
            assert 1 - 1e-12 <= float(rho) <= n + 1e-12
            assert abs(acc - (1 - (1 - beta) ** n)) < TOL, label


def test_kseq_rho_is_the_first_valid_rho():
    """Against a dense grid on [1, n]: rho is valid (rho >= kappa(rho)) and no grid point below it is valid."""
    rng = np.random.default_rng(3)
    for v, alpha, n in [(8, 0.3, 2), (40, 0.1, 3), (40, 1.0, 5), (200, 0.05, 8)]:
        p, q = _t(rng.dirichlet([alpha] * v, size=40)), _t(rng.dirichlet([alpha] * v, size=40))
        p[::5] = q[::5]  # p = q rows: rho = 1 despite rounding
        rho = kseq_rho(p, q, n)
        kappa = lambda r: sum((1 - kseq_beta(p, q, r)) ** j for j in range(n))  # noqa: E731
        assert bool((rho >= kappa(rho) - 1e-12).all()) and bool((rho[::5] == 1).all())
        grid = torch.linspace(1, n, 801, dtype=F64)
        valid = torch.stack([g >= kappa(torch.full((40,), float(g), dtype=F64)) for g in grid], 1)  # [40, G]
        first = grid[valid.to(torch.int8).argmax(1)]
        assert bool((rho <= first + 1e-12).all())


def test_greedy_md_and_spechub_reach_the_greedy_rate():
    for label, p, q in INSTANCES:
        v = p.shape[0]
        for n in range(1, min(v, 4) + 1):
            _, acc = REGISTRY["greedy-md"].exact(p, q, n)
            assert abs(acc - greedy_md_rate(p, q, n)) < TOL, (label, n)
        if float(q.max()) < 1:  # SpecHub's pair has the law of greedy-md's pair as a set (design §4.5)
            _, hub = REGISTRY["spechub"].exact(p, q, 2)
            assert abs(hub - greedy_md_rate(p, q, 2)) < TOL, label


def test_greedy_is_the_argmax():
    spec = REGISTRY["greedy"]
    for label, p, q in INSTANCES:
        for n in range(1, min(p.shape[0], 4) + 1):
            out, acc = spec.exact(p, q, n)
            best = int(p.argmax())
            assert torch.equal(out, torch.nn.functional.one_hot(torch.tensor(best), p.shape[0]).to(F64)), label
            assert acc == float(best in top_tokens(q[None], n)[0].tolist())
    one_hot = _t([0, 0, 0, 1.0, 0])  # the processed greedy target: lossless
    out, _ = spec.exact(one_hot, _t([0.1, 0.2, 0.3, 0.25, 0.15]), 2)
    assert torch.equal(out, one_hot)


def test_draft_laws_are_distributions():
    for name, spec in REGISTRY.items():
        for _, p, q in INSTANCES:
            for n in range(1, 5):
                if not supported(name, n, q.shape[0]):
                    continue
                drafts, weights = spec.law_fn(q, n)
                assert drafts.shape == (weights.shape[0], n)
                assert abs(float(weights.sum()) - 1) < TOL and float(weights.min()) >= 0


# ----------------------------------------------------------------------------------- design §11.5 fixtures
FIXTURES = [
    # p, q, n, 1-TV, RRS iid, K-SEQ, rho*, RRS w/o, greedy verify, naive iid, SpecHub
    ((.5, .3, .2), (.2, .2, .6), 2, 0.600000, 0.760000, 0.785330, 1.463325, 0.900000, 1.000000, 0.456000, 1.000000),
    ((.1, .2, .3, .4), (.4, .3, .2, .1), 2, 0.600000, 0.720000, 0.750000, 1.500000, 0.764286, 0.766667, 0.350000,
     0.766667),
    ((.1, .2, .3, .4), (.4, .3, .2, .1), 3, 0.600000, 0.768000, 0.793950, 1.939500, 0.840298, 0.933333, 0.464600,
     None),
]


@pytest.mark.parametrize("row", FIXTURES)
def test_reference_fixtures(row):
    p, q, n, tv, rrs, kseq, rho, wor, greedy_md, naive, hub = row
    p, q = _t(p), _t(q)
    got = {
        "1-TV": REGISTRY["sd"].exact(p, q, 1)[1],
        "rrs": REGISTRY["rrs"].exact(p, q, n)[1],
        "kseq": REGISTRY["kseq"].exact(p, q, n)[1],
        "rho": float(kseq_rho(p[None], q[None], n)),
        "rrs-wor": REGISTRY["rrs-wor"].exact(p, q, n)[1],
        "greedy-md": REGISTRY["greedy-md"].exact(p, q, n)[1],
        "naive": float(naive_match_acceptance(p, q, n)),
    }
    want = {"1-TV": tv, "rrs": rrs, "kseq": kseq, "rho": rho, "rrs-wor": wor, "greedy-md": greedy_md, "naive": naive}
    if hub is not None:
        got["spechub"], want["spechub"] = REGISTRY["spechub"].exact(p, q, n)[1], hub
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-6 + 5e-7, f"{key}: {got[key]:.7f} != {value}"


# ----------------------------------------------------------------------------------- mutants
def _plan_wor_original_q(p, q, drafts):
    """BROKEN rrs-wor: the accept ratio uses the original q instead of the renormalised q'."""
    target, draft, original = p, q, q
    nums, dens = [], []
    for i in range(drafts.shape[1]):
        x = drafts[:, i]
        nums.append(gather(target, x))
        dens.append(gather(original, x))
        target = normalize_or((target - draft).clamp_min(0), target)
        draft = draft.scatter(1, x[:, None], 0.0)
        draft = draft / draft.sum(-1, keepdim=True).clamp_min(EPS)
    return Plan(tuple(range(drafts.shape[1])), torch.stack(nums, 1), torch.stack(dens, 1), target)


def _plan_wor_not_renormalised(p, q, drafts):
    """BROKEN rrs-wor: the rejected draft is removed from q' but q' is not renormalised."""
    target, draft = p, q
    nums, dens = [], []
    for i in range(drafts.shape[1]):
        x = drafts[:, i]
        nums.append(gather(target, x))
        dens.append(gather(draft, x))
        target = normalize_or((target - draft).clamp_min(0), target)
        draft = draft.scatter(1, x[:, None], 0.0)
    return Plan(tuple(range(drafts.shape[1])), torch.stack(nums, 1), torch.stack(dens, 1), target)


def _plan_rrs_residual_not_normalised(p, q, drafts):
    """BROKEN rrs: p' = (p' - q)_+ is used without renormalising it."""
    target = p
    nums, dens = [], []
    for i in range(drafts.shape[1]):
        x = drafts[:, i]
        nums.append(gather(target, x))
        dens.append(gather(q, x))
        target = (target - q).clamp_min(0)
    return Plan(tuple(range(drafts.shape[1])), torch.stack(nums, 1), torch.stack(dens, 1), normalize_or(target, p))


def _plan_kseq_sd_residual(p, q, drafts):
    """BROKEN K-SEQ: the residual is (p - q)_+ instead of p - kappa min(q, p/rho)."""
    plan = REGISTRY["kseq"].plan_fn(p, q, drafts)
    return dataclasses.replace(plan, residual=normalize_or((p - q).clamp_min(0), p))


def _plan_greedy_md_uses_q(p, q, drafts):
    """BROKEN greedy-md: accept ratio and residual use q instead of q_T."""
    x = drafts[:, -1]
    residual = normalize_or((p - q).clamp_min(0), p)
    return Plan((drafts.shape[1] - 1,), gather(p, x)[:, None], gather(q, x)[:, None], residual, route=True)


def _plan_greedy_md_no_routing(p, q, drafts):
    """BROKEN greedy-md: a residual landing on T is reported as a new token (acceptance drops, output still p)."""
    return dataclasses.replace(REGISTRY["greedy-md"].plan_fn(p, q, drafts), route=False)


_ROW3 = (_t([0.1, 0.2, 0.3, 0.4]), _t([0.4, 0.3, 0.2, 0.1]), 3)
_ROW1 = (_t([0.5, 0.3, 0.2]), _t([0.2, 0.2, 0.6]), 2)

# name -> (mutated spec, (p, q, n) on which it must be caught)
MUTANTS = {
    "rrs-wor/original-q-in-ratio": (dataclasses.replace(REGISTRY["rrs-wor"], plan_fn=_plan_wor_original_q), _ROW3),
    "rrs-wor/q-not-renormalised": (dataclasses.replace(REGISTRY["rrs-wor"], plan_fn=_plan_wor_not_renormalised),
                                   _ROW3),
    "rrs/residual-not-normalised": (dataclasses.replace(REGISTRY["rrs"], plan_fn=_plan_rrs_residual_not_normalised),
                                    _ROW3),
    "kseq/(p-q)+-residual": (dataclasses.replace(REGISTRY["kseq"], plan_fn=_plan_kseq_sd_residual), _ROW3),
    "greedy-md/q-instead-of-q_T": (dataclasses.replace(REGISTRY["greedy-md"], plan_fn=_plan_greedy_md_uses_q), _ROW3),
    "mcns (lossy by design)": (REGISTRY["mcns"], _ROW3),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_exact_check_catches_mutant(name):
    spec, (p, q, n) = MUTANTS[name]
    assert max_error(spec, p, q, n) > 1e-2, f"the exact check does not catch {name}"


def test_mcns_lossy_for_several_drafts_only():
    spec = REGISTRY["mcns"]
    assert not spec.lossless
    lossy = 0
    for _, p, q in INSTANCES:
        assert max_error(spec, p, q, 1) < TOL  # n = 1 is plain speculative sampling
        lossy += max_error(spec, p, q, 2) > 1e-3
    assert lossy >= len(INSTANCES) // 2


def test_missing_routing_keeps_output_but_loses_acceptance():
    broken = dataclasses.replace(REGISTRY["greedy-md"], plan_fn=_plan_greedy_md_no_routing)
    p, q, n = _ROW3
    out, acc = broken.exact(p, q, n)
    assert float((out - p).abs().max()) < TOL
    assert acc < REGISTRY["greedy-md"].exact(p, q, n)[1] - 0.1


# ----------------------------------------------------------------------------------- registry and API
def test_registry_names_and_flags():
    assert list(REGISTRY) == ["greedy", "sd", "mcns", "rrs", "rrs-wor", "kseq", "spechub", "greedy-md", "ot"]
    for name, spec in REGISTRY.items():
        row = spec.describe()
        assert set(row) == {"name", "lossless", "drafts", "description"}
        assert row["name"] == name and row["description"] and "\n" not in row["description"]
        assert row["lossless"] is (name != "mcns")
    assert REGISTRY["sd"].drafts == 1 and REGISTRY["spechub"].drafts == 2


def test_get_verifier_and_draft_counts():
    assert get_verifier("kseq") is REGISTRY["kseq"]
    with pytest.raises(MultispecError, match="valid names: greedy, sd"):
        get_verifier("specinfer")
    with pytest.raises(MultispecError, match="exactly 2"):
        REGISTRY["spechub"].check_drafts(3)
    with pytest.raises(MultispecError, match="exactly 1"):
        REGISTRY["sd"].check_drafts(2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(MultispecError):
            REGISTRY["rrs"].check_drafts(bad)
    q = _t([[0.5, 0.5, 0.0]])
    for name in ("rrs-wor", "greedy-md", "greedy"):
        with pytest.raises(MultispecError, match="vocabulary"):
            REGISTRY[name].draw(q, 4, torch.Generator().manual_seed(0))
    with pytest.raises(MultispecError):
        REGISTRY["rrs"].verify(_t([[0.5, 0.5]]), _t([[0.5, 0.5, 0.0]]), torch.zeros(1, 2, dtype=torch.long), None)


def test_same_seed_same_result():
    p, q, n = _ROW3
    for name in SAMPLING_VERIFIERS:
        spec = REGISTRY[name]
        n_ = 1 if name == "sd" else 2 if name == "spechub" else n
        runs = []
        for _ in range(2):
            gen = torch.Generator().manual_seed(7)
            drafts = spec.draw(q.expand(64, -1), n_, gen)
            res = spec.verify(p.expand(64, -1), q.expand(64, -1), drafts, gen)
            runs.append((drafts, res.token, res.accepted))
        assert all(torch.equal(a, b) for a, b in zip(*runs)), name


def test_top_tokens_is_a_stable_sort_with_ties_and_zeros():
    """top_tokens sorts only the tokens at or above the k-th value; it must equal the full stable sort (ties go to
    the lowest id), with many ties and zero mass."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        b, v = int(torch.randint(1, 5, (1,), generator=gen)), int(torch.randint(2, 40, (1,), generator=gen))
        k = int(torch.randint(2, v + 1, (1,), generator=gen))
        q = torch.randint(0, 4, (b, v), generator=gen).double()
        want = torch.sort(q, dim=-1, descending=True, stable=True).indices[:, :k]
        assert torch.equal(top_tokens(q, k), want), (q, k)
