"""The `lossless` flag in the stats tells the truth for every method x verifier, at T = 0 and T > 0: it is checked
against the first token's law measured through `multispec.generate` (the production path).

T > 0: 600 first tokens (seeds 0..599) against the target's exact next-token law, chi-square; a flagged-lossless
combination must pass (p >= 1e-3), a flagged-LOSSY one must be caught (p < 1e-3). T = 0: the first token over 24
prompts must be the target's argmax on every prompt exactly when the flag says lossless.
The pair is built so that lossy rules show: a peaked target and an unrelated draft (V = 6)."""
import itertools

import numpy as np
import pytest
import torch

import multispec
from engine_utils import chi_square_pvalue
from helpers import tiny_llama
from multispec.api import Pair
from multispec.sampling import SamplingConfig, process_logits

V = 6
PROMPT = [4]  # one token: neither model needs a prefill call, which keeps 600 generations fast
DRAWS = 600
ALPHA = 1e-3

# (method, options): every verifier, and each lossy rule (greedy verification at T > 0, MCNS with n >= 2,
# target-initialized trees with W >= 2). Trees are shallow: only the first token is checked.
COMBOS = [
    ("ar", {}), ("sd", {"k": 2}), ("specdecpp", {"k_min": 1, "k_max": 2}),
    ("mcsd", {"tree": (3,), "verifier": "greedy"}),
    ("mcsd", {"tree": (3,), "verifier": "mcns"}), ("mcsd", {"tree": (3,), "verifier": "rrs"}),
    ("mcsd", {"tree": (3,), "verifier": "rrs-wor"}), ("mcsd", {"tree": (3,), "verifier": "kseq"}),
    ("mcsd", {"tree": (2,), "verifier": "spechub"}), ("mcsd", {"tree": (3,), "verifier": "greedy-md"}),
    ("dynamic", {"width": 3, "depth": 1, "verifier": "rrs-wor"}), ("dynamic", {"width": 3, "depth": 1,
                                                                               "verifier": "mcns"}),
    ("ti-mcsd", {"tree": (1, 1)}), ("ti-mcsd", {"tree": (3, 1)}),
    ("dynamic", {"width": 1, "depth": 1, "target_init": True}), ("dynamic", {"width": 3, "depth": 1,
                                                                             "target_init": True}),
]


class IdTokenizer:
    bos_token_id = None
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from multispec.heads.acceptance import AcceptanceHead, save_head
    from multispec.decoding.methods import HEAD_DIRNAME

    target = tiny_llama(vocab=V, hidden=16, layers=1, heads=2, kv_heads=1, seed=3, scale=8.0)
    draft = tiny_llama(vocab=V, hidden=16, layers=1, heads=2, kv_heads=1, seed=11, scale=8.0)
    draft_dir = tmp_path_factory.mktemp("draft")  # specdecpp finds its head in the draft's folder
    head = AcceptanceHead(16, 1, False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random weights: only where it stops drafting depends on them
        for prm in head.parameters():
            prm.copy_(0.3 * torch.randn(prm.shape, generator=g))
    save_head(head.eval(), draft_dir / HEAD_DIRNAME)
    return Pair(target=target, draft=draft, tokenizer=IdTokenizer(), target_path="t", draft_path=str(draft_dir))


def _next_token_law(model, prompt, temperature) -> np.ndarray:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    return process_logits(logits, SamplingConfig(temperature=temperature)).double().numpy()


def _generate(pair, prompt, method, options, temperature, seed):
    # two new tokens: rounds never draft past the token budget, so with one the round would be a plain target
    # step whatever the verifier; with two the first round drafts depth 1 and the verifier decides the first token
    return multispec.generate(pair, prompt, method=method, max_new_tokens=2, temperature=temperature, seed=seed,
                              backend="fast", **options)


@pytest.mark.parametrize("method,options", COMBOS, ids=[f"{m}-{o}" for m, o in COMBOS])
def test_flag_matches_the_first_token_law_at_temperature_1(pair, method, options):
    counts = np.zeros(V)
    flags = set()
    for seed in range(DRAWS):
        r = _generate(pair, PROMPT, method, options, 1.0, seed)
        counts[r.token_ids[0]] += 1
        flags.add(r.stats["lossless"])
    assert len(flags) == 1
    p_value = chi_square_pvalue(counts, _next_token_law(pair.target, PROMPT, 1.0))
    assert (p_value >= ALPHA) == flags.pop(), f"p-value {p_value:.2e}"


@pytest.mark.parametrize("method,options", COMBOS, ids=[f"{m}-{o}" for m, o in COMBOS])
def test_flag_matches_greedy_identity_at_temperature_0(pair, method, options):
    prompts = [list(p) for p in itertools.product(range(V), repeat=2)][:24]
    same, flags = [], set()
    for prompt in prompts:
        r = _generate(pair, prompt, method, options, 0.0, 0)
        same.append(r.token_ids[0] == int(_next_token_law(pair.target, prompt, 0.0).argmax()))
        flags.add(r.stats["lossless"])
    assert len(flags) == 1
    assert all(same) == flags.pop(), f"{sum(same)}/{len(same)} first tokens are the target's argmax"
