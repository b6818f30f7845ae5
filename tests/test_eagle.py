"""Method `eagle`: a feature head (models/eagle.py) drafting on the target's hidden states is exact: greedy output is
the target's own, the law at T = 1 is the target's (chi-square, chains and trees), and the head's cache holds, after
every round, exactly the rows a full teacher-forced forward of the head computes. Broken variants are caught."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine_utils import chi_square_pvalue, exact_joint, greedy_reference
from helpers import save_tiny_pair, tiny_llama
from multispec.decoding.engine import generate_ids
from multispec.decoding.methods import build_method, get_method
from multispec.errors import MultispecError
from multispec.loading import Pair
from multispec.models import make_backend
from multispec.models.base import forward_chain
from multispec.models.eagle import FeatureTap, HeadBackend, TargetParts, new_head
from multispec.models.eagle_io import load_head, save_head
from multispec.sampling import SamplingConfig

torch.set_num_threads(1)
GREEDY = SamplingConfig(temperature=0.0)


def _target(vocab: int = 16, seed: int = 0):
    return tiny_llama(vocab=vocab, hidden=32, layers=2, heads=4, kv_heads=2, seed=seed, scale=3.0)


def _head_dir(target, path, seed: int = 1):
    torch.manual_seed(seed)
    head = new_head(target)
    with torch.no_grad():  # a random head whose drafts the target sometimes accepts
        head.fc.weight.mul_(3.0)
    return save_head(head, target, path)


def _pair_of(target) -> Pair:
    """A target-only Pair: what a Decoder decodes with, its sidecars (the few-row tables, measured once) included."""
    return Pair(target=target, draft=None, tokenizer=None, target_path="", draft_path=None)


def _decode(target, head_dir, prompt, sampling, n, seed=0, backend="hf", method="eagle", loaded=None, pair=None,
            policy=None, **options):
    """generate_ids with `method` and the head, built as the Decoder builds it; returns (ids, metrics, head
    backend). loaded: what entry.load gave for these options before (the head read once for many runs); pair:
    the target's Pair for many runs (its sidecars kept, as a Decoder keeps them; default a new one); policy: the
    method's policy (default a new one)."""
    config = build_method(method, head=str(head_dir), **options)
    entry, pair = get_method(method), pair if pair is not None else _pair_of(target)
    loaded = loaded if loaded is not None else entry.load(config, pair)
    tap, head = entry.draft_backend(config, loaded, make_backend(target, backend), pair)
    ids, metrics = generate_ids(tap, head, prompt, config, sampling, n, seed, set(),
                                policy=policy if policy is not None else entry.make_policy(config, pair, loaded))
    return ids, metrics, head


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target = _target()
    return target, _head_dir(target, tmp_path_factory.mktemp("head") / "head")


@pytest.mark.parametrize("options", [{"k": 1}, {"k": 4}, {"tree": (3, 2, 1)}, {"tree": (2, 2, 2, 1)},
                                     {"k": 6, "confidence": 0.3}, {"tree": (2, 2, 1, 1), "confidence": 0.3},
                                     {"nodes": 6, "depth": 3, "width": 2}, {"nodes": 3, "depth": 3, "width": 1}])
def test_greedy_is_the_targets_own(tiny, options):
    target, head_dir = tiny
    for prompt in ([1, 2, 3], [5], [0, 7, 7, 7, 2, 9, 4], [3, 1, 4, 1, 5, 9, 2, 6]):
        ids, m, _ = _decode(target, head_dir, prompt, GREEDY, 24, **options)
        assert ids == greedy_reference(target, prompt, 24), (options, prompt)
        assert m.drafted_tokens > 0


def test_greedy_on_the_fast_backend(tiny):
    target, head_dir = tiny
    ids, _, _ = _decode(target, head_dir, [1, 2, 3], GREEDY, 20, backend="fast", tree=(2, 2, 1))
    assert ids == greedy_reference(target, [1, 2, 3], 20)


@pytest.mark.parametrize("broken", [False, True])
def test_the_tap_keeps_every_prefill_feature_with_the_last_logits_only(tiny, broken, monkeypatch):
    """A prefill through the tap (last_only) computes the output layer on its last row only, and keeps every row's
    feature: the target's own hidden states. Broken variant: a backend that drops every_hidden (features of the
    last row only) is caught."""
    target, _ = tiny
    inner = make_backend(target, "fast")
    if broken:
        run = inner.net.run
        monkeypatch.setattr(inner.net, "run", lambda *a, **k: run(*a[:12]))  # every_hidden dropped
    tap, ids = FeatureTap(inner), [1, 2, 3, 4, 5, 6, 7]
    out = forward_chain(tap, torch.tensor(ids), last_only=True)
    with torch.no_grad():
        ref = target(input_ids=torch.tensor([ids]))
        features = target.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # after the final norm
    assert out.logits.shape == (1, 16)
    torch.testing.assert_close(out.logits, ref.logits[0, -1:], atol=1e-4, rtol=1e-4)
    if broken:
        assert tap.hidden.shape[0] != len(ids)
        return
    torch.testing.assert_close(tap.hidden, features, atol=1e-4, rtol=1e-4)


def _reference_features(target, head, ids: list[int]) -> torch.Tensor:
    """float [L, H]: the head's features over `ids` by one teacher-forced forward (target features, causal)."""
    parts = TargetParts.of(target)
    with torch.no_grad():
        hidden = target.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [L, H] (after the final norm)
        feats = torch.cat([torch.zeros(1, hidden.shape[1]), hidden[:-1]])[None]  # row t: position t-1's
        n = len(ids)
        mask = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), 0.0, torch.finfo(torch.float32).min)
        return head(parts, torch.tensor([ids]), feats, torch.arange(n)[None], mask[None, None])[0]


def _assert_cache_is_teacher_forced(target, head_dir, prompt, **options):
    ids, m, backend = _decode(target, head_dir, prompt, GREEDY, 30, **options)
    rows = backend.cache_len
    assert m.accepted > 0 and rows > len(prompt)
    assert torch.equal(backend._pos, torch.arange(rows)), "the head's cache holds rows off the committed path"
    ref = _reference_features(target, backend.head, (prompt + ids)[:rows])
    torch.testing.assert_close(backend._out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("options", [{"k": 3}, {"tree": (3, 2, 1)}])
def test_the_heads_cache_is_the_teacher_forced_one(tiny, options):
    """After generation, every row the head kept equals a full forward of the head over the committed text with
    the target's features: cut to the accepted path, fed the right features."""
    _assert_cache_is_teacher_forced(*tiny, [1, 2, 3], **options)


@pytest.mark.parametrize("mutant", ["cache_not_cut", "stale_features"])
def test_a_broken_head_cache_is_caught(tiny, monkeypatch, mutant):
    """The same check fails when the head keeps rejected rows, or reads a feature one position too old. (Neither
    changes the output law: they only make worse drafts, which the lossless verifiers then reject.)"""
    if mutant == "cache_not_cut":
        monkeypatch.setattr(HeadBackend, "keep", lambda self, indices: None)
    else:
        real = HeadBackend._features

        def stale(self, positions, mask, start):
            return real(self, (positions - 1).clamp(min=0), mask, start)

        monkeypatch.setattr(HeadBackend, "_features", stale)
    with pytest.raises((AssertionError, MultispecError)):  # stale rows: also two parents at one position
        _assert_cache_is_teacher_forced(*tiny, [1, 2, 3], k=3)


def test_confidence_stops_the_chain_early(tiny):
    """With `confidence`, rounds stop drafting once the head is unsure: fewer drafted tokens than the fixed chain."""
    target, head_dir = tiny
    _, fixed, _ = _decode(target, head_dir, [1, 2, 3], GREEDY, 24, k=6)
    _, stopped, _ = _decode(target, head_dir, [1, 2, 3], GREEDY, 24, k=6, confidence=0.9)
    assert 0 < stopped.drafted_tokens < fixed.drafted_tokens


# Runs per law test (2,000 until the suite passed 15 minutes; 6**3 cells, so a few hundred runs leave most expected
# counts below 5, merged): the broken dynamic tree below fails the same test at 600 runs already (p = 1e-41 on this
# seed stream; 800: 4e-116, 1,000: 5e-218).
N_LAW = 1_000


def cheap_head_costs():
    """A fixed cost model in which the head's forward is cheap against the target's: auto's head plans then do not
    depend on the machine's timings or load."""
    from multispec.drafting.costs import BUCKETS, CostCurve, CostModel

    return CostModel(CostCurve([0.01 + 5e-4 * (b - 1) for b in BUCKETS]), CostCurve([1e-3] * len(BUCKETS)))


def _chi_square(head_dir, options, n=3_000, length=3, method="eagle", drafted=None, **more):
    """The chi-square p-value of n seeded runs' first `length` tokens at T = 1. auto plans with fixed costs in
    which the head is cheap (given no machine profile its policy would time the forwards in every run, and plan
    from those timings). drafted: a list given each run's drafted token count."""
    target = _target(vocab=6, seed=3)
    prompt, sampling = [1, 2, 2], SamplingConfig(temperature=1.0)
    counts, pair = np.zeros(6 ** length), _pair_of(target)
    config = build_method(method, head=str(head_dir), **options, **more)
    entry = get_method(method)
    loaded = entry.load(config, pair)
    for seed in range(n):
        policy = entry.make_policy(config, pair, loaded)
        if method == "auto":
            policy.fixed_costs = cheap_head_costs()
            policy.reset()
        ids, metrics, _ = _decode(target, head_dir, prompt, sampling, length, seed, method=method, loaded=loaded,
                                  pair=pair, policy=policy, **options, **more)
        if drafted is not None:
            drafted.append(metrics.drafted_tokens)
        counts[np.ravel_multi_index(ids[:length], (6,) * length)] += 1
    return chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length, 6))


@pytest.fixture(scope="module")
def head6(tmp_path_factory):
    return _head_dir(_target(vocab=6, seed=3), tmp_path_factory.mktemp("head6") / "head", seed=4)


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"k": 1}, {"k": 2, "verifier": "sd"}, {"tree": (2, 2)},
                                     {"nodes": 4, "depth": 2, "width": 2}, {"k": 3, "confidence": 0.4}])
def test_the_law_at_t1_is_the_targets(head6, options):
    """Length 3 after the prompt: every sequence takes at least two rounds with k = 1 and depth-1 trees, so the
    tap's and the head's cuts between rounds are part of the law tested."""
    assert _chi_square(head6, options, n=N_LAW) > 1e-3  # (the broken variants set their own n)


@pytest.mark.slow
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("options", [{"k": 2}, {"tree": (2, 1)}])
def test_the_law_at_t1_with_a_reduced_vocabulary(tmp_path, options, half, monkeypatch):
    """A head whose output layer covers 4 of the 6 tokens (q renormalised over them), its rows in float32 or in
    float16 (where that measures faster: reduced_vocab.half_rows_pay): the law is still the target's, on chains
    and trees."""
    import multispec.models.eagle as eagle_mod

    monkeypatch.setattr(eagle_mod, "half_rows_pay", lambda *a: half)
    target = _target(vocab=6, seed=3)
    torch.manual_seed(4)
    head = new_head(target)
    with torch.no_grad():
        head.fc.weight.mul_(3.0)
    head_dir = save_head(head, target, tmp_path / "head", token_ids=torch.tensor([0, 1, 2, 4]))
    assert load_head(head_dir, target)[1].tolist() == [0, 1, 2, 4]
    assert _chi_square(head_dir, options, n=N_LAW) > 1e-3


@pytest.mark.slow
def test_a_dynamic_tree_verified_with_a_law_it_was_not_drawn_from_is_caught(head6, monkeypatch):
    """The dynamic tree's tokens are the head's top ones, not draws: verified as if they were drawn from a law
    (here uniform over the vocabulary) instead of as point masses, the output's law is not the target's."""
    from multispec.drafting import proposers

    propose = proposers.DynamicHeadProposer.propose

    def broken(self, inputs, plan, max_tree):
        p = propose(self, inputs, plan, max_tree)
        return p if p.q is None else replace(p, q=(p.q.sum(1, keepdim=True) > 0).float().expand_as(p.q) / p.q.shape[1])

    monkeypatch.setattr(proposers.DynamicHeadProposer, "propose", broken)
    assert _chi_square(head6, {"nodes": 4, "depth": 2, "width": 2}, n=800) < 1e-3


@pytest.mark.slow
def test_a_target_cache_not_cut_is_caught(head6, monkeypatch):
    """The same chi-square fails when the feature tap gathers its features but does not cut the target's cache."""
    monkeypatch.setattr(FeatureTap, "keep", lambda self, indices: setattr(self, "hidden", self.hidden[indices]))
    try:  # on trees the stale rows also push the tap's rows out of line with the cache: an IndexError
        assert _chi_square(head6, {"tree": (3, 2)}) < 1e-3
    except IndexError:
        pass


def test_save_load_and_refusals(tiny, tmp_path):
    target, head_dir = tiny
    head, token_ids = load_head(head_dir, target)
    assert token_ids is None and head.fc.weight.shape == (32, 64)
    other = tiny_llama(vocab=20, hidden=32, layers=2, heads=4, kv_heads=2)
    with pytest.raises(MultispecError, match="vocab_size"):
        load_head(head_dir, other)
    with pytest.raises(MultispecError, match="hidden_size"):
        load_head(head_dir, tiny_llama(vocab=16, hidden=48, layers=2, heads=4, kv_heads=2))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text((head_dir / "config.json").read_text())
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(MultispecError, match="cannot read"):
        load_head(tmp_path / "bad", target)
    with pytest.raises(MultispecError, match="needs a trained head"):
        build_method("eagle")
    for bad, needle in [(dict(k=2, tree=(2, 1)), "give one of k"), (dict(nodes=4, k=2), "give one of k"),
                        (dict(depth=3), "give nodes"), (dict(nodes=3, depth=4), "more than the tree's 3 nodes"),
                        (dict(nodes=4, width=0), "width"), (dict(nodes=4, confidence=0.5), "not nodes"),
                        (dict(nodes=4, verifier="traversal"), "give no verifier")]:
        with pytest.raises(MultispecError, match=needle):
            build_method("eagle", head=str(head_dir), **bad)


def test_the_shipped_head_is_found_by_the_targets_fingerprint(tiny, tmp_path, monkeypatch):
    """head="shipped" loads the installed head whose fingerprint is the target's; another target (same shapes,
    other weights) is refused in one line naming the heads that ship."""
    import shutil

    from multispec.models import eagle_io

    target, head_dir = tiny
    shipped = tmp_path / "shipped"
    shutil.copytree(head_dir, shipped / "tiny-llama")
    monkeypatch.setattr(eagle_io, "SHIPPED_DIR", shipped)
    head, _ = load_head("shipped", target)
    torch.testing.assert_close(head.fc.weight, load_head(head_dir, target)[0].fc.weight)
    ids, _, _ = _decode(target, "shipped", [1, 2, 3], GREEDY, 12, k=3)
    assert ids == greedy_reference(target, [1, 2, 3], 12)
    with pytest.raises(MultispecError, match="no shipped head for this target.*tiny-llama") as e:
        load_head("shipped", _target(seed=5))
    assert "\n" not in str(e.value)


def test_generate_batch_and_auto_through_the_api(tmp_path):
    from multispec import generate, load_pair

    paths = save_tiny_pair(tmp_path)
    pair = load_pair(target=str(paths["target"]), device="cpu")
    head_dir = _head_dir(pair.target, tmp_path / "head")
    prompts = ["def f(x):", "x = x + 1\nx = x + 1\n"]
    ar = [r.token_ids for r in generate(pair, prompts, method="ar", max_new_tokens=16, temperature=0)]
    one = [generate(pair, p, method="eagle", head=str(head_dir), tree=(2, 1), max_new_tokens=16,
                    temperature=0).token_ids for p in prompts]
    batch = generate(pair, prompts, method="eagle", head=str(head_dir), max_new_tokens=16, temperature=0,
                     batch_size=2, backend="fast")
    assert one == ar == [r.token_ids for r in batch]
    assert generate(pair, prompts[0], method="auto", max_new_tokens=8, temperature=0).token_ids == ar[0][:8]
    sampled = generate(pair, prompts[0], method="eagle", head=str(head_dir), max_new_tokens=8, temperature=1.0,
                       seed=3)
    assert sampled.stats["method"] == "eagle" and sampled.stats["lossless"]


def test_train_head_on_a_tiny_target_then_decode(tmp_path, capsys):
    """The recipe end to end on a tiny pair: features, a few steps, the best head saved, loadable, greedy-exact;
    bad input refused in one line each."""
    from helpers import assert_one_line_error, run_cli
    from multispec import generate, load_pair
    from multispec.training.eagle import HeadTrainConfig, train_head

    paths = save_tiny_pair(tmp_path)
    data = tmp_path / "train.txt"
    data.write_text("def f(x):\n    return x + 1\n" * 60)
    out = tmp_path / "head"
    summary = train_head(HeadTrainConfig(target=str(paths["target"]), out=str(out), data=(str(data),), minutes=0.05,
                                         seq_len=16, batch=2, vocab=12), log=lambda s: None)
    assert 0 <= summary["alpha"] <= 1 and (out / "model.safetensors").is_file() and (out / "training.json").is_file()
    pair = load_pair(target=str(paths["target"]), device="cpu")
    ar = generate(pair, "def f(x):", method="ar", max_new_tokens=12, temperature=0).token_ids
    assert generate(pair, "def f(x):", method="eagle", head=str(out), max_new_tokens=12, temperature=0).token_ids == ar
    from multispec.models.eagle_io import head_default
    from multispec.training.head_default import CHAINS

    # the chain length timed fastest at the end of training is what eagle drafts with when given none
    assert summary["default"]["k"] in CHAINS and "held-out prompts" in summary["default"]["measured"]
    assert head_default(out, pair.target) == {"k": summary["default"]["k"]}
    capsys.readouterr()
    code, _, err = run_cli(capsys, "train-head", "--target", str(paths["target"]), "--out", str(out))
    assert_one_line_error(code, err, "exists")
    before = load_head(out, pair.target)[0].fc.weight.clone()
    resumed = train_head(HeadTrainConfig(target=str(paths["target"]), out=str(out), data=(str(data),), minutes=0.05,
                                         seq_len=16, batch=2, resume=True), log=lambda s: None)
    after, ids = load_head(out, pair.target)
    assert resumed["steps"] > 0 and resumed["alpha"] >= summary["alpha"] - 1e-3  # trained on, kept the better
    assert torch.equal(before, after.fc.weight) == (resumed["step"] == 0)  # (the saved head, unless beaten)
    assert ids is not None and ids.numel() == 12  # and kept its reduced vocabulary
    code, _, err = run_cli(capsys, "train-head", "--target", str(paths["target"]), "--out", str(tmp_path / "none"),
                           "--resume")
    assert_one_line_error(code, err, "no head")
    (tmp_path / "empty.txt").write_text("")
    code, _, err = run_cli(capsys, "train-head", "--target", str(paths["target"]), "--out", str(tmp_path / "h2"),
                           "--data", str(tmp_path / "empty.txt"), "--minutes", "0.05")
    assert_one_line_error(code, err, "empty")
    code, _, err = run_cli(capsys, "train-head", "--target", str(paths["target"]), "--out", str(tmp_path / "h2"),
                           "--data", str(tmp_path / "missing.jsonl"))
    assert_one_line_error(code, err, "not found")
    (tmp_path / "short.jsonl").write_text('{"ids": [1, 2, 3]}\n')
    code, _, err = run_cli(capsys, "train-head", "--target", str(paths["target"]), "--out", str(tmp_path / "h2"),
                           "--data", str(tmp_path / "short.jsonl"), "--seq-len", "16", "--minutes", "0.05")
    assert_one_line_error(code, err, "at least 32 are needed")
    for flag, value, says in (("--max-tokens", "31", "--max-tokens must be >= 2 x --seq-len"),
                              ("--device", "tpu", "unknown device"), ("--device", "cuda:7", "cuda:7")):
        code, _, err = run_cli(capsys, "train-head", "--target", str(paths["target"]), "--out", str(tmp_path / "h3"),
                               "--seq-len", "16", flag, value)
        assert_one_line_error(code, err, says)
        assert not (tmp_path / "h3").exists()  # refused before anything was written
    # an --out under a regular file: refused before the model loads (it failed after the training, the head lost)
    code, _, err = run_cli(capsys, "train-head", "--target", str(paths["target"]), "--out", str(data / "head"))
    assert_one_line_error(code, err, "is a file, not a folder")


def test_train_head_reads_token_ids_and_several_sources(tmp_path):
    """--data given twice (token ids in JSONL, and text) trains on both: every row of the ids file, joined by EOS."""
    from multispec.training.eagle import chunk_tokens, read_texts

    rows = tmp_path / "ids.jsonl"
    rows.write_text('{"ids": [5, 6, 7], "n_prompt": 1}\n{"ids": [8, 9]}\n\n')
    docs = read_texts(str(rows), 10_000, 0)
    assert docs == [[5, 6, 7], [8, 9]]

    class Tok:
        def __call__(self, texts):
            return {"input_ids": [[1] * len(t) for t in texts]}

    chunks = chunk_tokens(Tok(), docs + ["abcd"], seq_len=3, max_tokens=100, eos=0)
    assert chunks.flatten().tolist() == [5, 6, 7, 0, 8, 9, 0, 1, 1, 1, 1, 0]
    (tmp_path / "bad.jsonl").write_text("[1, 2]\n")
    with pytest.raises(MultispecError, match="not a JSON object"):
        read_texts(str(tmp_path / "bad.jsonl"), 100, 0)


def test_own_data_is_the_targets_continuations(tmp_path):
    """--data own: the target's own greedy continuations of the built-in prompts (prompt ids first), stopped at
    the deadline; then a head trains on them."""
    import time

    from multispec import load_pair
    from multispec.text import encode_prompt
    from multispec.training.onpolicy import own_texts
    from multispec.training.prompts import code_prompts

    paths = save_tiny_pair(tmp_path)
    pair = load_pair(target=str(paths["target"]), device="cpu")
    docs = own_texts(pair, pair.target, time.monotonic() + 1.0, max_new=6, batch=4)
    assert len(docs) >= 4
    width = pair.target.config.max_position_embeddings - 6
    first = encode_prompt(pair.tokenizer, pair.target.config.vocab_size, code_prompts(1)[0])[-width:]
    doc = next(d for d in docs if d[:len(first)] == first)  # batches run in prompt-length order
    assert len(first) < len(doc) <= len(first) + 6
    ids = torch.tensor([first])
    greedy = pair.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                                  do_sample=False)[0].tolist()
    assert doc == greedy[:len(doc)]


def test_auto_drafts_with_a_head(tmp_path):
    """auto:head=DIR plans with the head in place of a draft model: greedy output is the target's, its head plans
    run (the stats name them), and a head without the draft proposer is refused."""
    from multispec import generate, load_pair

    paths = save_tiny_pair(tmp_path)
    pair = load_pair(target=str(paths["target"]), device="cpu")
    head_dir = _head_dir(pair.target, tmp_path / "head")
    prompt = "def f(x):\n    return x + 1\n" * 3
    ar = generate(pair, prompt, method="ar", max_new_tokens=40, temperature=0).token_ids
    out = generate(pair, prompt, method="auto", head=str(head_dir), proposers="draft", max_new_tokens=40,
                   temperature=0, backend="fast")
    assert out.token_ids == ar
    assert out.stats["method"] == "auto" and out.stats["lossless"]
    assert any(plan.startswith("head ") for plan in out.stats["auto"]["plans"]), out.stats["auto"]["plans"]
    with pytest.raises(MultispecError, match="keep draft among proposers"):
        build_method("auto", head=str(head_dir), proposers="lookup")


@pytest.mark.slow
def test_the_law_at_t1_with_auto_and_a_head(head6):
    """auto:head=DIR, its costs fixed with a cheap head: its head plans draft in most runs (with costs timed per
    run, as before, about one run in ten drafted) and the law is the target's."""
    drafted: list = []
    assert _chi_square(head6, {}, method="auto", n=N_LAW, proposers="draft", drafted=drafted) > 1e-3
    assert sum(d > 0 for d in drafted) > len(drafted) // 2


def test_greedy_under_a_grammar_is_the_constrained_argmax(tiny):
    """A grammar forces runs of tokens, committed without a target call; the head then drafts after tokens the
    target has not read yet (its own features for them, fed one at a time). Output: the target's constrained
    argmax, token by token."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from multispec.structured import Constraint, bind

    words, eos = "abcdefghijklmno", 15
    t = Tokenizer(models.BPE({w: i for i, w in enumerate(words)}, merges=[]))
    t.pre_tokenizer, t.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    t.add_special_tokens([AddedToken("</s>", special=True)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="</s>")
    grammar = bind(Constraint.of(regex="(ab|cd)eee[f-o]{2,6}(jkl|mno)[a-e]{1,4}"), tok, 16, {eos})
    target, head_dir = tiny
    for prompt in ([1, 2, 3], [0, 7, 7, 7, 2, 9, 4]):
        state, ids, want = grammar.start(), list(prompt), []
        with torch.no_grad():
            while not want or want[-1] != eos:
                logits = target(input_ids=torch.tensor([ids])).logits[0, -1]
                want.append(int(logits.masked_fill(~state.mask(16), float("-inf")).argmax()))
                ids.append(want[-1])
                state.commit(want[-1:])
        for options in ({"k": 3}, {"tree": (2, 2, 1)}):
            got, m, _ = _decode(target, head_dir, prompt, SamplingConfig(0.0, grammar=grammar), len(want), **options)
            assert got == want, (options, prompt)
            assert m.forced_tokens >= 1 and m.drafted_tokens > 0


@pytest.mark.parametrize("broken", [False, True])
def test_a_catch_up_before_late_rows_runs_the_output_layer_on_its_last_row(tiny, broken, monkeypatch):
    """A head call asked for its last row only, whose tail the target has not read (a deferred prompt caught up with
    a grammar's forced tokens at its end: those rows go one at a time, in_pieces), runs the output layer on one row
    of the part that goes at once, not on all of them; its last row and every row the head keeps are those of the
    same call asked for every row. Broken variant: the part at once asked for every row's logits is caught."""
    import multispec.models.eagle as eagle

    if broken:
        real = eagle.in_pieces
        monkeypatch.setattr(eagle, "in_pieces", lambda forward, *a: real(
            lambda *x, last_only=False: forward(*x), *a))
    target, head_dir = tiny
    config = build_method("eagle", head=str(head_dir), k=2)
    entry, pair = get_method("eagle"), SimpleNamespace(target=target, draft=None)
    loaded = entry.load(config, pair)
    prompt, forced = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [7, 8, 9]
    ids = torch.tensor(prompt + forced)
    outs, rows = [], []
    for last_only in (True, False):
        tap, head = entry.draft_backend(config, loaded, make_backend(target, "fast"), pair)
        assert head.vocab_subset is None  # (the output layer is the target's lm_head itself)
        forward_chain(tap, torch.tensor(prompt), last_only=True)  # the target reads the prompt, not the tail
        seen: list[int] = []
        hook = head.parts.lm_head.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
        outs.append((head.forward(ids, torch.arange(len(ids)), None, last_only=last_only), head))
        hook.remove()
        rows.append(sum(seen))
    (once, kept), (every, ref) = outs
    late = len(forced) - 1  # rows whose parent is past the target's rows and not a cached row of the head
    assert rows[1] == len(ids)
    if broken:
        assert rows[0] > 1 + late
        return
    assert rows[0] == 1 + late  # the part at once: its last row; each late row alone
    assert torch.equal(once.logits, every.logits[-1:])
    assert torch.equal(kept._pos, ref._pos) and torch.equal(kept._out, ref._out)


def _letters_grammar(regex: str):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from multispec.structured import Constraint, bind

    t = Tokenizer(models.BPE({w: i for i, w in enumerate("abcdefghijklmno")}, merges=[]))
    t.pre_tokenizer, t.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    t.add_special_tokens([AddedToken("</s>", special=True)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="</s>")
    return bind(Constraint.of(regex=regex), tok, 16, {15}), tok


@pytest.mark.parametrize("broken", [False, True])
def test_a_head_whose_vocabulary_the_grammar_excludes_still_drafts_at_t1(tmp_path, monkeypatch, broken):
    """A head whose reduced vocabulary (tokens 0-7: a-h) holds nothing the grammar allows ([i-o], tokens 8-14) gives
    every allowed token probability 0: its masked law has no mass. That row's children are drawn from the uniform
    law over what the grammar allows (the verifier reads that q, so the round stays lossless), and sampling at T = 1
    completes under the grammar; drafting from the empty law (the broken variant) fails with a NaN-logits error
    (Qwen-style tool calls on SmolLM2 with its shipped head hit this)."""
    import re

    from multispec.drafting import grow
    from multispec.errors import MultispecError

    if broken:
        monkeypatch.setattr(grow, "_draft_dists", lambda logits, sampling, history=None: grow.process_logits(
            logits, sampling, history))
    target = _target()
    torch.manual_seed(5)
    head = new_head(target)
    head_dir = save_head(head, target, tmp_path / "head", token_ids=torch.arange(8))
    grammar, tok = _letters_grammar("[i-o]{5}")
    law = SamplingConfig(1.0, grammar=grammar)
    for seed in range(3):
        if broken:
            with pytest.raises(MultispecError, match="NaN"):
                _decode(target, head_dir, [1, 2, 3], law, 6, seed=seed, k=3)
            return
        ids = _decode(target, head_dir, [1, 2, 3], law, 6, seed=seed, k=3)[0]
        assert re.fullmatch("[i-o]{5}", tok.decode(ids[:5])) and ids[5] == 15, ids  # then the grammar's EOS
