"""Grammars the grammar engine cannot serve: refused when bound, before any forward (a legal schema past the
engine's parser limits, a rule with no finite derivation), and a grammar that dead-ends past its first tokens ends
the request with one clear error under every method — never an internal error, never an output labelled stop."""
from __future__ import annotations

import pytest

import multispec
from multispec import structured
from multispec.errors import MultispecError

WIDE = {"type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(3000)}}
ENDLESS = 'start: x\nx: "a" x\n'
LATE = 'start: ("b" | "c") x\nx: "a" x\n'  # free first token, then the same dead end


@pytest.fixture(scope="module")
def pair():
    return multispec.load_pair()


@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("constraint", [{"json_schema": WIDE}, {"grammar": ENDLESS}])
def test_a_grammar_past_the_engines_limits_is_refused_when_bound(pair, monkeypatch, constraint, broken):
    """Refused by the probe of the tokens the grammar forces from its start; without the probe (the broken
    variant) the same request fails only once generation has started."""
    if broken:
        monkeypatch.setattr(structured.GrammarState, "probe", lambda self, vocab: None)
    with pytest.raises(MultispecError) as e:
        multispec.generate(pair, "def f(x):", method="ar", max_new_tokens=8, **constraint)
    assert ("cannot serve it" in str(e.value)) is not broken
    assert len(str(e.value).splitlines()) == 1 and len(str(e.value)) < 800


@pytest.mark.parametrize("method", ["ar", "sd", "mcsd", "lookup", "auto"])
def test_a_grammar_that_dead_ends_mid_generation_is_one_clear_error(pair, method):
    with pytest.raises(MultispecError) as e:
        multispec.generate(pair, "def f(x):", method=method, max_new_tokens=16, grammar=LATE)
    assert str(e.value).startswith("grammar: the grammar") and len(str(e.value).splitlines()) == 1


def test_an_engine_failure_on_a_drafted_token_is_not_a_silent_end(pair, monkeypatch):
    """The broken variant: the matcher's error state unchecked while masking. When the walk consumed drafts on the
    committed matcher, the engine then allowed only an end: a drafting method returned an empty output labelled
    stop. The walk now runs on copies, so without the check the failure surfaces later, at the commit, naming a
    token instead of the dead end. The check makes it the clear error at once (the test above)."""
    monkeypatch.setattr(structured.GrammarState, "dead_end", lambda self, m=None: None)
    try:
        result = multispec.generate(pair, "def f(x):", method="sd", max_new_tokens=16, grammar=LATE)
    except MultispecError as e:
        assert "cannot go on" not in str(e)
    else:
        assert result.stats["finish_reason"] == "stop" and not result.stats["structured"]["complete"]
