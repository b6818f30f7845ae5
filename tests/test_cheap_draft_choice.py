"""`auto` drafts with the fastest form of the draft on this machine (issue 25): the full draft, int8 weights, a
reduced output layer or both, chosen from timed steps, only for a clear gain, kept on disk, never for other methods
and never over the user's own draft_vocab / draft_dtype. (Every form keeps the target's law: test_cheap_draft_law.)"""
from types import SimpleNamespace

import pytest

from helpers import tiny_llama
from multispec.decoding.decoder import Decoder
from multispec.loading import Pair
from multispec.models import cheap
from multispec.token_freq import TokenFrequencies

V = 4096  # above 2 x AUTO_VOCAB: the reduced layer is a candidate


@pytest.fixture
def pair(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path))
    freq = TokenFrequencies("test", V, tuple(range(V, 0, -1)), "test")
    monkeypatch.setattr(cheap.CheapDraft, "frequencies",
                        lambda self, tokenizer, vocab_size=None, count=True: freq if self.vocab is not None else None)
    target = tiny_llama(vocab=V, hidden=16, layers=1, heads=2, kv_heads=1, seed=0)
    draft = tiny_llama(vocab=V, hidden=16, layers=1, heads=2, kv_heads=1, seed=1)
    tok = SimpleNamespace(eos_token_id=None, bos_token_id=None)
    return Pair(target=target, draft=draft, tokenizer=tok, target_path="t", draft_path="d")


def timings(monkeypatch, seconds: dict, calls: list):
    """Step times by candidate (vocab, dtype), instead of timing the tiny model."""
    def fake(draft, candidates, freq, kind, steps=12):
        calls.append([(c.vocab, c.dtype) for c in candidates])
        return [seconds[(c.vocab, c.dtype)] for c in candidates]
    monkeypatch.setattr(cheap, "_time_steps", fake)


@pytest.mark.parametrize("seconds, chosen", [
    ({(None, None): 1.0, (None, "int8"): 0.95, (1024, None): 0.7, (1024, "int8"): 0.8}, (1024, None)),
    ({(None, None): 1.0, (None, "int8"): 0.6, (1024, None): 0.7, (1024, "int8"): 0.65}, (None, "int8")),
    ({(None, None): 1.0, (None, "int8"): 0.95, (1024, None): 0.93, (1024, "int8"): 0.99}, (None, None)),  # < 10 %
])
def test_auto_drafts_with_the_fastest_form_when_it_is_clearly_faster(pair, monkeypatch, seconds, chosen):
    calls = []
    timings(monkeypatch, seconds, calls)
    d = Decoder(pair, "auto", "fast")
    assert (d.cheap.vocab, d.cheap.dtype) == chosen
    assert calls == [[(None, None), (None, "int8"), (1024, None), (1024, "int8")]]
    from multispec.sampling import SamplingConfig

    ids, _ = d.run([1, 2, 3], SamplingConfig(temperature=0.0), 4, 0)  # the chosen draft runs
    assert len(ids) == 4 and d.stats(_, SamplingConfig(temperature=0.0))["draft_vocab"] == chosen[0]


def test_the_choice_is_timed_once_and_kept_in_the_profile(pair, monkeypatch, tmp_path):
    from multispec.profile import MachineProfile

    calls = []
    timings(monkeypatch, {(None, None): 1.0, (None, "int8"): 0.95, (1024, None): 0.7, (1024, "int8"): 0.8}, calls)
    first = Decoder(pair, "auto", "fast")
    Decoder(pair, "auto", "fast")  # the default profile now holds it
    assert len(calls) == 1 and first.profile.sections["cheap_draft"]
    assert Decoder(pair, "auto", "fast", profile=first.profile).cheap.vocab == 1024 and len(calls) == 1
    assert MachineProfile.default_path().is_file()
    MachineProfile.default_path().write_text("{not json")  # a broken file is measured again, not fatal
    assert Decoder(pair, "auto", "fast").cheap.vocab == 1024 and len(calls) == 2
    assert Decoder(pair, "auto", "fast", profile=MachineProfile()).cheap.vocab == 1024 and len(calls) == 3


def test_the_users_choice_and_other_methods_are_left_alone(pair, monkeypatch):
    calls = []
    timings(monkeypatch, {(None, None): 1.0, (None, "int8"): 0.5, (1024, None): 0.5, (1024, "int8"): 0.4}, calls)
    assert not Decoder(pair, "auto", "fast", draft_dtype="float32").cheap.active  # the draft as loaded
    assert Decoder(pair, "auto", "fast", draft_vocab=512).cheap.dtype is None
    assert not Decoder(pair, "sd", "fast").cheap.active
    assert not Decoder(pair, "auto", "fast", proposers="lookup").cheap.active  # no draft model in use
    assert calls == []
