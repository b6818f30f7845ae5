"""Cache correctness on the transformers backend: after every round, the target's and the draft's next-position
logits equal a fresh full forward of the committed sequence (fp32, tolerance 1e-4)."""
import pytest
import torch

from engine_utils import tiny_pair
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_policy
from multispec.decoding.methods import build_method
from multispec.models import make_backend
from multispec.models.base import forward_chain
from multispec.sampling import SamplingConfig

TOL = 1e-4


def _probe(backend, model, committed):
    """Feed the committed tokens the backend has not consumed, compare the last logits with a fresh forward,
    then drop the probe rows again."""
    n0 = backend.cache_len
    assert n0 <= len(committed)
    restore = n0
    if n0 == len(committed):  # target-initialized rounds: the target has consumed everything; re-feed the last
        backend.keep(torch.arange(n0 - 1))
        n0 -= 1
    out = forward_chain(backend, torch.tensor(committed[n0:]))
    with torch.no_grad():
        fresh = model(input_ids=torch.tensor([committed])).logits[0, -1].float()
    backend.keep(torch.arange(restore))
    return float((out.logits[-1] - fresh).abs().max())


@pytest.mark.parametrize("method,options,temperature", [
    ("sd", {"k": 3}, 1.0), ("mcsd", {"tree": (3, 2, 1), "verifier": "rrs-wor"}, 1.0),
    ("mcsd", {"tree": (2, 2, 2), "verifier": "spechub"}, 0.7), ("ti-mcsd", {"tree": (2, 3, 1)}, 1.0),
    ("dynamic", {"width": 3, "depth": 3}, 0.0), ("sd", {"k": 2, "heuristic": True}, 0.0),
])
def test_caches_match_fresh_forward_after_every_round(method, options, temperature):
    target_model, draft_model = tiny_pair(vocab=32, seed=5, noise=0.3)
    target, draft = make_backend(target_model), make_backend(draft_model)
    prompt = [1, 9, 4, 20, 7]
    rounds = []

    def check_round(new):
        if len(new) >= 30:  # the final streaming call, after the output was cut to max_new_tokens
            return
        committed = prompt + new
        rounds.append((_probe(target, target_model, committed), _probe(draft, draft_model, committed)))

    config = build_method(method, **options)
    generate_ids(target, draft, prompt, config, SamplingConfig(temperature=temperature), 30, 0, set(),
                 on_tokens=check_round, policy=build_policy(config))
    assert len(rounds) >= 3
    worst = max(max(r) for r in rounds)
    assert worst < TOL, rounds
