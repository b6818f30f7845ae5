"""Greedy, fp32, CPU, pycode-v1: sd and mcsd with every lossless verifier (and the other lossless methods)
produce exactly the tokens of `ar` on the first 6 HumanEval prompts, 128 new tokens each (20 and more in the
committed benchmarks; 12 here until the suite passed 15 minutes; test_engine_greedy.py checks every lossless
method and verifier on two tiny pairs).

At temperature 0 every verifier name runs the same computation: the engine drafts the top-n candidates and
verifies with `greedy` whatever verifier was asked for (checked by test_greedy_uses_the_greedy_verifier), so one
mcsd row per tree shape covers every lossless verifier."""
import pytest

from helpers import DATA, PYCODE, needs_data, needs_pycode

pytestmark = [needs_pycode, needs_data]
N_PROMPTS, N_NEW = 6, 128
# ti-mcsd W = 1 and dynamic are greedy-identical on the tiny pairs of test_engine_greedy.py; they are left out
# here to keep the suite inside CI's budget.
CASES = [("sd", {"k": 4}), ("mcsd", {"verifier": "rrs-wor"}), ("mcsd", {"verifier": "spechub", "tree": (2, 2, 2, 2)}),
         ("auto", {}), ("lookup", {}), ("suffix", {})]
_CACHE = {}


def _setup():
    if not _CACHE:
        import multispec

        pair = multispec.load_pair(target=str(PYCODE / "target"), draft=str(PYCODE / "draft"), dtype="float32")
        from multispec.data import load_prompts

        # formatted as by `multispec bench` (trailing whitespace stripped: see docs/bench.md)
        prompts = [p.text for p in load_prompts("humaneval", data_dir=DATA, limit=N_PROMPTS)]
        ar = [multispec.generate(pair, p, method="ar", max_new_tokens=N_NEW).token_ids for p in prompts]
        _CACHE.update(pair=pair, prompts=prompts, ar=ar)
    return _CACHE


@pytest.mark.slow
@pytest.mark.parametrize("method,options", CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}{v}" for k, v in v.items()).replace(" ", ""))
def test_lossless_methods_are_greedy_identical_on_humaneval(method, options):
    import multispec

    c = _setup()
    for prompt, ref in zip(c["prompts"], c["ar"]):
        out = multispec.generate(c["pair"], prompt, method=method, max_new_tokens=N_NEW, temperature=0, **options)
        assert out.token_ids == ref


@pytest.mark.slow
@pytest.mark.parametrize("method,options", [("sd", {"k": 6, "verifier": "block"}),
                                            ("mcsd", {"tree": (2, 2, 2, 2, 1, 1), "verifier": "traversal"})],
                         ids=["sd-block", "mcsd-traversal"])
def test_sequence_verifiers_are_greedy_identical_on_humaneval(method, options):
    """The sequence verifiers, on the first 3 prompts only (at temperature 0 they run the greedy walk)."""
    import multispec

    c = _setup()
    for prompt, ref in list(zip(c["prompts"], c["ar"]))[:3]:
        out = multispec.generate(c["pair"], prompt, method=method, max_new_tokens=N_NEW, **options)
        assert out.token_ids == ref
