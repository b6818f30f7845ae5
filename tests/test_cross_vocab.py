"""A draft with another tokenizer (issue 29): both modes keep the target's law and its greedy output.

Two tiny BPE tokenizers built here, so that every awkward case is present:
- target: <eos> a b c é ab aé bb      draft: <eos> b a ca é ab cc c
- tokens with no counterpart: the target's "aé" and "bb", the draft's "ca" and "cc";
- a multi-byte character: "é" (two bytes in UTF-8), and the target's "aé" that the draft spells as "a" + "é";
- a draft token across a target boundary: the draft's "ca" is the target's "c" + "a" (re-tokenization proposes
  two target tokens from one draft token; the intersection never proposes it).
The prompt "baé" is the target's [b, aé] and the draft's [b, a, é].
"""
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from engine_utils import chi_square_pvalue, exact_joint, greedy_reference, tiny_pair
from multispec.decoding.decoder import Decoder
from multispec.drafting import grow
from multispec.errors import MultispecError
from multispec.loading import load_pair
from multispec.models.vocab_bridge import VocabBridge

TARGET_VOCAB = ["<eos>", "a", "b", "c", "é", "ab", "aé", "bb"]
TARGET_MERGES = [("a", "b"), ("a", "é"), ("b", "b")]
DRAFT_VOCAB = ["<eos>", "b", "a", "ca", "é", "ab", "cc", "c"]
DRAFT_MERGES = [("c", "a"), ("a", "b"), ("c", "c")]
V = 8
PROMPT = "baé"
# runs per law test (2000 until the suite passed 15 minutes): each mode's broken variant below fails at 500 already
# (p = 2e-67 with tli, 5e-46 with uag; 1000: 2e-169 and 7e-154)
SAMPLES = 1000


def bpe_tokenizer(vocab: list[str], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(vocab)}, merges))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """The tiny target and a draft (a perturbed copy: its ids mean other strings, so it is a poor draft) saved with
    their tokenizers, as a user would have them on disk."""
    root = tmp_path_factory.mktemp("cross")
    target, draft = tiny_pair(vocab=V, seed=3, noise=0.3)
    for model, (vocab, merges), name in ((target, (TARGET_VOCAB, TARGET_MERGES), "target"),
                                         (draft, (DRAFT_VOCAB, DRAFT_MERGES), "draft")):
        model.config.eos_token_id = 0
        model.generation_config.eos_token_id = 0
        model.save_pretrained(root / name)
        bpe_tokenizer(vocab, merges).save_pretrained(root / name)
    return root


@pytest.fixture(scope="module", params=["tli", "uag"])
def pair(request, model_dirs):
    return load_pair(str(model_dirs / "target"), str(model_dirs / "draft"), device="cpu", cross_vocab=request.param)


@pytest.fixture(scope="module")
def exact(model_dirs):
    p = load_pair(str(model_dirs / "target"), device="cpu")
    ids = p.tokenizer(PROMPT).input_ids
    from multispec.sampling import SamplingConfig

    return exact_joint(p.target, ids, SamplingConfig(temperature=1.0), 2, V)


def test_the_tokenizers_have_the_cases_the_law_tests_need(model_dirs):
    t = bpe_tokenizer(TARGET_VOCAB, TARGET_MERGES)
    d = bpe_tokenizer(DRAFT_VOCAB, DRAFT_MERGES)
    assert t(PROMPT).input_ids == [2, 6] and d(PROMPT).input_ids == [1, 2, 4]
    bridge = VocabBridge(t, d, V, V)
    # the intersection: <eos> a b c é ab; "aé" and "bb" have no counterpart
    assert dict(zip(bridge.target_ids.tolist(), bridge.draft_ids.tolist())) == {0: 0, 1: 2, 2: 1, 3: 7, 4: 4, 5: 5}
    assert bridge.expand(6) == [2, 4] and bridge.expand(7) == [1, 1]  # spelled in the draft's tokens
    assert "é".encode() == b"\xc3\xa9"


def counts_of_first_two(decoder: Decoder) -> tuple[np.ndarray, int]:
    counts = np.zeros(V * V, dtype=np.int64)
    accepted = 0
    for seed in range(SAMPLES):
        r = decoder.generate(PROMPT, max_new_tokens=3, temperature=1.0, seed=seed, ignore_eos=True)
        counts[r.token_ids[0] * V + r.token_ids[1]] += 1
        accepted += r.stats["num_accepted_draft_tokens"]
    return counts, accepted


# auto only chooses among these plans (and on this tiny pair its cost model soon stops drafting)
@pytest.mark.slow
@pytest.mark.parametrize("method, options", [("sd", {"k": 2}), ("mcsd", {"tree": (2, 1)})])
def test_the_output_law_through_generate_is_the_targets(pair, exact, method, options):
    if pair.cross_vocab == "uag" and method == "mcsd":
        pytest.skip("re-tokenization proposes one chain: tree methods are refused (test below)")
    decoder = Decoder(pair, method, "fast", **options)
    counts, accepted = counts_of_first_two(decoder)
    p = chi_square_pvalue(counts, exact)
    print(f"{pair.cross_vocab} {method}: p = {p:.3g}, accepted draft tokens {accepted}")
    assert p > 1e-3
    assert accepted > 0.05 * SAMPLES  # the draft's proposals were verified, and some accepted


@pytest.mark.slow
def test_a_verifier_given_the_wrong_draft_law_is_caught(pair, exact, monkeypatch):
    """Broken variants, one per mode, on the one place either could break the law (the engine drafts from exactly
    the q it verifies with, so the modes' mappings and caches can only change acceptance):
    - tli: q not renormalised over the intersection: the verifier reads the draft's mass on the intersection
      (here 60 % of it), while drafts follow the renormalised law (torch.multinomial renormalises its weights);
    - uag: the proposal verified with the draft's own confidence in it (0.5) instead of a point mass."""
    right = grow._draft_dists
    factor = 0.6 if pair.cross_vocab == "tli" else 0.5
    calls = []

    def broken(logits, sampling, history=None):
        calls.append(1)
        return right(logits, sampling, history) * factor

    monkeypatch.setattr(grow, "_draft_dists", broken)
    counts, _ = counts_of_first_two(Decoder(pair, "sd", "fast", k=2))
    p = chi_square_pvalue(counts, exact)
    print(f"broken {pair.cross_vocab}: p = {p:.3g}")
    assert calls and p < 1e-6


@pytest.mark.parametrize("method, options", [("sd", {"k": 3}), ("mcsd", {"tree": (2, 2, 1)}), ("auto", {})])
def test_greedy_output_is_the_targets_own(pair, model_dirs, method, options):
    if pair.cross_vocab == "uag" and method == "mcsd":
        pytest.skip("re-tokenization proposes one chain: tree methods are refused (test below)")
    for backend in ("fast", "hf"):
        decoder = Decoder(pair, method, backend, **options)
        r = decoder.generate("cab" + PROMPT, max_new_tokens=24, temperature=0, ignore_eos=True)
        ids = pair.tokenizer("cab" + PROMPT).input_ids
        assert r.token_ids == greedy_reference(pair.target, ids, 24), (method, backend)
        assert r.stats["cross_vocab"] == (pair.cross_vocab if decoder.uses_draft else None)


def test_retokenization_refuses_trees_and_hidden_state_heads(model_dirs, tmp_path):
    from multispec.heads import acceptance

    pair = load_pair(str(model_dirs / "target"), str(model_dirs / "draft"), device="cpu", cross_vocab="uag")
    with pytest.raises(MultispecError, match="drafts token trees.*one chain"):
        Decoder(pair, "mcsd")
    with pytest.raises(MultispecError, match="drafts token trees.*one chain"):
        Decoder(pair, "dynamic")
    head = acceptance.save_head(acceptance.AcceptanceHead(int(pair.draft.config.hidden_size), 1), tmp_path / "h")
    with pytest.raises(MultispecError, match="reads the draft's hidden states"):
        Decoder(pair, "specdecpp", head=str(head))
    tli = load_pair(str(model_dirs / "target"), str(model_dirs / "draft"), device="cpu", cross_vocab="tli")
    Decoder(tli, "specdecpp", head=str(head))  # the intersection has the draft's hidden states: allowed


def test_bad_inputs_are_one_line_errors(model_dirs, tmp_path):
    t, d = str(model_dirs / "target"), str(model_dirs / "draft")
    with pytest.raises(MultispecError, match="cross_vocab must be one of tli, uag"):
        load_pair(t, d, cross_vocab="bpe")
    with pytest.raises(MultispecError, match="shares the target's vocabulary"):
        load_pair(t, t, cross_vocab="tli")
    pair = load_pair(t, d, device="cpu")
    assert pair.cross_vocab == "tli"  # the default mode
    with pytest.raises(MultispecError, match="draft_vocab restricts a draft that shares"):
        Decoder(pair, "sd", draft_vocab=4)
    # a draft of another vocabulary size with no tokenizer files: nothing to map it by
    _, other = tiny_pair(vocab=12, seed=5)
    other.save_pretrained(tmp_path / "bare")
    with pytest.raises(MultispecError, match="vocabularies differ.*no tokenizer files"):
        load_pair(t, str(tmp_path / "bare"), device="cpu")


def test_the_mode_is_said_in_one_line_at_load(model_dirs, capsys):
    load_pair(str(model_dirs / "target"), str(model_dirs / "draft"), device="cpu", cross_vocab="uag")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "text re-tokenization" in err[0] and "6 of the target's 8 tokens" in err[0]


def test_a_batch_runs_its_sequences_one_at_a_time_and_says_so(model_dirs):
    from multispec.api import generate

    pair = load_pair(str(model_dirs / "target"), str(model_dirs / "draft"), device="cpu")
    results = generate(pair, [PROMPT, "ab"], method="sd", max_new_tokens=6, temperature=0, batch_size=2)
    alone = [generate(pair, p, method="ar", max_new_tokens=6, temperature=0).token_ids for p in (PROMPT, "ab")]
    assert [r.token_ids for r in results] == alone
    assert any("another tokenizer" in w for w in results[0].stats["warnings"])


def test_a_draft_beyond_its_positions_reads_a_window(model_dirs):
    """The intersection draft restarts from the newest half of its rows where its positions run out; the
    re-tokenized one moves its window ahead. Greedy output stays the target's own."""
    for mode in ("tli", "uag"):
        pair = load_pair(str(model_dirs / "target"), str(model_dirs / "draft"), device="cpu", cross_vocab=mode)
        pair.draft.config.max_position_embeddings = 40  # read by cross_vocab_backend: a 40-row draft
        decoder = Decoder(pair, "sd", "fast", k=3)
        for prompt in (PROMPT * 3, PROMPT * 20):  # the second alone is longer than the draft's positions
            r = decoder.generate(prompt, max_new_tokens=60, temperature=0, ignore_eos=True)
            ids = pair.tokenizer(prompt).input_ids
            assert r.token_ids == greedy_reference(pair.target, ids, 60)
        if mode == "tli":
            assert decoder._draft.restarts > 0
        else:
            assert decoder._draft.window > 0
        assert decoder._draft.inner.cache_len <= 40


def test_cli_takes_the_mode_and_refuses_batched_serving(model_dirs, capsys):
    import json

    from helpers import run_cli

    t, d = str(model_dirs / "target"), str(model_dirs / "draft")
    code, out, err = run_cli(capsys, "generate", PROMPT, "--target", t, "--draft", d, "--cross-vocab", "uag",
                             "--method", "sd", "--temperature", "0", "--max-new-tokens", "6", "--json")
    assert code == 0, err
    assert json.loads(out)["cross_vocab"] == "uag" and "text re-tokenization" in err
    code, _, err = run_cli(capsys, "serve", "--target", t, "--draft", d, "--max-batch", "2")
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("multispec: the draft")]
    assert code == 2 and len(lines) == 1 and "--max-batch" in lines[0] and "another tokenizer" in lines[0]
