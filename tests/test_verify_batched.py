"""Batched verification (verify/batched.py) against the per-sequence verifiers it replaces in a round.

- greedy: `greedy_batch` equals `walk_tree_greedy` on every sequence of random batches of trees and chains (a small
  vocabulary, so that siblings often share a token);
- exact law: `chain_batch_law` (the kernel's own plan, coins -> probabilities) equals the per-sequence reference's
  exact law (sd: the node walk `walk_tree_law`, what the engine runs for an `sd` chain; naive: `naive_law`; block:
  `block_law`) within 1e-12, on random chains of depth 0-3 over V = 3-5 with zeros in p and q;
- chi-square: `chain_batch` itself, many sequences at once each with its own generator, against that exact law;
- a deliberately broken variant of each kernel fails the same checks;
- a sequence's outcome does not depend on the rest of its batch, and sd and block draw what their per-sequence
  verifier draws from the same generator state (float64 p).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from multispec.errors import MultispecError
from multispec.tree import Tree
from multispec.verify import REGISTRY
from multispec.verify import batched
from multispec.verify.base import normalize_or
from multispec.verify.batched import KINDS, RoundBatch, chain_batch, chain_batch_law, greedy_batch
from multispec.verify.block import block_law, verify_block
from multispec.verify.naive import naive_law
from multispec.verify.tree_walk import walk_tree, walk_tree_greedy, walk_tree_law
from test_verifiers_sampled import ALPHA, chi2_pvalue

REFERENCE = {
    "sd": lambda tree, tokens, p, q: walk_tree_law(tree, tokens, p, q, REGISTRY["sd"]),
    "naive": naive_law,
    "block": block_law,
}


# ----------------------------------------------------------------------------------- random rounds
def random_tree(rng: np.random.Generator, max_depth: int = 3, max_width: int = 3) -> Tree:
    """A breadth-first tree of random widths (0..max_width children per node), depth <= max_depth."""
    parents, level = [-1], [0]
    for _ in range(int(rng.integers(0, max_depth + 1))):
        nxt = []
        for u in level:
            for _ in range(int(rng.integers(0, max_width + 1))):
                parents.append(u)
                nxt.append(len(parents) - 1)
        if not nxt:
            break
        level = nxt
    return Tree(tuple(parents))


def random_law(rng: np.random.Generator, v: int, keep: float = 0.7) -> np.ndarray:
    x = rng.dirichlet([0.6] * v) * (rng.random(v) < keep)
    if x.sum() == 0:
        x[rng.integers(v)] = 1.0
    return x / x.sum()


def random_chain(rng: np.random.Generator, v: int, g: int) -> tuple[Tree, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chain of g drafts: (tree, tokens [g+1], p [g+1, V], q [g+1, V]), q zero at the leaf (as the engine sends
    it). Drafts come from q, or, one time in three, uniformly (tokens q gives no mass too)."""
    p = np.stack([random_law(rng, v) for _ in range(g + 1)])
    q = np.stack([random_law(rng, v) for _ in range(g)] + [np.zeros(v)])
    tokens = [int(rng.integers(v))]
    for i in range(g):
        tokens.append(int(rng.integers(v)) if rng.random() < 1 / 3 else int(rng.choice(v, p=q[i])))
    return Tree.chain(g), torch.tensor(tokens), torch.tensor(p), torch.tensor(q)


def random_chains(rng: np.random.Generator, b: int, v: int):
    return [random_chain(rng, v, int(rng.integers(0, 4))) for _ in range(b)]


def batch_of(chains, device="cpu"):
    trees, tokens, ps, qs = zip(*chains)
    return RoundBatch.of(trees, tokens, device), torch.cat(ps).to(device), torch.cat(qs).to(device)


def gap(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in {*a, *b})


# ----------------------------------------------------------------------------------- greedy
def greedy_mismatches(seed: int, batches: int = 300) -> int:
    """Sequences of random batches (trees and chains, V = 3) where greedy_batch differs from walk_tree_greedy."""
    rng = np.random.default_rng(seed)
    bad = 0
    for _ in range(batches):
        b = int(rng.integers(1, 7))
        trees = [random_tree(rng) if rng.random() < 0.7 else Tree.chain(int(rng.integers(0, 5))) for _ in range(b)]
        tokens = [rng.integers(0, 3, len(t)).tolist() for t in trees]
        best = [rng.integers(0, 3, len(t)).tolist() for t in trees]
        got = greedy_batch(RoundBatch.of(trees, tokens), torch.tensor(sum(best, []))).outcomes()
        want = [walk_tree_greedy(t, tok, bst) for t, tok, bst in zip(trees, tokens, best)]
        bad += sum(g != w for g, w in zip(got, want))
    return bad


def test_greedy_equals_walk_tree_greedy():
    assert greedy_mismatches(seed=0) == 0


def test_greedy_takes_the_first_of_equal_siblings():
    # root -> (1, 1, 2); the first 1 has one child 5, the second 1 has two children (5, 1)
    tree = Tree((-1, 0, 0, 0, 1, 2, 2))
    tokens = [7, 1, 1, 2, 5, 5, 1]
    best = [1, 5, 1, 0, 3, 0, 0]
    stop = [1, 9, 1, 0, 3, 0, 0]  # node 1 matches, its child does not: the second 1 would have gone further
    batch = RoundBatch.of([tree, Tree.chain(0), tree], [tokens, [4], tokens])
    got = greedy_batch(batch, torch.tensor(best + [6] + stop)).outcomes()
    assert got == [((0, 1, 4), 3), ((0,), 6), ((0, 1), 9)]
    assert got == [walk_tree_greedy(tree, tokens, best), ((0,), 6), walk_tree_greedy(tree, tokens, stop)]


def test_greedy_that_takes_the_last_matching_sibling_is_caught(monkeypatch):
    def last_matching_child(parent, match):
        idx = torch.arange(parent.shape[0])
        return torch.full_like(idx, -1).scatter_reduce(0, parent, torch.where(match, idx, -1), reduce="amax")

    monkeypatch.setattr(batched, "_first_matching_child", last_matching_child)
    assert greedy_mismatches(seed=0) > 0


# ----------------------------------------------------------------------------------- exact law
def law_gap(kind: str, seed: int = 0, batches: int = 40) -> float:
    """The largest gap between chain_batch_law and the per-sequence reference law over random chain batches."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(batches):
        chains = random_chains(rng, int(rng.integers(1, 6)), int(rng.integers(3, 6)))
        laws = chain_batch_law(*batch_of(chains), kind)
        for law, (tree, tokens, p, q) in zip(laws, chains):
            assert abs(sum(law.values()) - 1) < 1e-12
            worst = max(worst, gap(law, REFERENCE[kind](tree, tokens, p, q)))
    return worst


@pytest.mark.parametrize("kind", KINDS)
def test_exact_law_equals_the_per_sequence_verifier(kind):
    assert law_gap(kind) < 1e-12


def test_sd_on_point_masses_has_the_naive_law():
    """naive is sd's formula with q a point mass at each draft: sd's kernel given those q has naive_law."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        chains = random_chains(rng, 4, 4)
        point = []
        for tree, tokens, p, _ in chains:
            q = torch.zeros_like(p)
            q[torch.arange(len(tree) - 1), tokens[1:]] = 1.0
            point.append((tree, tokens, p, q))
        for law, (tree, tokens, p, q) in zip(chain_batch_law(*batch_of(point), "sd"), point):
            assert gap(law, naive_law(tree, tokens, p, q)) < 1e-12


# ----------------------------------------------------------------------------------- chi-square
REPS = 20_000  # draws per distinct sequence


def chi_square_pvalues(kind: str, seed: int, reps: int = REPS) -> list[float]:
    """Four fixed chains (depths 0-3, V = 4), each repeated `reps` times in ONE batch with its own generator per
    sequence; each chain's empirical outcome law is chi-squared against its reference's exact law."""
    rng = np.random.default_rng(19)  # chains whose laws have 3 to 9 outcomes under each kind
    base = [random_chain(rng, 4, g) for g in (0, 1, 2, 3)]
    chains = [c for c in base for _ in range(reps)]
    gens = [torch.Generator().manual_seed(seed * 1_000_003 + i) for i in range(len(chains))]
    out = chain_batch(*batch_of(chains), gens, kind).outcomes()
    pvalues = []
    for i, (tree, tokens, p, q) in enumerate(base):
        law = REFERENCE[kind](tree, tokens, p, q)
        seen = out[i * reps : (i + 1) * reps]
        keys = sorted({*law, *seen})
        counts = np.array([sum(1 for o in seen if o == k) for k in keys], dtype=float)
        pvalues.append(chi2_pvalue(counts, reps * np.array([law.get(k, 0.0) for k in keys])))
    return pvalues


def chi_square_passes(kind: str, seed: int) -> bool:
    """Every chain passes (a chain that fails by chance, one in a thousand, is given a second independent run)."""
    first = chi_square_pvalues(kind, seed)
    if min(first) >= ALPHA:
        return True
    second = chi_square_pvalues(kind, seed + 1)
    return all(max(a, b) >= ALPHA for a, b in zip(first, second))


@pytest.mark.parametrize("kind", KINDS)
def test_chi_square_of_the_production_kernel(kind):
    assert chi_square_passes(kind, seed=0)


# ----------------------------------------------------------------------------------- broken variants
BROKEN = {
    # sd: the residual drawn from p instead of norm((p - q)_+)
    "sd": ("_sd_residual", lambda p_rows, q_rows: p_rows),
    # naive: the rejected draft not removed from p
    "naive": ("_naive_residual", lambda p_rows, x: p_rows),
    # block: token-level weights (w_i = min(1, p(x_i) / q(x_i)) of this draft only) under block's stop rule
    "block": ("_block_weights", lambda batch, px, qx: torch.where(
        batch.depth == 0, 1.0, torch.where(qx > 0, (px / qx).clamp_max(1.0), 0.0))),
}


@pytest.mark.parametrize("kind", KINDS)
def test_broken_kernel_fails_the_exact_law(kind, monkeypatch):
    monkeypatch.setattr(batched, *BROKEN[kind])
    assert law_gap(kind) > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_broken_kernel_fails_the_chi_square(kind, monkeypatch):
    monkeypatch.setattr(batched, *BROKEN[kind])
    assert not chi_square_passes(kind, seed=5)


def test_block_with_an_unweighted_residual_fails_the_exact_law(monkeypatch):
    """The residual forgets w_tau: norm((p - q)_+). It moves little mass on random chains (a stop at tau < g with
    w_tau < 1), too little for the chi-square's fixed chains; the exact law sees it."""
    monkeypatch.setattr(batched, "_block_residual", lambda w, p_rows, q_rows: normalize_or(
        (p_rows - q_rows).clamp_min(0), p_rows))
    assert law_gap("block") > 1e-3


# ----------------------------------------------------------------------------------- draws
@pytest.mark.parametrize("kind", KINDS)
def test_a_sequence_draws_the_same_alone_and_in_a_batch(kind):
    rng = np.random.default_rng(9)
    for trial in range(20):
        chains = random_chains(rng, 6, 5)
        seeds = [100 * trial + i for i in range(len(chains))]
        together = chain_batch(*batch_of(chains), [torch.Generator().manual_seed(s) for s in seeds], kind).outcomes()
        alone = [chain_batch(*batch_of([c]), [torch.Generator().manual_seed(s)], kind).outcomes()[0]
                 for c, s in zip(chains, seeds)]
        assert together == alone


def test_sd_and_block_draw_what_their_per_sequence_verifier_draws():
    """float64 p, same generator state: the first round's outcome is the per-sequence verifier's, draw for draw."""
    rng = np.random.default_rng(4)
    reference = {"sd": lambda tree, tokens, p, q, gen: walk_tree(tree, tokens, p, q, REGISTRY["sd"], gen),
                 "block": verify_block}
    for kind, verify in reference.items():
        for trial in range(40):
            chains = random_chains(rng, 5, 4)
            seeds = [7 * trial + i for i in range(len(chains))]
            got = chain_batch(*batch_of(chains), [torch.Generator().manual_seed(s) for s in seeds], kind).outcomes()
            want = [verify(*c, torch.Generator().manual_seed(s)) for c, s in zip(chains, seeds)]
            assert got == want, kind


def test_one_generator_for_the_batch_and_a_law_with_no_mass():
    rng = np.random.default_rng(2)
    batch, p, q = batch_of(random_chains(rng, 3, 4))
    a = chain_batch(batch, p, q, torch.Generator().manual_seed(1), "sd").outcomes()
    assert a == chain_batch(batch, p, q, torch.Generator().manual_seed(1), "sd").outcomes()
    with pytest.raises(MultispecError):
        chain_batch(batch, torch.zeros_like(p), q, torch.Generator(), "naive").outcomes()
    with pytest.raises(MultispecError, match="chains"):
        chain_batch(RoundBatch.of([Tree.from_shape((2,))], [[0, 1, 2]]), p[:3], q[:3], None, "sd")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_the_device_as_on_the_cpu():
    """p, q and the batch on the GPU, CPU generators (as the engine's): the outcomes of the CPU run."""
    rng = np.random.default_rng(8)
    chains = random_chains(rng, 32, 50)
    seeds = list(range(len(chains)))
    for kind in KINDS:
        cpu = chain_batch(*batch_of(chains), [torch.Generator().manual_seed(s) for s in seeds], kind).outcomes()
        gpu = chain_batch(*batch_of(chains, "cuda"), [torch.Generator().manual_seed(s) for s in seeds], kind)
        assert gpu.next_token.device.type == "cuda"
        assert gpu.outcomes() == cpu, kind
    trees = [random_tree(rng) for _ in range(16)]
    tokens = [rng.integers(0, 3, len(t)).tolist() for t in trees]
    best = torch.tensor(rng.integers(0, 3, sum(len(t) for t in trees)))
    assert greedy_batch(RoundBatch.of(trees, tokens, "cuda"), best.cuda()).outcomes() == \
        greedy_batch(RoundBatch.of(trees, tokens), best).outcomes()
