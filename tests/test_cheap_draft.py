"""Cheap drafts (issue 25): a reduced draft vocabulary (logits equal the full layer's on the subset S and are -inf
elsewhere, on prefill, tree and post-keep forwards, fast and hf backends), token-frequency files, and int8 draft
weights (close to the float draft's logits, the source model untouched), with one-line refusals of bad input."""
import pytest
import torch

from compat_archs import build
from helpers import tiny_llama
from multispec.errors import MultispecError
from multispec.models import forward_chain, make_backend
from multispec.models.int8 import is_int8, quantize_draft
from multispec.models.reduced_vocab import subset_ids
from multispec.token_freq import (TokenFrequencies, count_tokens, default_pair_frequencies, draft_vocab,
                                  tokenizer_fingerprint)
from multispec.tree import Tree

V = 64
TOL = 1e-5


def _steps(backend, gen):
    """Prefill, a tree forward, keep one path, one decode step: the logits (and hidden) of each."""
    prompt = torch.randint(0, V, (9,), generator=gen)
    outs = [forward_chain(backend, prompt, want_hidden=True)]
    outs.append(forward_chain(backend, prompt[:3], last_only=True))
    backend.keep(torch.arange(9))
    tree = Tree.from_shape((3, 2, 1))
    tokens = torch.randint(0, V, (len(tree),), generator=gen)
    outs.append(backend.forward(tokens, tree.position_ids(9), tree.attention_mask(9), want_hidden=True))
    backend.keep(tree.keep_indices(tree.paths[-2], 9))
    outs.append(forward_chain(backend, torch.randint(0, V, (1,), generator=gen), want_hidden=True))
    outs.append(forward_chain(backend, torch.randint(0, V, (4,), generator=gen)))
    return outs


def _check_restricted(model, kind, ids, tol=TOL):
    full, cut = make_backend(model, kind), make_backend(model, kind)
    cut.set_vocab_subset(ids)
    a_outs = _steps(full, torch.Generator().manual_seed(0))
    b_outs = _steps(cut, torch.Generator().manual_seed(0))
    inside = torch.zeros(V, dtype=torch.bool)
    inside[ids] = True
    for a, b in zip(a_outs, b_outs):
        assert b.logits.shape == a.logits.shape and b.logits.dtype == torch.float32
        assert torch.isneginf(b.logits[:, ~inside]).all()
        assert (a.logits[:, inside] - b.logits[:, inside]).abs().max() < tol
        if a.hidden is not None:
            assert (a.hidden - b.hidden).abs().max() < tol


@pytest.mark.parametrize("kind", ["fast", "hf"])
@pytest.mark.parametrize("tied", [False, True])
def test_restricted_logits_equal_full_on_subset(kind, tied):
    model = build("llama-tied" if tied else "llama")
    ids = torch.tensor([40, 3, 17, 5, 63, 0, 22, 9, 31])
    _check_restricted(model, kind, ids)


def test_fast_backend_applies_the_models_final_transforms_on_the_subset():
    _check_restricted(build("gemma2"), "fast", torch.arange(0, V, 3))  # final soft-cap, sandwich norms


def test_hf_backend_refuses_a_subset_on_a_model_that_transforms_its_logits():
    for name in ("gemma2", "granite"):
        backend = make_backend(build(name), "hf")
        with pytest.raises(MultispecError) as e:
            backend.set_vocab_subset(torch.arange(8))
        assert "\n" not in str(e.value) and "--backend fast" in str(e.value)


@pytest.mark.parametrize("kind", ["fast", "hf"])
def test_subset_can_be_replaced_and_removed(kind):
    model = tiny_llama(vocab=V, seed=3)
    backend, ref = make_backend(model, kind), make_backend(model, kind)
    prompt = torch.randint(0, V, (5,), generator=torch.Generator().manual_seed(1))
    want = forward_chain(ref, prompt).logits
    backend.set_vocab_subset(torch.arange(10))
    backend.set_vocab_subset(torch.tensor([4, 2]))
    got = forward_chain(backend, prompt).logits
    assert torch.isfinite(got[:, [2, 4]]).all() and torch.isfinite(got).sum() == 2 * len(prompt)
    backend.reset()
    backend.set_vocab_subset(None)
    assert (forward_chain(backend, prompt).logits - want).abs().max() < TOL


def test_a_growing_subset_keeps_its_cost_key_until_it_nears_the_next_power_of_two():
    """auto's cost cache is keyed by a reduced layer's size, rounded to the nearest power of two: a subset of
    exactly 16 rows that meets one more token keeps its calibration (rounding up, the broken variant, gave it a new
    key and a calibration mid-run); near double the size it gets its own."""
    from multispec.models.reduced_vocab import vocab_bucket

    backend = make_backend(tiny_llama(vocab=V, seed=3), "fast")
    backend.set_vocab_subset(torch.arange(16))
    assert backend.cost_key == "vocab16"
    backend.extend_vocab_subset([20])
    assert backend.vocab_subset.size == 17 and backend.cost_key == "vocab16"
    backend.extend_vocab_subset(list(range(21, 28)))
    assert backend.vocab_subset.size == 24 and backend.cost_key == "vocab32"
    assert [vocab_bucket(n) for n in (1, 3, 8192, 8193, 11585, 11586)] == [1, 4, 8192, 8192, 8192, 16384]


def test_draft_vocab_is_top_n_plus_prompt():
    freq = TokenFrequencies("x", 8, (5, 0, 9, 9, 1, 0, 0, 2), "test")
    assert freq.top(3).tolist() == [2, 3, 0]  # ties: the smaller id first
    assert draft_vocab(freq, 2, [6, 3, 6]).tolist() == [2, 3, 6]
    assert draft_vocab(freq, 8).tolist() == list(range(8))


@pytest.mark.parametrize("n", [0, -1, 9, 2.5])
def test_bad_draft_vocab_size_is_one_line(n):
    freq = TokenFrequencies("x", 8, (1,) * 8, "test")
    with pytest.raises(MultispecError) as e:
        draft_vocab(freq, n)
    assert "\n" not in str(e.value) and "[1, 8]" in str(e.value)


def test_bad_subset_ids_are_one_line():
    for ids in ([], [3, 64], [-1, 2]):
        with pytest.raises(MultispecError) as e:
            subset_ids(ids, V)
        assert "\n" not in str(e.value)


def test_frequency_file_round_trip_and_fingerprint(tmp_path):
    from transformers import AutoTokenizer

    from multispec.api import DEFAULT_PAIR_DIR

    tok = AutoTokenizer.from_pretrained(DEFAULT_PAIR_DIR / "target")
    freq = count_tokens(tok, ["def f(x):\n    return x + 1\n"] * 3, "test")
    assert sum(freq.counts) == 3 * len(tok.encode("def f(x):\n    return x + 1\n", add_special_tokens=False))
    freq.save(tmp_path / "f.json")
    assert TokenFrequencies.load(tmp_path / "f.json") == freq
    default = default_pair_frequencies()
    default.check_tokenizer(tok)
    assert default.vocab_size == 4096 and default.fingerprint == tokenizer_fingerprint(tok)
    other = TokenFrequencies("0" * 64, 4096, default.counts, "test")
    with pytest.raises(MultispecError, match="different tokenizer"):
        other.check_tokenizer(tok)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(MultispecError):
        TokenFrequencies.load(tmp_path / "bad.json")


@pytest.mark.parametrize("kind", ["fast", "hf"])
def test_int8_draft_close_to_float_and_source_untouched(kind):
    model = tiny_llama(vocab=V, hidden=64, seed=5, scale=4.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ref = forward_chain(make_backend(model, kind), torch.arange(12) % V).logits
    make_backend(model, "fast")  # a FastNet cached on the model must not leak into the copy
    q = quantize_draft(model)
    assert is_int8(q.lm_head) and is_int8(q.model.layers[0].mlp.up_proj)
    assert isinstance(model.lm_head, torch.nn.Linear) and not is_int8(model.lm_head)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    got = forward_chain(make_backend(q, kind), torch.arange(12) % V).logits
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()  # int8: loose
    assert (forward_chain(make_backend(model, kind), torch.arange(12) % V).logits - ref).abs().max() < TOL


@pytest.mark.parametrize("kind", ["fast", "hf"])
def test_int8_with_reduced_vocab_is_int8_on_subset(kind):
    """The subset multiplies the int8-valued rows in float32: the int8 layer's logits within its activation
    rounding."""
    q = quantize_draft(tiny_llama(vocab=V, hidden=64, seed=6, scale=4.0))
    _check_restricted(q, kind, torch.arange(1, V, 2), tol=0.05)  # logits ~2


def test_quantize_refuses_other_devices_and_dtypes_in_one_line():
    model = tiny_llama(vocab=V)
    for bad, word in ((model.to(torch.bfloat16), "float32"), (tiny_llama(vocab=V).to("meta"), "CPU")):
        with pytest.raises(MultispecError) as e:
            quantize_draft(bad)
        assert "\n" not in str(e.value) and word in str(e.value)


def test_cheap_draft_options_are_validated_in_one_line():
    from multispec.models.cheap import CheapDraft

    for kwargs in (dict(vocab=0), dict(vocab=True), dict(vocab=1.5), dict(dtype="int4"),
                   dict(vocab=8, frequency_file="/nonexistent/freq.json")):
        with pytest.raises(MultispecError) as e:
            CheapDraft(**kwargs)
        assert "\n" not in str(e.value)
    assert not CheapDraft().active and CheapDraft(dtype="int8").active and CheapDraft(vocab=8).active


def test_cheap_draft_on_the_default_pair():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from multispec.api import DEFAULT_PAIR_DIR
    from multispec.models.cheap import CheapDraft

    tok = AutoTokenizer.from_pretrained(DEFAULT_PAIR_DIR / "target")
    draft = AutoModelForCausalLM.from_pretrained(DEFAULT_PAIR_DIR / "draft", dtype=torch.float32)
    cheap = CheapDraft(vocab=256, dtype="int8")
    freq = cheap.frequencies(tok, vocab_size=4096)
    assert freq == default_pair_frequencies()
    prompt = tok("def fibonacci(n):", add_special_tokens=False)["input_ids"]
    ids = cheap.subset(freq, prompt)
    assert set(prompt) <= set(ids.tolist()) and set(freq.top(256).tolist()) <= set(ids.tolist())
    model = cheap.draft_model(draft)
    assert is_int8(model.lm_head) and not is_int8(draft.lm_head)
    backend = make_backend(model, "fast")
    backend.set_vocab_subset(ids)
    logits = forward_chain(backend, torch.tensor(prompt)).logits
    assert torch.isfinite(logits).sum(-1).eq(len(ids)).all()
    with pytest.raises(MultispecError, match=r"\[1, 4096\]"):
        CheapDraft(vocab=5000).frequencies(tok, vocab_size=4096)


def test_cheap_draft_counts_frequencies_once_for_another_tokenizer(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from helpers import save_tiny_pair
    from multispec.models.cheap import CheapDraft

    tok = AutoTokenizer.from_pretrained(save_tiny_pair(tmp_path / "pair")["target"])
    monkeypatch.setenv("MULTISPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("multispec.token_freq.calibration_texts", lambda: (["def f(x): return x\n"], "test"))
    freq = CheapDraft(vocab=4).frequencies(tok)
    assert freq.fingerprint == tokenizer_fingerprint(tok) and sum(freq.counts) > 0
    monkeypatch.setattr("multispec.token_freq.calibration_texts", lambda: 1 / 0)  # the cached file is used
    assert CheapDraft(vocab=4).frequencies(tok) == freq
    assert len(list((tmp_path / "cache" / "token_freq").iterdir())) == 1


@pytest.mark.parametrize("kind", ["fast", "hf"])
@pytest.mark.parametrize("int8", [False, True])
def test_extended_subset_equals_full_on_the_grown_subset(kind, int8):
    model = tiny_llama(vocab=V, hidden=64, seed=7, scale=4.0)
    model = quantize_draft(model) if int8 else model
    full, cut = make_backend(model, kind), make_backend(model, kind)
    cut.set_vocab_subset(torch.tensor([5, 1, 9]))
    prompt = torch.randint(0, V, (7,), generator=torch.Generator().manual_seed(2))
    forward_chain(full, prompt), forward_chain(cut, prompt)
    before = cut.vocab_subset
    cut.extend_vocab_subset(torch.tensor([9, 1]))  # nothing new: the same head
    assert cut.vocab_subset is before
    cut.extend_vocab_subset([9, 5])  # a list (the engine's committed tokens) works the same
    assert cut.vocab_subset is before
    with pytest.raises(MultispecError, match="must lie in"):
        cut.extend_vocab_subset([9, V])  # a new id out of range is still refused
    cut.extend_vocab_subset(torch.tensor([40, 9, 2, 40]))
    assert sorted(cut.vocab_subset.ids.tolist()) == [1, 2, 5, 9, 40]
    tree = Tree.from_shape((2, 2))
    tokens = torch.randint(0, V, (len(tree),), generator=torch.Generator().manual_seed(3))
    a = full.forward(tokens, tree.position_ids(7), tree.attention_mask(7)).logits
    b = cut.forward(tokens, tree.position_ids(7), tree.attention_mask(7)).logits
    inside = torch.zeros(V, dtype=torch.bool)
    inside[[1, 2, 5, 9, 40]] = True
    assert torch.isneginf(b[:, ~inside]).all() and (a[:, inside] - b[:, inside]).abs().max() < (0.05 if int8 else TOL)
    full.extend_vocab_subset(torch.tensor([3]))  # the full vocabulary stays full
    assert full.vocab_subset is None


class _SubsetMemo:
    """A MemoBackend draft whose logits are cut to S exactly as set_vocab_subset cuts them (-inf outside S; the
    tests above show the real backends do just this), so that 1e4 seeded generations stay cheap."""

    def __init__(self, inner, ids):
        self.inner, self.inside = inner, torch.zeros(inner.vocab_size, dtype=torch.bool)
        self.inside[ids] = True

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, *args, **kwargs):
        out = self.inner.forward(*args, **kwargs)
        out.logits = out.logits.masked_fill(~self.inside, float("-inf"))
        return out


@pytest.mark.slow
def test_sd_with_a_reduced_draft_vocabulary_samples_the_target_law():
    """The first tokens' law with a draft restricted to 3 of 8 tokens (q = 0 elsewhere) is the target's."""
    import numpy as np

    from engine_utils import chi_square_pvalue, exact_joint, tiny_pair
    from memo_backend import MemoBackend
    from multispec.decoding.engine import generate_ids
    from multispec.decoding.methods import build_method, build_policy
    from multispec.sampling import SamplingConfig

    v, length, n, prompt = 8, 3, 6000, [1, 4, 2]
    target, draft = tiny_pair(vocab=v, seed=3, noise=0.6)
    sampling, config = SamplingConfig(temperature=1.0), build_method("sd", k=2, verifier="sd")
    t, d = MemoBackend(target, {}), _SubsetMemo(MemoBackend(draft, {}), [1, 2, 6])
    policy = build_policy(config)
    counts = np.zeros(v ** length, dtype=np.int64)
    for seed in range(n):
        ids, _ = generate_ids(t, d, prompt, config, sampling, length, seed, set(), policy=policy)
        counts[np.ravel_multi_index(ids[:length], (v,) * length)] += 1
    probs = exact_joint(target, prompt, sampling, length, v)
    assert chi_square_pvalue(counts, probs) > 1e-3  # the joint law of the first 3 tokens
    assert chi_square_pvalue(counts.reshape(v, -1).sum(1), probs.reshape(v, -1).sum(1)) > 1e-3  # the first one


@pytest.mark.parametrize("kind", ["fast", "hf"])
def test_greedy_sd_with_a_cheap_draft_is_the_targets_greedy_output(kind):
    from engine_utils import greedy_reference, tiny_pair
    from multispec.decoding.engine import generate_ids
    from multispec.decoding.methods import build_method, build_policy
    from multispec.sampling import SamplingConfig

    target, draft = tiny_pair(vocab=V, seed=4, noise=0.3)
    prompt = [3, 17, 5, 40]
    d = make_backend(quantize_draft(draft), kind)
    d.set_vocab_subset(draft_vocab(TokenFrequencies("x", V, tuple(range(V)), "test"), 8, prompt))
    config = build_method("sd", k=3)
    ids, _ = generate_ids(make_backend(target, kind), d, prompt, config, SamplingConfig(temperature=0.0), 12, 0,
                             set(), policy=build_policy(config))
    assert ids == greedy_reference(target, prompt, 12)
