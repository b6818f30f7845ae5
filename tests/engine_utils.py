"""Shared pieces of the engine tests: a correlated tiny pair and the exact joint law of the first tokens."""
from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy import stats

from helpers import tiny_llama
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_method
from multispec.models import make_backend
from multispec.sampling import SamplingConfig, process_logits


def tiny_pair(vocab: int = 8, seed: int = 0, noise: float = 0.5):
    """A random target and a draft made from it by perturbing every weight: related but different."""
    target = tiny_llama(vocab=vocab, hidden=16, layers=1, heads=2, kv_heads=1, seed=seed, scale=3.0)
    draft = tiny_llama(vocab=vocab, hidden=16, layers=1, heads=2, kv_heads=1, seed=seed, scale=3.0)
    g = torch.Generator().manual_seed(seed + 99)
    with torch.no_grad():
        for prm in draft.parameters():
            prm.add_(noise * prm.std() * torch.randn(prm.shape, generator=g))
    return target, draft


def greedy_reference(model, prompt, n):
    """The target's own greedy continuation, by full forwards (no cache): the oracle for greedy identity."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def run(target, draft, prompt, method, sampling, n_new, seed=0, backend="hf", **options):
    config = build_method(method, **options)
    t = make_backend(target, backend)
    d = make_backend(draft, backend) if config.name != "ar" else None
    from multispec.decoding.methods import build_policy

    policy = options.pop("_policy", None) or build_policy(config)
    ids, counters = generate_ids(t, d, prompt, config, sampling, n_new, seed, set(), policy=policy)
    return ids, counters


def exact_joint(model, prompt, sampling: SamplingConfig, length: int, vocab: int) -> np.ndarray:
    """float64 [V**length]: the processed target's exact law of the first `length` new tokens."""
    law = np.zeros([vocab] * length)
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=length - 1):
            ids = torch.tensor([prompt + list(seq)])
            probs = process_logits(model(input_ids=ids).logits[0, len(prompt) - 1:].double(), sampling).double()
            pr = 1.0
            for i, tok in enumerate(seq):
                pr *= float(probs[i, tok])
            law[seq] = pr * probs[length - 1].numpy()
    return law.reshape(-1)


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square of counts against probs, merging cells with expected count < 5 into one."""
    n = counts.sum()
    exp = probs * n
    small = exp < 5
    obs_m = np.append(counts[~small], counts[small].sum())
    exp_m = np.append(exp[~small], exp[small].sum())
    keep = exp_m > 0
    assert obs_m[~keep].sum() == 0, "samples fell on zero-probability outcomes"
    obs_m, exp_m = obs_m[keep], exp_m[keep]
    return float(stats.chisquare(obs_m, exp_m * obs_m.sum() / exp_m.sum()).pvalue)


class ScriptedPolicy:
    """A test policy whose plans follow a script, (history, round index) -> RoundPlan, so that plans switch
    between proposers and shapes from round to round. It defers the draft's prefill as auto does (the draft then
    catches up on its pending tokens whenever a plan drafts)."""

    defers_draft_prefill = True
    needs_hidden = False

    def __init__(self, script):
        self.script, self.rounds = script, 0

    def reset(self) -> None:
        self.rounds = 0

    def plan_round(self, history, pending):
        self.rounds += 1
        return self.script(history, self.rounds - 1)

    def prepare(self, target, draft, context_len, temperature=0.0) -> None:
        pass

    def start_round(self) -> None:
        pass

    def keep_drafting(self, depth, parent_hidden, parent_q, new_tokens=None) -> bool:
        return True

    def observe(self, outcome) -> None:
        pass

    def finish(self, history) -> None:
        pass

    def report(self):
        return None
