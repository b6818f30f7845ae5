"""Structured output stays lossless under speculation: exact enumeration over a tiny vocabulary (issue 39).

With a grammar, the target's law is its processed law masked to what the grammar allows after each prefix,
renormalised. A byte-level tokenizer of four tokens (a, b, c, EOS) and the regex `a(b|c)a?c` (a forced first token,
a branch, an optional token, an end) drive the production code: GrammarState masks every node of a drafted tree
along its own path (CommittedHistory.for_nodes), the draft's law q is masked the same way, the verifier's exact law
(`law`) gives each round's committed tokens, the grammar's forced tokens follow (CommittedHistory.forced), and the
target law completes them to M tokens. The result must equal the masked target's own law of M tokens, computed
token by token by independent code (the regex's finite language, listed here), within 1e-9. Two broken variants
must fail the same check: every node masked with the committed text's state (its own path ignored), and drafts
drawn from the unmasked draft law while the verifier is told the masked one.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from multispec.errors import MultispecError
import torch

from multispec import structured
from multispec.decoding.node_history import CommittedHistory
from multispec.sampling import SamplingConfig, process_logits
from multispec.tree import Tree
from multispec.verify.sequence import get_sequence_verifier

EOS, V = 3, 4
WORDS = "abc"
REGEX = "a(b|c)a?c"
LANGUAGE = ("abc", "acc", "abac", "acac")  # what REGEX matches, listed by hand: the reference's grammar
CASES = [("sd", (1, 1, 1)), ("block", (1, 1)), ("rrs-wor", (2, 2)), ("traversal", (2, 1, 2)), ("kseq", (2, 2))]


def tiny_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE({w: i for i, w in enumerate(WORDS)}, merges=[]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken("</s>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="</s>")


@pytest.fixture(scope="module")
def grammar():
    return structured.bind(structured.Constraint.of(regex=REGEX), tiny_tokenizer(), V, {EOS})


def reference_allowed(output: tuple[int, ...]) -> torch.Tensor:
    """What the grammar allows after `output`, from the listed language; after an EOS, anything (the output ended
    there and is cut)."""
    if EOS in output:
        return torch.ones(V, dtype=torch.bool)
    text = "".join(WORDS[t] for t in output)
    allowed = torch.tensor([any(s.startswith(text + w) for s in LANGUAGE) for w in WORDS] + [text in LANGUAGE])
    return allowed if bool(allowed.any()) else torch.ones(V, dtype=torch.bool)


class RawToy:
    def __init__(self, seed: int):
        self.seed = seed

    def logits(self, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        target, draft = _raw(self.seed, prefix)  # (drawn once per prefix; copies, so no caller can edit them)
        return target.clone(), draft.clone()


@functools.lru_cache(maxsize=None)
def _raw(seed: int, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng([seed, len(prefix), *prefix])
    return torch.tensor(rng.normal(0, 1.5, V)), torch.tensor(rng.normal(0, 1.5, V))



def reference_p(toy: RawToy, output: tuple[int, ...]) -> torch.Tensor:
    """The masked target law after `output`, by plain code: disallowed logits to -inf, softmax."""
    raw = toy.logits(output)[0].clone()
    raw[~reference_allowed(output)] = float("-inf")
    return torch.softmax(raw, -1)


def seq_law(toy, prefix: tuple[int, ...], length: int) -> np.ndarray:
    """float64 [V] * length: the masked target's law of the next `length` tokens after `prefix`."""
    return _seq_law(toy.seed, prefix, length).copy()


@functools.lru_cache(maxsize=None)
def _seq_law(seed: int, prefix: tuple[int, ...], length: int) -> np.ndarray:
    """seq_law, computed once per (toy, prefix, length): the enumerations ask for the same completions many times
    (a pure function of its arguments, by plain code)."""
    toy = RawToy(seed)
    out = np.zeros((V,) * length)
    for s in itertools.product(range(V), repeat=length):
        prob = 1.0
        for t in range(length):
            prob *= float(reference_p(toy, prefix + s[:t])[s[t]])
            if prob == 0:
                break
        out[s] = prob
    return out


def committed_law(toy: RawToy, grammar, spec, shape, unmasked_drafts: bool = False):
    """(law of a round's committed tokens plus the forced ones, completed to M tokens; the masked target's own law
    of M tokens). The round starts after the first (forced) token 'a' is committed."""
    sampling = SamplingConfig(1.0, grammar=grammar)
    tree = Tree.from_shape(shape)
    n, m = len(tree), len(shape) + 2
    start = (0,)  # 'a', committed: the round's root
    history = CommittedHistory([1], V, {EOS}, grammar)
    history.commit(list(start))
    parents = [u for u in range(n) if tree.children[u]]
    law = np.zeros((V,) * m)

    def path_tokens(u, tokens):
        return start + tuple(tokens[a] for a in tree.path_to(u)[1:])

    drafted_laws: dict = {}

    def draft_q(u, tokens, masked=True):
        # once per (node, path): the same node and path were asked for again at every enumerated tree below them
        key = (u, masked, path_tokens(u, tokens))
        if key not in drafted_laws:
            raw = toy.logits(key[2])[1][None]
            if masked:
                q = process_logits(raw, sampling, history.for_nodes(tree, torch.tensor(tokens), [u], V))[0]
            else:
                q = process_logits(raw, SamplingConfig(1.0))[0]
            drafted_laws[key] = q.double()
        return drafted_laws[key].clone()

    def extend(i, tokens, weight):
        if i == len(parents):
            t = torch.tensor(tokens)
            raw = torch.stack([toy.logits(path_tokens(u, tokens))[0] for u in range(n)])
            p = process_logits(raw, sampling, history.for_nodes(tree, t, range(n), V)).double()  # production
            q = torch.stack([draft_q(u, tokens) if tree.children[u] else torch.zeros(V, dtype=torch.float64)
                             for u in range(n)])
            for (path, nxt), mass in spec.law(tree, t, p, q).items():
                committed = tuple(tokens[u] for u in path[1:]) + (nxt,)
                after = CommittedHistory([1], V, {EOS}, grammar)
                after.commit(list(start + committed))
                committed += tuple(after.forced(m - 1 - len(committed)))  # production: probability-1 tokens
                full = start + committed
                rest = seq_law(toy, full, m - len(full)) if len(full) < m else 1.0
                law[full] += weight * mass * rest
            return
        u = parents[i]
        kids = tree.children[u]
        drafts, weights = spec.draft.law_fn(draft_q(u, tokens, masked=not unmasked_drafts), len(kids))
        for d, w in zip(drafts.tolist(), weights.tolist()):
            if w > 0:
                new = list(tokens)
                for kid, tok in zip(kids, d):
                    new[kid] = tok
                extend(i + 1, new, weight * w)

    extend(0, [start[-1]] + [0] * (n - 1), 1.0)
    return law, seq_law(toy, (), m)


@pytest.mark.parametrize("verifier,shape", CASES, ids=[f"{v}-{'x'.join(map(str, s))}" for v, s in CASES])
def test_masked_law_is_kept_by_every_verifier(grammar, verifier, shape):
    law, want = committed_law(RawToy(seed=5), grammar, get_sequence_verifier(verifier), shape)
    assert abs(law.sum() - 1) < 1e-9
    assert np.abs(law - want).max() < 1e-9, np.abs(law - want).max()


def test_the_grammar_really_constrains(grammar):
    """Against a vacuous pass: the reference masks differ by path, the production masks agree with them on every
    prefix of the language, and the first token and the end are forced."""
    for n in range(1, 5):
        for prefix in itertools.product(range(3), repeat=n - 1):
            text = "".join(WORDS[t] for t in prefix)
            if not any(s.startswith(text) for s in LANGUAGE):
                continue
            state = grammar.start()
            state.commit(list(prefix))
            assert torch.equal(state.mask(V), reference_allowed(prefix)), text
    assert not torch.equal(reference_allowed((0, 1)), reference_allowed((0, 1, 0)))
    h = CommittedHistory([1], V, {EOS}, grammar)
    assert h.forced(10) == [0]  # 'a'
    h.commit([1])  # 'ab'
    assert h.forced(10) == []  # 'a' or 'c' next
    h.commit([0])  # 'aba'
    assert h.forced(10) == [2, EOS]  # 'c', then the end


def _root_only(self, tree, tokens, rows, vocab):
    """Broken: every node masked with the committed text's state, as if drafted tokens were not part of it."""
    return self.mask(vocab)[None].expand(len(list(rows)), -1)


@pytest.mark.parametrize("verifier,shape", [("sd", (1, 1, 1)), ("traversal", (2, 1, 2))])
def test_nodes_masked_with_the_committed_state_are_caught(grammar, monkeypatch, verifier, shape):
    monkeypatch.setattr(structured.GrammarState, "node_masks", _root_only)
    try:
        law, want = committed_law(RawToy(seed=5), grammar, get_sequence_verifier(verifier), shape)
    except MultispecError as e:  # caught by the production code itself: it commits a token the grammar refuses
        assert "the grammar engine refused the output" in str(e)
        return
    assert np.abs(law - want).max() > 1e-3


@pytest.mark.parametrize("verifier,shape", [("sd", (1, 1, 1)), ("rrs-wor", (2, 2))])
def test_drafts_from_the_unmasked_draft_law_are_caught(grammar, verifier, shape):
    law, want = committed_law(RawToy(seed=5), grammar, get_sequence_verifier(verifier), shape, unmasked_drafts=True)
    assert np.abs(law - want).max() > 1e-3


def pruned_law(toy: RawToy, grammar, shape, tokens: list[int], stale_rows: bool = False) -> tuple[np.ndarray, int]:
    """The law of a round's committed tokens (forced ones after, completed to M) when a deterministic tree (lookup,
    suffix: `tokens` on `shape`, root 'a') is drafted: the production code drops the nodes the grammar refuses
    (decoding/grammar.without_refused) and `naive` verifies the rest with its point-mass law. stale_rows: the broken
    variant that prunes after the target scored the whole tree, reading the first rows of that forward."""
    from multispec.decoding.grammar import without_refused
    from multispec.drafting.proposers import Proposal
    from multispec.drafting.suffix import first_child_law

    sampling = SamplingConfig(1.0, grammar=grammar)
    full = Tree.from_shape(shape)
    m = len(shape) + 2
    start = (0,)
    history = CommittedHistory([1], V, {EOS}, grammar)
    history.commit(list(start))
    t = torch.tensor(tokens)
    q_full = first_child_law(full, t, V).double()
    prop = without_refused(Proposal(full, full, t, q_full, verifier="naive"), history.grammar)
    tree, t, q = prop.tree, prop.tokens, prop.q
    scored, st = (full, torch.tensor(tokens)) if stale_rows else (tree, t)
    raw = torch.stack([toy.logits(start + tuple(int(st[a]) for a in scored.path_to(u)[1:]))[0]
                       for u in range(len(tree))])
    p = process_logits(raw, sampling, history.for_nodes(tree, t, range(len(tree)), V)).double()
    law = np.zeros((V,) * m)
    for (path, nxt), mass in get_sequence_verifier("naive").law(tree, t, p, q).items():
        committed = tuple(int(t[u]) for u in path[1:]) + (nxt,)
        if EOS not in committed:  # (past an end the output is cut; the reference completes it with the raw law)
            after = CommittedHistory([1], V, {EOS}, grammar)
            after.commit(list(start + committed))
            committed += tuple(after.forced(m - 1 - len(committed)))
        out = start + committed
        law[out] += mass * (seq_law(toy, out, m - len(out)) if len(out) < m else 1.0)
    return law, len(tree)


def deterministic_trees(shape):
    """Every token assignment of `shape` below the root 'a' with distinct siblings (a suffix tree's drafts)."""
    tree = Tree.from_shape(shape)
    for toks in itertools.product(range(V), repeat=len(tree) - 1):
        tokens = [0, *toks]
        if all(len({tokens[c] for c in kids}) == len(kids) for kids in tree.children):
            yield tokens


@pytest.mark.parametrize("shape", [(2, 1), (1, 1, 1)])
def test_a_deterministic_tree_without_its_refused_nodes_keeps_the_masked_law(grammar, shape):
    """Lookup and suffix drafts lose the nodes the grammar refuses before the target scores them; every drafted
    tree, pruned, still commits the masked target's law (and some are pruned: the check is not vacuous)."""
    toy = RawToy(seed=7)
    pruned = 0
    for tokens in deterministic_trees(shape):
        law, kept = pruned_law(toy, grammar, shape, tokens)
        want = seq_law(toy, (), len(shape) + 2)
        assert np.abs(law - want).max() < 1e-9, (tokens, np.abs(law - want).max())
        pruned += kept < len(Tree.from_shape(shape))
    assert pruned > 0


def test_pruning_after_the_forward_is_caught(grammar):
    toy = RawToy(seed=7)
    want = seq_law(toy, (), 4)
    worst = max(np.abs(pruned_law(toy, grammar, (2, 1), tokens, stale_rows=True)[0] - want).max()
                for tokens in deterministic_trees((2, 1)))
    assert worst > 1e-3
