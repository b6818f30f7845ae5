"""Sequence verifiers (block, traversal, univer, naive) are lossless: exact enumeration of the committed-token law.

A toy model with arbitrary context dependence: p(.|prefix) and q(.|prefix) are drawn per prefix from a seeded
generator (V <= 5), in five regimes: random with zeros, disjoint supports, p = q, one-hot q, and q that misses
tokens p needs. Every drafted chain or tree of a shape is enumerated with its exact probability under the
verifier's own draft law; the verifier's exact law (`law`, the production code with coins -> probabilities) is
pushed through, each round's committed tokens are completed by the target law to M = depth + 1 tokens, and the
result must equal the target's law of M tokens within 1e-9. Deliberately broken variants must fail the same
check, and sampling (`verify`) is chi-squared against `law` on fixed drafted trees.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from multispec.errors import MultispecError
from multispec.tree import Tree
from multispec.verify import block, traversal
from multispec.verify.sequence import SEQUENCE_REGISTRY, get_sequence_verifier

REGIMES = ("random", "disjoint", "equal", "onehot", "holes")



class Toy:
    """p(.|prefix) (target) and q(.|prefix) (draft) over V tokens, float64, fixed per (regime, seed, prefix)."""

    def __init__(self, vocab: int, regime: str, seed: int):
        self.v, self.regime, self.seed = vocab, regime, seed
        self._cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def _sparse(self, rng, keep: float) -> np.ndarray:
        x = rng.dirichlet([0.6] * self.v) * (rng.random(self.v) < keep)
        if x.sum() == 0:
            x[rng.integers(self.v)] = 1.0
        return x / x.sum()

    def pq(self, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in self._cache:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            p = self._sparse(rng, 0.75)
            if self.regime == "random":
                q = self._sparse(rng, 0.75)
            elif self.regime == "disjoint":
                p = np.where(np.arange(self.v) % 2 == 0, rng.random(self.v) + 0.1, 0.0)
                q = np.where(np.arange(self.v) % 2 == 1, rng.random(self.v) + 0.1, 0.0)
                p, q = p / p.sum(), q / q.sum()
            elif self.regime == "equal":
                q = p
            elif self.regime == "onehot":
                q = np.eye(self.v)[rng.integers(self.v)]
            else:  # holes: q puts no mass on p's most likely token
                q = self._sparse(rng, 1.0)
                q[int(np.argmax(p))] = 0.0
                q = q / q.sum() if q.sum() > 0 else np.eye(self.v)[0]
            self._cache[prefix] = (torch.tensor(p), torch.tensor(q))
        return self._cache[prefix]

    def seq_law(self, prefix: tuple[int, ...], length: int) -> np.ndarray:
        """float [V] * length: the target's law of the next `length` tokens after prefix."""
        out = np.zeros((self.v,) * length)
        for s in itertools.product(range(self.v), repeat=length):
            prob = 1.0
            for t in range(length):
                prob *= float(self.pq(prefix + s[:t])[0][s[t]])
                if prob == 0:
                    break
            out[s] = prob
        return out


def drafted_trees(toy: Toy, shape: tuple[int, ...], law_fn):
    """Yield (probability, tree, tokens [N], p [N, V], q [N, V]) for every drafted tree of `shape`; q is zero
    at nodes without children, as the engine sends it."""
    tree = Tree.from_shape(shape)
    n = len(tree)
    parents = [u for u in range(n) if tree.children[u]]

    def prefix_of(u: int, tokens: list[int]) -> tuple[int, ...]:
        return tuple(tokens[a] for a in tree.path_to(u)[1:])

    def extend(i: int, tokens: list[int], weight: float):
        if i == len(parents):
            p = torch.stack([toy.pq(prefix_of(u, tokens))[0] for u in range(n)])
            q = torch.stack([toy.pq(prefix_of(u, tokens))[1] if tree.children[u] else torch.zeros(toy.v,
                             dtype=torch.float64) for u in range(n)])
            yield weight, tree, torch.tensor(tokens), p, q
            return
        u = parents[i]
        kids = tree.children[u]
        drafts, weights = law_fn(toy.pq(prefix_of(u, tokens))[1], len(kids))
        for d, w in zip(drafts.tolist(), weights.tolist()):
            if w > 0:
                new = list(tokens)
                for kid, tok in zip(kids, d):
                    new[kid] = tok
                yield from extend(i + 1, new, weight * w)

    yield from extend(0, [0] * n, 1.0)


def committed_law(toy: Toy, spec, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(law, want): the round's committed tokens completed by the target law to M = depth + 1 tokens, and the
    target's own law of M tokens. Both float [V] * M."""
    m = len(shape) + 1
    law = np.zeros((toy.v,) * m)
    for weight, tree, tokens, p, q in drafted_trees(toy, shape, spec.draft.law_fn):
        for (path, nxt), mass in spec.law(tree, tokens, p, q).items():
            committed = tuple(int(tokens[u]) for u in path[1:]) + (nxt,)
            rest = toy.seq_law(committed, m - len(committed)) if len(committed) < m else np.ones(())
            law[committed] += weight * mass * rest
    return law, toy.seq_law((), m)


CHAINS = [(1,), (1, 1), (1, 1, 1), (1, 1, 1, 1)]
TREES = [(3, 2), (2, 1, 2), (3, 1, 1), (1, 3, 1), (2, 2)]


def _vocab(shape):
    return 5 if all(w == 1 for w in shape) and len(shape) <= 3 else (4 if shape in [(1, 1, 1, 1), (2, 2)] else 3)


@pytest.mark.parametrize("name", ["block", "traversal", "naive"])
@pytest.mark.parametrize("regime", REGIMES)
def test_chains_are_lossless(name, regime):
    spec = SEQUENCE_REGISTRY[name]
    for i, shape in enumerate(CHAINS):
        law, want = committed_law(Toy(_vocab(shape), regime, seed=11 + i), spec, shape)
        assert abs(law.sum() - 1) < 1e-9
        assert np.abs(law - want).max() < 1e-9, f"{name} {regime} {shape}: {np.abs(law - want).max()}"


@pytest.mark.parametrize("name", ["traversal", "naive"])
@pytest.mark.parametrize("regime", REGIMES)
def test_trees_are_lossless(name, regime):
    spec = SEQUENCE_REGISTRY[name]
    for i, shape in enumerate(TREES):
        law, want = committed_law(Toy(_vocab(shape), regime, seed=23 + i), spec, shape)
        assert np.abs(law - want).max() < 1e-9, f"{name} {regime} {shape}: {np.abs(law - want).max()}"


def test_traversal_equals_block_on_chains():
    toy = Toy(4, "random", seed=5)
    for _, tree, tokens, p, q in drafted_trees(toy, (1, 1, 1), SEQUENCE_REGISTRY["block"].draft.law_fn):
        a = block.block_law(tree, tokens, p, q)
        b = traversal.traversal_law(tree, tokens, p, q)
        assert max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in {*a, *b}) < 1e-12


def _gap(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in {*a, *b})


def test_naive_has_the_optimal_law_on_point_masses():
    """On deterministic drafts no lossless verifier reaches child x with more than p(x), and naive has the exact
    law of block and traversal on point-mass chains (lookup) and of the rrs-wor walk with first-child point masses
    on trees of distinct siblings (suffix)."""
    from multispec.drafting.lookup import one_hot_law
    from multispec.drafting.suffix import first_child_law
    from multispec.verify import REGISTRY
    from multispec.verify.naive import naive_law
    from multispec.verify.tree_walk import walk_tree_law

    toy = Toy(4, "random", seed=13)
    for _, tree, tokens, p, _ in itertools.islice(drafted_trees(toy, (1, 1, 1), REGISTRY["sd"].law_fn), 20):
        q = one_hot_law(tokens, 4, len(tree)).double()
        law = naive_law(tree, tokens, p, q)
        assert _gap(law, block.block_law(tree, tokens, p, q)) < 1e-12
        assert _gap(law, traversal.traversal_law(tree, tokens, p, q)) < 1e-12
    for _, tree, tokens, p, _ in itertools.islice(drafted_trees(toy, (3, 2), REGISTRY["rrs-wor"].law_fn), 20):
        q = first_child_law(tree, tokens, 4).double()
        assert _gap(naive_law(tree, tokens, p, q), walk_tree_law(tree, tokens, p, q, REGISTRY["rrs-wor"])) < 1e-12


def test_block_accepts_more_than_token_level_on_average():
    """Expected accepted length over the draft law: block >= token-level sd (Sun et al.), strictly here."""
    toy = Toy(4, "random", seed=7)
    shape = (1, 1, 1)
    means = {}
    for name in ("sd", "block"):
        spec = get_sequence_verifier(name)
        means[name] = sum(w * m * (len(path) - 1)
                          for w, tree, tokens, p, q in drafted_trees(toy, shape, spec.draft.law_fn)
                          for (path, _), m in spec.law(tree, tokens, p, q).items())
    assert means["block"] > means["sd"] + 1e-3, means


# ----------------------------------------------------------------------------- broken variants
def _max_error(spec, shapes, regime="random") -> float:
    return max(np.abs(np.subtract(*committed_law(Toy(_vocab(s), regime, seed=31 + i), spec, s))).max()
               for i, s in enumerate(shapes))


def test_block_with_an_unweighted_residual_is_caught(monkeypatch):
    monkeypatch.setattr(block, "_residual", lambda w, p_row, q_row: block.normalize_or(
        (p_row - q_row).clamp_min(0)[None], p_row[None])[0])  # forgets the weight w_tau
    assert _max_error(SEQUENCE_REGISTRY["block"], CHAINS[1:3]) > 1e-3


def test_block_that_stops_at_the_first_failure_is_caught(monkeypatch):
    """Token-level weights (w_i = ratio of this token only) with the block's stop rule: not lossless."""
    def token_level(tokens, p, q, g):
        w = [1.0]
        for i in range(1, g + 1):
            x = int(tokens[i])
            w.append(min(1.0, float(p[i - 1, x]) / float(q[i - 1, x])) if q[i - 1, x] > 0 else 0.0)
        return w

    monkeypatch.setattr(block, "_weights", token_level)
    assert _max_error(SEQUENCE_REGISTRY["block"], CHAINS[1:3]) > 1e-3


def test_naive_that_draws_from_q_where_there_are_children_is_caught(monkeypatch):
    """The broken variant draws a node's token from the draft's q where the node has children (the law the drafts
    came from, not the target's)."""
    from multispec.verify import naive

    monkeypatch.setattr(naive, "_law", lambda p, q, node: q[node] if float(q[node].sum()) > 0 else p[node])
    assert _max_error(SEQUENCE_REGISTRY["naive"], [(2, 1), (1, 1)]) > 1e-3


def test_traversal_that_does_not_renormalise_q_is_caught(monkeypatch):
    monkeypatch.setattr(traversal, "_drop_draft", lambda Q, x: Q)
    assert _max_error(SEQUENCE_REGISTRY["traversal"], [(3, 2), (2, 1, 2)]) > 1e-3


def test_traversal_with_token_level_child_weights_is_caught(monkeypatch):
    """Children weighted by their own ratio only (the node walk's rule) inside the traversal: not lossless."""
    monkeypatch.setattr(traversal, "_child_weight", lambda state, x: min(
        1.0, float(state.P[x]) / float(state.Q[x])) if state.Q[x] > 0 else 0.0)
    assert _max_error(SEQUENCE_REGISTRY["traversal"], [(2, 1, 2), (1, 1, 1)]) > 1e-3


# ----------------------------------------------------------------------------- sampling = exact law
@pytest.mark.parametrize("name,shape", [("block", (1, 1, 1)), ("naive", (2, 2, 1)), ("traversal", (2, 2, 1)),
                                        ("univer", (2, 2, 1)), ("univer-ot", (2, 1))])
def test_sampling_matches_the_exact_law(name, shape):
    spec = SEQUENCE_REGISTRY[name]
    toy = Toy(4, "random", seed=3)
    gen = torch.Generator().manual_seed(0)
    # the most probable drafted tree whose law has several outcomes
    _, tree, tokens, p, q = max(itertools.islice(drafted_trees(toy, shape, spec.draft.law_fn), 400),
                                key=lambda item: item[0] * len(spec.law(*item[1:])))
    law = spec.law(tree, tokens, p, q)
    assert abs(sum(law.values()) - 1) < 1e-12 and len(law) > 3
    trials = 1500
    counts = dict.fromkeys(law, 0)
    for _ in range(trials):
        outcome = spec.verify(tree, tokens, p, q, gen)
        assert outcome in law, f"{outcome} has probability 0"
        counts[outcome] += 1
    keys = sorted(law, key=law.get)
    exp = np.array([trials * law[k] for k in keys])
    obs = np.array([counts[k] for k in keys], dtype=float)
    small = np.cumsum(exp) < 5
    exp, obs = np.append(exp[~small], exp[small].sum()), np.append(obs[~small], obs[small].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    assert chi2.sf(stat, keep.sum() - 1) >= 1e-3


def test_block_refuses_a_branching_tree():
    tree = Tree.from_shape((2, 1))
    p = torch.full((len(tree), 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(MultispecError, match="chain"):
        SEQUENCE_REGISTRY["block"].verify(tree, torch.zeros(len(tree), dtype=torch.long), p, p, None)
    with pytest.raises(MultispecError, match="chains only"):
        SEQUENCE_REGISTRY["block"].check_widths((2, 1))


def test_unknown_verifier_lists_every_name():
    with pytest.raises(MultispecError, match="block.*traversal"):
        get_sequence_verifier("nope")


def test_one_level_equals_the_node_verifiers():
    """On a single level block is `sd` and traversal is `rrs-wor`, outcome by outcome (why the P3 per-position
    report has no column of their own). Padding drafts (q = 0, drafted when q's support is smaller than the
    width) are left out: the walk routes a residual token equal to one into it, traversal does not."""
    toy = Toy(4, "random", seed=9)
    for shape, name, node in (((1,), "block", "sd"), ((3,), "traversal", "rrs-wor"), ((2,), "traversal", "rrs-wor")):
        seq, walk = SEQUENCE_REGISTRY[name], get_sequence_verifier(node)
        for _, tree, tokens, p, q in drafted_trees(toy, shape, walk.draft.law_fn):
            if (q[0, tokens[1:]] == 0).any():
                continue
            a, b = seq.law(tree, tokens, p, q), walk.law(tree, tokens, p, q)
            assert max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in {*a, *b}) < 1e-12, (name, tokens)


def test_methods_take_the_sequence_verifiers_where_their_shapes_fit():
    from multispec.decoding.methods import build_method

    assert build_method("sd", k=6, verifier="block").verifier == "block"
    assert build_method("specdecpp", verifier="block").verifier == "block"
    assert build_method("dynamic", width=1, depth=4, verifier="block").lossless
    assert build_method("mcsd", tree=(1, 1, 1), verifier="block").verifier == "block"
    assert build_method("mcsd", verifier="traversal").lossless
    assert build_method("dynamic", width=3, verifier="traversal").verifier == "traversal"
    assert build_method("ti-mcsd", tree=(1, 2, 2), verifier="traversal").lossless
    for name, options, message in [
        ("sd", {"verifier": "traversal"}, "verifier 'sd'.*or 'block'"),
        ("specdecpp", {"verifier": "rrs"}, "or 'block'"),
        ("mcsd", {"tree": (4, 2), "verifier": "block"}, "chains only"),
        ("dynamic", {"width": 2, "verifier": "block"}, "chains only"),
        ("mcsd", {"verifier": "nope"}, "unknown verifier 'nope'.*traversal"),
        ("ti-mcsd", {"tree": (2, 2, 1), "verifier": "traversal"}, "width 1"),
    ]:
        with pytest.raises(MultispecError, match=message):
            build_method(name, **options)


# ----------------------------------------------------------------------------- univer (verify/univer.py)
@pytest.mark.parametrize("regime", REGIMES)
def test_univer_trees_and_chains_are_lossless(regime):
    """`univer` (greedy-md drafts) on every tree and chain shape, depth <= 3 (4 on chains), width <= 3, V <= 5."""
    spec = SEQUENCE_REGISTRY["univer"]
    for i, shape in enumerate(TREES + CHAINS):
        law, want = committed_law(Toy(_vocab(shape), regime, seed=23 + i), spec, shape)
        assert np.abs(law - want).max() < 1e-9, f"univer {regime} {shape}: {np.abs(law - want).max()}"


@pytest.mark.parametrize("regime", ["random", "holes"])
def test_univer_ot_trees_are_lossless(regime):
    """`univer-ot` (i.i.d. drafts, the exact ot plan at each node; slower to enumerate: three shapes, two
    regimes)."""
    spec = SEQUENCE_REGISTRY["univer-ot"]
    for i, shape in enumerate([(2, 1, 2), (3, 2), (1, 1, 1)]):
        law, want = committed_law(Toy(3, regime, seed=41 + i), spec, shape)
        assert np.abs(law - want).max() < 1e-9, f"univer-ot {regime} {shape}: {np.abs(law - want).max()}"


def _mean_accepted(name: str, toy: Toy, shape) -> float:
    spec = get_sequence_verifier(name)
    return sum(w * m * (len(path) - 1) for w, tree, tokens, p, q in drafted_trees(toy, shape, spec.draft.law_fn)
               for (path, _), m in spec.law(tree, tokens, p, q).items())


def test_univer_is_greedy_md_on_one_level_and_block_on_chains_and_gains_with_depth():
    """On one level univer's law is the greedy-md node verifier's (the optimum for that draft law), on a chain
    block's, outcome by outcome; on deeper trees it accepts at least as much as the greedy-md walk on average,
    strictly more here (a rejected leaf hands its mass back to its parent)."""
    univer = SEQUENCE_REGISTRY["univer"]
    for shape, other in (((2,), "greedy-md"), ((3,), "greedy-md"), ((1, 1, 1), "block")):
        ref = get_sequence_verifier(other)
        for _, tree, tokens, p, q in drafted_trees(Toy(4, "random", seed=9), shape, univer.draft.law_fn):
            a, b = univer.law(tree, tokens, p, q), ref.law(tree, tokens, p, q)
            assert max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in {*a, *b}) < 1e-12, (shape, tokens)
    for seed, shape in ((0, (2, 1, 2)), (2, (3, 2)), (3, (2, 1, 2))):
        toy = Toy(4, "random", seed=seed)
        assert _mean_accepted("univer", toy, shape) > _mean_accepted("greedy-md", toy, shape) + 1e-3


def test_univer_with_unconditioned_child_scalings_is_caught(monkeypatch):
    """Each child visited with its plan's match probability itself (not divided by what its elder siblings
    left): the walk then under-weights younger children. Not lossless."""
    from multispec.verify import univer

    monkeypatch.setattr(univer, "child_scalings", lambda acc: [float(x) for x in acc])
    assert _max_error(SEQUENCE_REGISTRY["univer"], [(2, 1, 2), (3, 2)]) > 1e-3


def test_univer_without_the_bottom_outcome_is_caught():
    """A local plan that forgets the 'node rejected' outcome (a = 1 below the root: token-level acceptance inside
    the sequence-level walk, so the first child with any match always wins). Not lossless."""
    import dataclasses

    from multispec.verify import univer

    def forgetful(p, q, a, drafts):
        return univer.greedy_plan(p, q, 1.0 if a > 0 else a, drafts)

    broken = dataclasses.replace(SEQUENCE_REGISTRY["univer"],
                                 law_fn=lambda t, x, p, q: univer.univer_law(t, x, p, q, forgetful))
    assert _max_error(broken, [(2, 1, 2), (1, 1, 1)]) > 1e-3
