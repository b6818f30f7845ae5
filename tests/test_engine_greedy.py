"""Greedy, fp32, CPU: every lossless method reproduces the target's own greedy output token for token."""
import pytest

from engine_utils import greedy_reference, run, tiny_pair
from multispec.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0)
CASES = [
    ("sd", {"k": 1}), ("sd", {"k": 4}), ("sd", {"k": 3, "heuristic": True}),
    ("mcsd", {"tree": (4, 2, 2, 1), "verifier": "rrs-wor"}), ("mcsd", {"tree": (2, 2, 1), "verifier": "rrs"}),
    ("mcsd", {"tree": (3, 2), "verifier": "kseq"}), ("mcsd", {"tree": (2, 2, 2), "verifier": "spechub"}),
    ("mcsd", {"tree": (3, 1, 1), "verifier": "greedy-md"}), ("mcsd", {"tree": (1, 1, 1), "verifier": "sd"}),
    ("ti-mcsd", {"tree": (1, 3, 2, 1)}), ("dynamic", {"width": 3, "depth": 4}),
    ("sd", {"k": 4, "verifier": "block"}), ("mcsd", {"tree": (4, 2, 2, 1), "verifier": "traversal"}),
    ("dynamic", {"width": 1, "depth": 4, "verifier": "block"}),
    ("dynamic", {"width": 3, "depth": 3, "verifier": "traversal"}),
    ("ti-mcsd", {"tree": (1, 3, 2), "verifier": "traversal"}),
]


@pytest.mark.parametrize("vocab", [12, 64])
def test_every_lossless_method_equals_target_greedy(vocab):
    target, draft = tiny_pair(vocab=vocab, seed=vocab)
    prompt = [1, 5, 3, 7]
    ref = greedy_reference(target, prompt, 40)
    ar, _ = run(target, draft, prompt, "ar", GREEDY, 40)
    assert ar == ref
    for method, options in CASES:
        out, counters = run(target, draft, prompt, method, GREEDY, 40, **options)
        assert out == ref, (method, options)
        if method != "ar":
            assert counters.target_calls < 40 or counters.accepted == 0


def test_ti_mcsd_wide_is_reported_lossy():
    from multispec.decoding.methods import build_method

    assert build_method("ti-mcsd", tree=(2, 4, 3, 1, 1)).lossless is False
    assert build_method("ti-mcsd", tree=(1, 4, 3, 1, 1)).lossless is True
    assert build_method("mcsd", verifier="mcns").lossless is False


def test_greedy_uses_the_greedy_verifier(monkeypatch):
    """At temperature 0 the verifier name does not matter: drafting takes the top-n and verification is greedy."""
    import multispec.decoding.round_verify as round_verify
    import multispec.decoding.state as state

    seen = []
    real, real_greedy = state.get_sequence_verifier, round_verify.walk_tree_greedy

    def spy(name):
        seen.append(name)
        return real(name)

    def greedy_spy(tree, tokens, best):
        seen.append("greedy-walk")  # the greedy verifier's walk on argmax ints (tests/test_greedy_fast_path.py)
        return real_greedy(tree, tokens, best)

    monkeypatch.setattr(state, "get_sequence_verifier", spy)
    monkeypatch.setattr(round_verify, "walk_tree_greedy", greedy_spy)
    target, draft = tiny_pair(vocab=12, seed=1)
    for verifier in ("rrs", "rrs-wor", "kseq", "greedy-md", "mcns", "traversal"):
        run(target, draft, [1, 2], "mcsd", GREEDY, 6, tree=(3, 1), verifier=verifier)
    run(target, draft, [1, 2], "sd", GREEDY, 6, k=3, verifier="block")
    assert set(seen) == {"greedy", "greedy-walk"}
