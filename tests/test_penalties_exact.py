"""History-dependent sampling processors stay lossless under speculation: exact enumeration (issue 27).

Penalties (repetition, presence, frequency) and min_tokens make the processed target law depend on the tokens
before each row, so in a drafted tree every node has its own processed law: that of its own path. A toy model gives
raw logits per prefix (V <= 4); every drafted tree is enumerated with its exact probability under the verifier's
draft law; each node's p is built by the production code (CommittedHistory.for_nodes + process_logits) and pushed
through the verifier's exact law (`law`); each round's committed tokens are completed by the target law to
M = depth + 1 tokens. The result must equal the processed target's own law of M tokens, computed token by token
from full histories by independent code, within 1e-9. The broken variant (every node processed with the committed
history, as if drafted tokens were not part of it) must fail the same check.
"""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch

from multispec.decoding import node_history
from multispec.decoding.node_history import CommittedHistory
from multispec.sampling import History, SamplingConfig, process_logits
from multispec.tree import Tree
from multispec.verify.sequence import get_sequence_verifier

PROMPT = (0, 1)
COMMITTED = (2,)  # one output token already committed before the round
STOP = 3  # an EOS for min_tokens
SAMPLINGS = {
    "penalties": SamplingConfig(1.0, repetition_penalty=1.8, presence_penalty=0.6, frequency_penalty=0.9),
    "penalties-topk-minp": SamplingConfig(1.2, top_k=3, min_p=0.02, repetition_penalty=0.8, frequency_penalty=-0.5,
                                          logit_bias=((1, 0.5),)),
    "min_tokens": SamplingConfig(1.0, min_tokens=3, frequency_penalty=1.5),
}
CASES = [("sd", (1, 1, 1)), ("block", (1, 1)), ("rrs-wor", (2, 2)), ("rrs", (3, 1)), ("traversal", (2, 1, 2)),
         ("kseq", (2, 2))]


@functools.lru_cache(maxsize=None)
def _raw(vocab: int, seed: int, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng([seed, len(prefix), *prefix])
    return torch.tensor(rng.normal(0, 1.5, vocab)), torch.tensor(rng.normal(0, 1.5, vocab))


class RawToy:
    """Raw target and draft logits per prefix (float64 [V]), fixed per (seed, prefix)."""

    def __init__(self, vocab: int, seed: int):
        self.v, self.seed = vocab, seed

    def logits(self, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        target, draft = _raw(self.v, self.seed, prefix)  # (drawn once per prefix; copies, so no caller can edit them)
        return target.clone(), draft.clone()


def reference_p(toy: RawToy, sampling: SamplingConfig, drafted: tuple[int, ...]) -> torch.Tensor:
    """The processed target law after COMMITTED + drafted, its history counted here by plain loops."""
    return _reference_p(toy.v, toy.seed, sampling, drafted).clone()


@functools.lru_cache(maxsize=None)
def _reference_p(vocab: int, seed: int, sampling: SamplingConfig, drafted: tuple[int, ...]) -> torch.Tensor:
    """reference_p, computed once per (toy, sampling, path): the enumerations below ask for the same paths
    thousands of times (a pure function of its arguments, so the same law every time)."""
    toy = RawToy(vocab, seed)
    output = COMMITTED + drafted
    v = toy.v
    seen = torch.tensor([[t in PROMPT + output for t in range(v)]])
    counts = torch.tensor([[float(output.count(t)) for t in range(v)]])
    history = History(seen=seen, counts=counts, out_len=torch.tensor([len(output)]), stop_ids=(STOP,))
    return process_logits(toy.logits(drafted)[0][None], sampling, history)[0].double()


def seq_law(toy, sampling, prefix: tuple[int, ...], length: int) -> np.ndarray:
    """float64 [V] * length: the processed target's law of the next `length` tokens after COMMITTED + prefix."""
    return _seq_law(toy.v, toy.seed, sampling, prefix, length).copy()


@functools.lru_cache(maxsize=None)
def _seq_law(vocab: int, seed: int, sampling: SamplingConfig, prefix: tuple[int, ...], length: int) -> np.ndarray:
    toy = RawToy(vocab, seed)
    out = np.zeros((toy.v,) * length)
    for s in itertools.product(range(toy.v), repeat=length):
        prob = 1.0
        for t in range(length):
            prob *= float(reference_p(toy, sampling, prefix + s[:t])[s[t]])
            if prob == 0:
                break
        out[s] = prob
    return out


def committed_law(toy: RawToy, sampling: SamplingConfig, spec, shape) -> tuple[np.ndarray, np.ndarray]:
    """(law of the round's committed tokens completed to M tokens, the processed target's own law of M tokens)."""
    tree = Tree.from_shape(shape)
    n, m = len(tree), len(shape) + 1
    history = CommittedHistory(list(PROMPT), toy.v, {STOP})
    history.commit(list(COMMITTED))
    parents = [u for u in range(n) if tree.children[u]]
    law = np.zeros((toy.v,) * m)

    def path_tokens(u, tokens):
        return tuple(tokens[a] for a in tree.path_to(u)[1:])

    drafted_laws: dict = {}

    def draft_q(u, tokens):  # the draft's law at u: its own logits, processed the same way along u's path
        # once per (node, path): the same node and path were asked for again at every enumerated tree below them
        key = (u, path_tokens(u, tokens))
        if key not in drafted_laws:
            raw = toy.logits(key[1])[1][None]
            drafted_laws[key] = process_logits(raw, sampling, history.for_nodes(tree, torch.tensor(tokens), [u],
                                                                                toy.v))[0].double()
        return drafted_laws[key].clone()

    def extend(i, tokens, weight):
        if i == len(parents):
            t = torch.tensor(tokens)
            raw = torch.stack([toy.logits(path_tokens(u, tokens))[0] for u in range(n)])
            p = process_logits(raw, sampling, history.for_nodes(tree, t, range(n), toy.v)).double()  # production
            q = torch.stack([draft_q(u, tokens) if tree.children[u] else torch.zeros(toy.v, dtype=torch.float64)
                             for u in range(n)])
            for (path, nxt), mass in spec.law(tree, t, p, q).items():
                committed = tuple(tokens[u] for u in path[1:]) + (nxt,)
                rest = seq_law(toy, sampling, committed, m - len(committed)) if len(committed) < m else 1.0
                law[committed] += weight * mass * rest
            return
        u = parents[i]
        kids = tree.children[u]
        drafts, weights = spec.draft.law_fn(draft_q(u, tokens), len(kids))
        for d, w in zip(drafts.tolist(), weights.tolist()):
            if w > 0:
                new = list(tokens)
                for kid, tok in zip(kids, d):
                    new[kid] = tok
                extend(i + 1, new, weight * w)

    extend(0, [COMMITTED[-1]] + [0] * (n - 1), 1.0)
    return law, seq_law(toy, sampling, (), m)


def _vocab(shape) -> int:
    return 4 if len(Tree.from_shape(shape)) <= 5 else 3


@pytest.mark.slow
@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("verifier,shape", CASES, ids=[f"{v}-{'x'.join(map(str, s))}" for v, s in CASES])
def test_path_dependent_processing_is_lossless(verifier, shape, sampling_name):
    law, want = committed_law(RawToy(_vocab(shape), seed=7), SAMPLINGS[sampling_name],
                              get_sequence_verifier(verifier), shape)
    assert abs(law.sum() - 1) < 1e-9
    assert np.abs(law - want).max() < 1e-9, np.abs(law - want).max()


def test_the_processed_law_really_depends_on_the_path():
    """Guard against a vacuous pass: along different paths the same row's processed law differs."""
    toy, s = RawToy(4, seed=7), SAMPLINGS["penalties"]
    assert (reference_p(toy, s, (0,)) - reference_p(toy, s, (1,))).abs().max() > 0.05
    raw = toy.logits(())[0][None]
    assert (process_logits(raw, s, History(torch.zeros(1, 4, dtype=torch.bool), torch.zeros(1, 4),
                                           torch.tensor([0]))) - process_logits(raw, SamplingConfig(1.0))).abs().max() == 0


def _root_only(self, tree, tokens, rows, vocab):
    """The broken variant: every node processed with the committed history (its own path ignored)."""
    one = self.at_root(vocab)
    r = len(list(rows))
    return History(one.seen.expand(r, -1), one.counts.expand(r, -1), one.out_len.expand(r), one.stop_ids)


@pytest.mark.slow
@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("verifier,shape", [("sd", (1, 1)), ("rrs-wor", (2, 2)), ("traversal", (2, 1, 2))])
def test_penalties_from_the_committed_history_only_are_caught(monkeypatch, verifier, shape, sampling_name):
    monkeypatch.setattr(node_history.CommittedHistory, "for_nodes", _root_only)
    law, want = committed_law(RawToy(_vocab(shape), seed=7), SAMPLINGS[sampling_name],
                              get_sequence_verifier(verifier), shape)
    assert np.abs(law - want).max() > 1e-3
