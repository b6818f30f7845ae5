"""The reproducible mode (issue 26) through the engine: with a seed, every method's text is the target's own
position-keyed Gumbel-max sample (drafter-invariant verification, verify/gumbel.py) whatever the method or its
plans; its law is the target's (chi-square through the production path); a variant whose noise is keyed by round
instead of by position is caught by the same invariance check."""
import numpy as np
import pytest
import torch

from engine_utils import ScriptedPolicy, exact_joint, tiny_pair
from memo_backend import MemoBackend
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_method, build_policy
from multispec.drafting.protocol import RoundPlan
from multispec.errors import MultispecError
from multispec.models import make_backend
from multispec.sampling import SamplingConfig, process_logits
from multispec.tree import Tree
from multispec.verify.keyed import PositionKeys, keyed_sample
from test_engine_sampling import law_pvalue

T1 = SamplingConfig(temperature=1.0)
METHODS = [("ar", {}), ("sd", {"k": 3}), ("sd", {"k": 1}), ("mcsd", {"tree": (3, 2)}), ("dynamic", {"width": 2}),
           ("lookup", {}), ("suffix", {})]


def keyed_reference(model, prompt, n, seed, sampling=T1):
    """Target-only sampling with position keys, by full forwards: the text every method must reproduce."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            p = process_logits(model(input_ids=torch.tensor([ids])).logits[0, -1:], sampling)
            ids.append(int(keyed_sample(p, PositionKeys(seed, (len(ids),)))[0]))
    return ids[len(prompt):]


def _forced_auto():
    """auto with its plans forced to change between rounds (none, draft chain, draft tree, lookup)."""
    plans = [RoundPlan(Tree.chain(0), "none"), RoundPlan(Tree.chain(2), "draft"),
             RoundPlan(Tree.from_shape((2, 1)), "draft")]
    return ScriptedPolicy(lambda history, i: plans[(i * 7 + len(history)) % 3])


def run_all(target, draft, prompt, seed, n=12):
    outs = {}
    for name, options in METHODS:
        config = build_method(name, **options)
        ids, _ = generate_ids(make_backend(target), make_backend(draft) if name != "ar" else None, prompt, config,
                              T1, n, seed, set(), policy=build_policy(config), reproducible=True)
        outs[f"{name}{options}"] = ids
    config = build_method("auto")
    outs["auto-forced"], _ = generate_ids(make_backend(target), make_backend(draft), prompt, config, T1, n, seed,
                                          set(), policy=_forced_auto(), reproducible=True)
    return outs


def test_every_method_gives_the_keyed_target_sample():
    target, draft = tiny_pair(vocab=16, seed=5, noise=0.4)
    for seed in range(6):
        ref = keyed_reference(target, [1, 2, 3], 12, seed)
        outs = run_all(target, draft, [1, 2, 3], seed)
        assert all(ids == ref for ids in outs.values()), (seed, ref, outs)


def test_noise_keyed_by_round_is_caught(monkeypatch):
    """Broken: the noise of a round's nodes keyed by (seed, round-relative depth) instead of absolute position."""
    import multispec.decoding.round_verify as round_verify
    from multispec.verify.keyed import node_keys

    monkeypatch.setattr(round_verify, "node_keys", lambda tree, seed, root: node_keys(tree, seed, 0))
    target, draft = tiny_pair(vocab=16, seed=5, noise=0.4)
    broken = 0
    for seed in range(6):
        ref = keyed_reference(target, [1, 2, 3], 12, seed)
        outs = run_all(target, draft, [1, 2, 3], seed)
        broken += sum(ids != ref for ids in outs.values())
    assert broken > 10


def test_reproducible_law_is_the_target_law_through_the_engine():
    V, L, n = 8, 3, 3_000
    target, draft = tiny_pair(vocab=V, seed=3, noise=0.6)
    exact = exact_joint(target, [1, 4, 2], T1, L, V)
    memo_t, memo_d = {}, {}
    for name, options in (("sd", {"k": 2}), ("mcsd", {"tree": (3, 2)})):
        config = build_method(name, **options)
        policy = build_policy(config)
        counts = np.zeros(V ** L, dtype=np.int64)
        for seed in range(n):
            ids, _ = generate_ids(MemoBackend(target, memo_t), MemoBackend(draft, memo_d), [1, 4, 2], config, T1, L,
                                  seed, set(), policy=policy, reproducible=True)
            counts[np.ravel_multi_index(ids[:L], (V,) * L)] += 1
        assert law_pvalue(counts, exact) > 1e-3, name


def test_generate_reports_and_refuses():
    from helpers import save_tiny_pair  # noqa: F401  (the API path is covered in test_decoder; flags here)

    config = build_method("ti-mcsd", tree=(2, 2, 1))
    target, draft = tiny_pair(vocab=16, seed=5)
    with pytest.raises(MultispecError, match="no reproducible mode"):
        generate_ids(make_backend(target), make_backend(draft), [1, 2], config, T1, 4, 0, set(), reproducible=True)
