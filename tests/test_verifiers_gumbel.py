"""Drafter-invariant verification (issue 26): position-keyed noise, `gumbel` (chains) and `gls` (trees).

The property that makes these lossless is checked deterministically: for every seed, a decoding loop that drafts
with `coupled_draw` and verifies with the registered verifier commits exactly the tokens of plain autoregressive
Gumbel-max sampling with the same position keys (`keyed_sample`), whatever the drafter (coupled, random, the
target itself), the draft lengths and the tree shapes. The law is then checked exactly (toy models of
test_verifiers_sequence, V <= 5): `gumbel`'s exact law given the drafted chain through the same enumeration as
block/traversal, and `gls`'s exact round law (drafting included) completed to M tokens, both equal to the
target's within 1e-9; the two exact laws agree with each other on chains, and sampling is chi-squared against
them. Broken variants (round keys, unkeyed noise, SD-style acceptance on coupled noise) must be caught; a draft on
independent noise must stay lossless and lose acceptance.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.stats import chi2, kstest

from multispec.drafting.coupled import coupled_draw
from multispec.errors import MultispecError
from multispec.optimal import optimal_acceptance
from multispec.tree import Tree
from multispec.verify import keyed
from multispec.verify.gumbel import (acceptance_mc, coupled_joint, coupled_ranks, coupling_acceptance,
                                     round_law, verify_gumbel)
from multispec.verify.keyed import PositionKeys, gumbel_max, keyed_gumbel, keyed_sample, keyed_uniform, node_keys
from multispec.verify.rrs_wor import law_wor
from multispec.verify.sequence import SEQUENCE_REGISTRY, all_verifiers
from test_verifiers_sequence import REGIMES, Toy, committed_law

F64 = torch.float64
PROMPT = 3  # the toy's prompt length: the root of round 1 sits at absolute position PROMPT - 1


def _chi2_pvalue(counts: dict, law: dict, trials: int) -> float:
    """Chi-square p-value of observed counts against an exact law (cells with expected < 5 pooled)."""
    keys = sorted(law, key=law.get)
    exp = np.array([trials * law[k] for k in keys])
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    assert sum(counts.get(k, 0) for k in counts if k not in law) == 0, "an outcome of probability 0 occurred"
    small = np.cumsum(exp) < 5
    exp, obs = np.append(exp[~small], exp[small].sum()), np.append(obs[~small], obs[small].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return float(chi2.sf(stat, keep.sum() - 1))


# ----------------------------------------------------------------------------------- a pure decoding loop
def keyed_ar(toy: Toy, seed: int, m: int) -> list[int]:
    """Target-only sampling: token i (absolute position PROMPT + i) = Gumbel-max of p with that position's key."""
    out: list[int] = []
    for i in range(m):
        p = toy.pq(tuple(out))[0]
        out.append(int(keyed_sample(p[None], PositionKeys(seed, (PROMPT + i,)))[0]))
    return out


def one_round(toy: Toy, out: list[int], tree: Tree, keys: PositionKeys, drafter: str = "coupled",
              verify=verify_gumbel, side: torch.Generator | None = None) -> tuple[list[int], int]:
    """Draft `tree` after the committed tokens `out` and verify it. Returns (committed tokens, accepted count).

    drafter: "coupled" (coupled_draw from q), "independent" (coupled_draw from q with noise slot 1, not the
    target's), "random" (uniform distinct tokens from `side`) or "target" (coupled_draw from p)."""
    n = len(tree)
    tokens = [0] * n
    p = torch.zeros(n, toy.v, dtype=F64)
    q = torch.zeros(n, toy.v, dtype=F64)
    for u in range(n):  # breadth-first: parents are drafted before their children
        p[u], q_u = toy.pq(tuple(out) + tuple(tokens[a] for a in tree.path_to(u)[1:]))
        kids = tree.children[u]
        if not kids:
            continue
        q[u] = q_u
        if drafter == "random":
            drafts = torch.randperm(toy.v, generator=side)[: len(kids)]
        else:
            row = keys.row(u)
            if drafter == "independent":
                row = PositionKeys(row.seed, row.positions, slot=1)
            drafts = coupled_draw((p[u] if drafter == "target" else q_u)[None], len(kids), row)[0]
        for kid, tok in zip(kids, drafts.tolist()):
            tokens[kid] = tok
    path, nxt = verify(tree, torch.tensor(tokens), p, q, keys)
    return [tokens[u] for u in path[1:]] + [nxt], len(path) - 1


def decode(toy: Toy, seed: int, m: int, shapes, drafter="coupled", verify=verify_gumbel,
           keys_for=None) -> tuple[list[int], list[int]]:
    """Speculative decoding of m tokens, round r drafting the tree shapes[r % len(shapes)] (see one_round).
    keys_for(round, tree, root_position) -> PositionKeys: the per-node keys (default: by absolute position).
    Returns (committed tokens, accepted count per round)."""
    keys_for = keys_for or (lambda r, tree, root: node_keys(tree, seed, root))
    side = torch.Generator().manual_seed(seed + 99)
    out: list[int] = []
    accepted: list[int] = []
    while len(out) < m:
        tree = Tree.from_shape(shapes[len(accepted) % len(shapes)])
        keys = keys_for(len(accepted), tree, PROMPT - 1 + len(out))
        committed, acc = one_round(toy, out, tree, keys, drafter, verify, side)
        out += committed
        accepted.append(acc)
    return out[:m], accepted


CHAIN_SCHEDULE = [(1,), (1, 1, 1), (1, 1), (1, 1, 1, 1)]
TREE_SCHEDULE = [(2, 2), (3, 1), (1, 2, 2), (2, 1, 1)]


# ----------------------------------------------------------------------------------- keyed noise
def test_keyed_noise_is_a_pure_function_of_its_key():
    # pinned: the scheme (splitmix64 mixing + CPU Mersenne Twister) must not change silently
    assert keyed.position_key(0, 0, 0) == 15360182602344625695
    assert keyed.splitmix64(1234567) == 6457827717110365317  # the reference implementation's first output
    assert keyed_uniform(0, [0], 3)[0].tolist() == [0.2480843412405107, 0.9105261021933666, 0.7320130343281432]
    code = ("from multispec.verify.keyed import keyed_uniform; "
            "print(keyed_uniform(7, [123], 2, slot=1)[0].tolist())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == str(keyed_uniform(7, [123], 2, slot=1)[0].tolist())  # another process
    a = keyed_gumbel(3, [5, 6, 5], 1000)
    assert torch.equal(a[0], a[2]) and not torch.equal(a[0], a[1])  # the key alone decides
    assert torch.equal(a[:, :10], keyed_gumbel(3, [5, 6, 5], 10))  # token x's noise does not depend on V
    assert not torch.equal(a[0], keyed_gumbel(4, [5], 1000)[0])
    assert not torch.equal(a[0], keyed_gumbel(3, [5], 1000, slot=1)[0])
    assert torch.equal(keyed_gumbel([3, 4], [5, 5], 8), torch.cat([keyed_gumbel(3, [5], 8), keyed_gumbel(4, [5], 8)]))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(keyed_gumbel(3, [5, 6, 5], 1000), a)
    finally:
        torch.set_num_threads(threads)
    keys = node_keys(Tree.from_shape((2, 1)), seed=3, root_position=10)
    assert keys.positions == (11, 12, 12, 13, 13) and keys.row(3) == PositionKeys(3, (13,))


def test_keyed_noise_is_uniform_and_keyed_sampling_draws_p():
    u = keyed_uniform(1, range(400), 50).flatten().numpy()
    assert kstest(u, "uniform").pvalue > 1e-3
    p = torch.tensor([0.05, 0.4, 0.0, 0.25, 0.3], dtype=F64)
    draws = keyed_sample(p.expand(6000, 5), PositionKeys(11, tuple(range(6000)))).numpy()
    counts = {k: int(c) for k, c in zip(*np.unique(draws, return_counts=True))}
    assert 2 not in counts
    assert _chi2_pvalue(counts, {k: float(p[k]) for k in range(5) if p[k] > 0}, 6000) > 1e-3


def _laws(vocab: int, count: int, gen: torch.Generator):
    """Peaked, flat, uniform, sparse and point-mass laws over `vocab` tokens (float32, as the engine's p)."""
    for i in range(count):
        kind = i % 5
        if kind == 0:
            yield torch.softmax(torch.randn(vocab, generator=gen) * 3, -1)
        elif kind == 1:
            yield torch.softmax(torch.randn(vocab, generator=gen) * 20, -1)
        elif kind == 2:
            yield torch.full((vocab,), 1.0 / vocab)
        elif kind == 3:
            p = torch.rand(vocab, generator=gen) * (torch.rand(vocab, generator=gen) > 0.7)
            p[i % vocab] += 0.01
            yield p / p.sum()
        else:
            yield torch.nn.functional.one_hot(torch.tensor(i % vocab), vocab).float()


def test_keyed_max_is_gumbel_max_token_for_token(monkeypatch):
    """keyed_max (the plain step's keyed draw: exact scores only where a cheap bound comes close) returns
    gumbel_max's token on every law and key, with or without the noise row memoised; a bound that is not one
    (U in place of 1 - U) is caught by the same comparison."""
    def compare(vocab: int, count: int) -> int:
        differ = 0
        for i, p in enumerate(_laws(vocab, count, torch.Generator().manual_seed(vocab))):
            keyed._MEMO.clear()
            want = int(gumbel_max(p[None], keyed_gumbel(i, [i + 3], vocab)))  # memoises the row
            assert keyed.keyed_max(p, i, i + 3) == want  # from the memo
            keyed._MEMO.clear()
            try:
                differ += keyed.keyed_max(p, i, i + 3) != want  # the bound's path
            except IndexError:  # the broken bound can leave no candidate at all
                differ += 1
        return differ

    assert sum(compare(v, 300) for v in (2, 3, 7, 50)) + compare(8192, 40) == 0
    real_sub = torch.sub
    monkeypatch.setattr(torch, "sub", lambda a, b, out=None: out.copy_(b) if isinstance(a, float) else real_sub(a, b))
    assert compare(50, 300) > 15  # broken: bound p / U, not a bound (26 of 300 tokens differ)


# ----------------------------------------------------------------------------------- invariance
@pytest.mark.parametrize("regime", REGIMES)
def test_committed_text_is_keyed_ar_whatever_the_drafter(regime):
    """For every seed: the same text as target-only Gumbel-max sampling, for chains (gumbel) and trees (gls), any
    draft lengths and shapes, and drafters that are coupled, independent, random or the target itself."""
    toy = Toy(4, regime, seed=41)
    gumbel_spec, gls_spec = SEQUENCE_REGISTRY["gumbel"], SEQUENCE_REGISTRY["gls"]
    for seed in range(12):
        want = keyed_ar(toy, seed, 9)
        for spec, schedule in ((gumbel_spec, CHAIN_SCHEDULE), (gls_spec, TREE_SCHEDULE), (gls_spec, CHAIN_SCHEDULE)):
            for drafter in ("coupled", "independent", "random", "target"):
                got, accepted = decode(toy, seed, 9, schedule[seed % 4:] + schedule[:seed % 4], drafter, spec.verify)
                assert got == want, (spec.name, drafter, seed)


def test_drafting_the_target_accepts_every_chain_draft():
    toy = Toy(4, "random", seed=2)
    for seed in range(5):
        _, accepted = decode(toy, seed, 12, [(1, 1, 1)], "target")
        assert accepted[:-1] == [3] * (len(accepted) - 1)


# ----------------------------------------------------------------------------------- exact laws
CHAINS = [(1,), (1, 1), (1, 1, 1)]
TREES = [(3, 2), (2, 1, 2), (3, 1, 1), (1, 3, 1), (2, 2)]


def test_coupled_joint_and_ranks_are_consistent():
    rng = np.random.default_rng(5)
    for v in (2, 3, 5):
        for _ in range(6):
            p, q = rng.dirichlet([0.5] * v) * (rng.random(v) < 0.8), rng.dirichlet([0.5] * v)
            p = p / p.sum() if p.sum() > 0 else np.eye(v)[0]
            joint = coupled_joint(p, q)
            assert np.abs(joint.sum(1) - p).max() < 1e-12 and np.abs(joint.sum(0) - q).max() < 1e-12
            assert np.abs(np.diag(joint) - coupled_ranks(p, q, 1)[:, 0]).max() < 1e-12
            for n in range(1, v + 1):
                ranks = coupled_ranks(p, q, n)
                assert (ranks.sum(1) <= p + 1e-12).all()
                # rank r of x among the coupled drafts, summed over the target's token, is q's top-n law
                drafts, weights = law_wor(torch.tensor(q), n)
                first = {}
                for d, w in zip(drafts.tolist(), weights.tolist()):
                    for r, x in enumerate(d):
                        first[(x, r)] = first.get((x, r), 0.0) + w
                for (x, r), w in first.items():
                    assert ranks[x, r] <= w + 1e-12
            assert abs(coupled_ranks(p, q, v).sum() - 1) < 1e-12  # every token drafted: always accepted


@pytest.mark.parametrize("regime", REGIMES)
def test_gumbel_chain_law_is_the_target_law(regime):
    """The exact law of `gumbel` given the drafted chain, under its draft law (q, coupled), completed to
    depth + 1 tokens: the target's law within 1e-9 (the enumeration block and traversal pass)."""
    spec = SEQUENCE_REGISTRY["gumbel"]
    for i, shape in enumerate(CHAINS):
        law, want = committed_law(Toy(4 if len(shape) < 3 else 3, regime, seed=51 + i), spec, shape)
        assert abs(law.sum() - 1) < 1e-9
        assert np.abs(law - want).max() < 1e-9, (regime, shape, np.abs(law - want).max())


def _completed(toy: Toy, law: dict, m: int) -> np.ndarray:
    out = np.zeros((toy.v,) * m)
    for committed, (mass, _) in law.items():
        rest = toy.seq_law(committed, m - len(committed)) if len(committed) < m else np.ones(())
        out[committed] += mass * rest
    return out


@pytest.mark.parametrize("regime", REGIMES)
def test_gls_round_law_is_the_target_law(regime):
    for i, shape in enumerate(TREES + CHAINS):
        toy = Toy(3 if len(Tree.from_shape(shape)) > 6 else 4, regime, seed=61 + i)
        m = len(shape) + 1
        law = round_law(Tree.from_shape(shape), toy.pq)
        assert abs(sum(mass for mass, _ in law.values()) - 1) < 1e-9
        got = _completed(toy, law, m)
        assert np.abs(got - toy.seq_law((), m)).max() < 1e-9, (regime, shape)


def test_the_two_exact_laws_agree_on_chains():
    """gumbel's law given the drafted chain, averaged over the chain's draft law (q), = round_law
    (coupled_joint vs coupled_ranks: two derivations), outcome by outcome."""
    spec = SEQUENCE_REGISTRY["gumbel"]
    tree = Tree.chain(2)
    for regime in REGIMES:
        toy = Toy(4, regime, seed=71)
        joint: dict = {}
        for d1 in range(4):
            for d2 in range(4):
                w = float(toy.pq(())[1][d1] * toy.pq((d1,))[1][d2])
                if w <= 0:
                    continue
                prefixes = [(), (d1,), (d1, d2)]
                p = torch.stack([toy.pq(pre)[0] for pre in prefixes])
                q = torch.stack([toy.pq(pre)[1] for pre in prefixes[:2]] + [torch.zeros(4, dtype=F64)])
                tokens = torch.tensor([0, d1, d2])
                for (path, nxt), mass in spec.law(tree, tokens, p, q).items():
                    key = tuple(int(tokens[u]) for u in path[1:]) + (nxt,)
                    joint[key] = joint.get(key, 0.0) + w * mass
        exact = round_law(tree, toy.pq)
        assert {k for k, v in joint.items() if v > 1e-15} == set(exact), regime
        assert max(abs(joint.get(k, 0.0) - exact[k][0]) for k in exact) < 1e-12, regime


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2), (3, 1)])
def test_sampled_rounds_match_the_round_law(shape):
    """One round per seed through coupled_draw + the registered verifier: committed tokens chi-squared against
    round_law, and each outcome's accepted count is round_law's."""
    toy = Toy(4, "random", seed=8)
    tree = Tree.from_shape(shape)
    exact = round_law(tree, toy.pq)
    trials = 2000
    counts: dict = {}
    for seed in range(trials):
        committed, accepted = one_round(toy, [], tree, node_keys(tree, seed, PROMPT - 1),
                                        verify=SEQUENCE_REGISTRY["gls"].verify)
        key = tuple(committed)
        assert key in exact and exact[key][1] == accepted
        counts[key] = counts.get(key, 0) + 1
    assert _chi2_pvalue(counts, {k: mass for k, (mass, _) in exact.items()}, trials) > 1e-3


def test_committed_tokens_chi_squared_against_the_target():
    toy = Toy(3, "random", seed=13)
    m, trials = 3, 1500
    want = toy.seq_law((), m)
    law = {idx: float(want[idx]) for idx in np.ndindex(want.shape) if want[idx] > 0}
    for schedule, verify in ((CHAIN_SCHEDULE, SEQUENCE_REGISTRY["gumbel"].verify),
                             (TREE_SCHEDULE, SEQUENCE_REGISTRY["gls"].verify)):
        counts: dict = {}
        for seed in range(trials):
            key = tuple(decode(toy, 1000 + seed, m, schedule, verify=verify)[0])
            counts[key] = counts.get(key, 0) + 1
        assert _chi2_pvalue(counts, law, trials) > 1e-3


# ----------------------------------------------------------------------------------- broken variants
def test_noise_keyed_by_round_is_caught():
    """(a) keys (round, depth) instead of the absolute position: each token still has fresh noise, but the text
    depends on the draft lengths, so it is not the keyed-ar text."""
    toy = Toy(4, "random", seed=3)
    differs = 0
    for seed in range(20):
        by_round = lambda r, tree, root: node_keys(tree, seed, 1000 * r)  # noqa: E731  (depth d: 1000 r + d + 1)
        got, _ = decode(toy, seed, 8, CHAIN_SCHEDULE, keys_for=by_round)
        differs += got != keyed_ar(toy, seed, 8)
    assert differs >= 15


def test_noise_shared_by_a_whole_round_is_caught(monkeypatch):
    """(a') one noise per round (the key ignores the position): not keyed-ar, and not the target's law either."""
    toy = Toy(3, "random", seed=13)
    schedule = [(1, 1, 1)]
    wants = [keyed_ar(toy, seed, 6) for seed in range(10)]
    real = keyed.position_key
    monkeypatch.setattr(keyed, "position_key", lambda seed, position, slot=0: real(seed, 0, slot))
    assert sum(decode(toy, seed, 6, schedule)[0] != wants[seed] for seed in range(10)) >= 5
    m, trials = 3, 1500
    want = toy.seq_law((), m)
    law = {idx: float(want[idx]) for idx in np.ndindex(want.shape) if want[idx] > 0}
    counts: dict = {}
    for seed in range(trials):  # the round's seed: per-round keys that ignore the position
        key = tuple(decode(toy, seed, m, schedule, keys_for=lambda r, tree, root: node_keys(tree, seed * 7919 + r,
                                                                                               root))[0])
        counts[key] = counts.get(key, 0) + 1
    assert sum(counts.get(k, 0) for k in counts if k not in law) > 0 or _chi2_pvalue(counts, law, trials) < 1e-6


def test_independent_draft_noise_stays_lossless_but_loses_acceptance():
    """(b) the draft samples with noise the target does not use: still the keyed-ar text (the verifier never
    trusts the draft), but acceptance falls from the coupling's to sum_x p(x) q(x)."""
    toy = Toy(4, "random", seed=17)
    mean = {}
    for drafter in ("coupled", "independent"):
        total = 0
        for seed in range(60):
            got, accepted = decode(toy, seed, 10, [(1,)], drafter)
            assert got == keyed_ar(toy, seed, 10)
            total += sum(accepted) / len(accepted)
        mean[drafter] = total / 60
    assert mean["independent"] < mean["coupled"] - 0.1, mean
    p, q = torch.tensor([0.5, 0.3, 0.2], dtype=F64), torch.tensor([0.4, 0.35, 0.25], dtype=F64)
    assert coupling_acceptance(p, q) > float((p * q).sum()) + 0.4
    assert abs(acceptance_mc(p, q, mode="independent", samples=40000)[0] - float((p * q).sum())) < 0.02


def sd_on_coupled_noise(p: torch.Tensor, q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """(b') a mutant: draft d = argmax(log q + G), accepted iff U(d) < p(d)/q(d) with U = exp(-exp(-G)) the same
    noise's uniform, else the Gumbel-max token of the residual (p - q)+ under G. p, q: [S, V]; g: [S, V]."""
    d = gumbel_max(q, g)
    u = torch.exp(-torch.exp(-g)).gather(1, d[:, None])[:, 0]
    ratio = p.gather(1, d[:, None])[:, 0] / q.gather(1, d[:, None])[:, 0]
    res = (p - q).clamp_min(0)
    return torch.where(u < ratio, d, gumbel_max(res / res.sum(-1, keepdim=True), g))


def test_sd_acceptance_on_coupled_noise_is_caught():
    """(b') SD's min(1, p/q) coin taken from the coupled noise: its token is not the target's Gumbel-max token
    (not invariant), and its law is not p (the coin is biased: d was chosen for its large noise)."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64)
    s = 40000
    g = keyed_gumbel(5, range(s), 4)
    out = sd_on_coupled_noise(p.expand(s, 4), q.expand(s, 4), g)
    assert float((out != gumbel_max(p.expand(s, 4), g)).double().mean()) > 0.05
    counts = {k: int(c) for k, c in zip(*np.unique(out.numpy(), return_counts=True))}
    assert _chi2_pvalue(counts, {k: float(p[k]) for k in range(4)}, s) < 1e-6


# ----------------------------------------------------------------------------------- acceptance
def test_coupling_acceptance_bounds():
    rng = np.random.default_rng(7)
    for v, alpha in [(4, 0.3), (5, 1.0), (8, 0.5), (12, 2.0)]:
        for _ in range(5):
            p, q = rng.dirichlet([alpha] * v), rng.dirichlet([alpha] * v)
            tv = 0.5 * float(np.abs(p - q).sum())
            acc = coupling_acceptance(p, q)
            assert (1 - tv) / (1 + tv) - 1e-12 <= acc <= 1 - tv + 1e-12  # Daliri et al.; OT's optimum
            assert abs(acc - coupled_ranks(p, q, 1).sum()) < 1e-12
            prev = acc
            for n in range(2, min(v, 4) + 1):
                acc_n = coupling_acceptance(p, q, n)
                assert prev - 1e-12 <= acc_n <= optimal_acceptance(p, q, n, replacement=False) + 1e-9
                prev = acc_n
    p = rng.dirichlet([1.0] * 6)
    assert abs(coupling_acceptance(p, p) - 1) < 1e-12


def test_acceptance_mc_matches_the_exact_value():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    q = np.array([0.4, 0.3, 0.2, 0.1])
    for n in (1, 2, 3):
        value, err = acceptance_mc(p, q, n, samples=40000)
        assert abs(value - coupling_acceptance(p, q, n)) < 5 * err + 1e-9
    slots, err = acceptance_mc(p, q, 2, samples=40000, mode="slots")
    assert slots <= optimal_acceptance(p, q, 2, replacement=True) + 5 * err


# ----------------------------------------------------------------------------------- registry and contract
def test_registry_rows_and_contract():
    rows = {spec.name: spec.describe() for spec in all_verifiers()}
    assert rows["gumbel"]["shapes"] == "chain" and rows["gls"]["shapes"] == "tree"
    assert rows["gumbel"]["lossless"] and rows["gls"]["lossless"] and rows["gls"]["kind"] == "sequence"
    assert "coupled" in rows["gls"]["draft_law"]
    spec = SEQUENCE_REGISTRY["gumbel"]
    assert spec.keyed and SEQUENCE_REGISTRY["gls"].keyed and not SEQUENCE_REGISTRY["block"].keyed
    with pytest.raises(MultispecError, match="chains only"):
        spec.check_widths((2, 1))
    SEQUENCE_REGISTRY["gls"].check_widths((4, 2, 1))
    q = torch.tensor([[0.5, 0.5, 0.0]])
    with pytest.raises(MultispecError, match="coupled_draw"):
        spec.draw(q, 1, torch.Generator().manual_seed(0))
    tree = Tree.chain(1)
    p = torch.full((2, 3), 1 / 3)
    with pytest.raises(MultispecError, match="position keys"):
        spec.verify(tree, torch.zeros(2, dtype=torch.long), p, p, torch.Generator())
    with pytest.raises(MultispecError, match="follow the tree"):
        spec.verify(tree, torch.zeros(2, dtype=torch.long), p, p, PositionKeys(0, (5, 5)))
    with pytest.raises(MultispecError, match="no exact law"):
        SEQUENCE_REGISTRY["gls"].law(tree, torch.zeros(2, dtype=torch.long), p, p)
    drafts = coupled_draw(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]), 3, PositionKeys(1, (4, 9)))
    assert drafts.shape == (2, 3) and drafts.dtype == torch.long and drafts[0, 2] == 2  # q = 0 pads last
    with pytest.raises(MultispecError):
        coupled_draw(q, 1, PositionKeys(1, (4, 5)))
    with pytest.raises(MultispecError):
        coupled_draw(q, 4, PositionKeys(1, (4,)))
