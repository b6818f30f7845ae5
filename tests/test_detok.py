"""Incremental detokenization (text.TokenEnds, shared by StopStrings and Streamer): the text of every round, the
stop cuts, the streamed deltas and chunks and the final result equal those of the whole-output decoding it replaced
(tests/detok_reference.py), over random token sequences whose multi-byte characters are split across tokens."""
import random

import pytest

from detok_reference import OldStopStrings, OldStreamer, OldTokenEnds
from helpers import save_tiny_pair
from multispec.text import StopStrings, Streamer, TokenEnds

WORDS = ["def", " return", " x", " =", " 1", "\n", " é", "中文", "字", "😀", "🎉", " ß", "∑", "€", "ひらがな", " ", "(", ")",
         "'s", " .", " ,", "\ufffd"]


class LetterTokenizer:
    """One letter per id (the stop-string tests' tokenizer): every token is a clean end."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


class MergingTokenizer(LetterTokenizer):
    """Not local: "ab" across two tokens decodes as "X", so a round's text need not extend the round before's."""

    def decode(self, ids, skip_special_tokens=True):
        return super().decode(ids).replace("ab", "X")


class CleaningTokenizer(LetterTokenizer):
    """Cleans up spaces before punctuation (WordPiece's clean_up_tokenization_spaces): not local either."""

    clean_up_tokenization_spaces = True
    chars = "ab .,'s"

    def __len__(self):
        return len(self.chars)

    def encode(self, text, add_special_tokens=False):
        return [self.chars.index(c) for c in text if c in self.chars]

    def decode(self, ids, skip_special_tokens=True):
        text = "".join(self.chars[i % len(self.chars)] for i in ids)
        return text.replace(" .", ".").replace(" ,", ",").replace(" 's", "'s")


def _hf(path, **kwargs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, **kwargs)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from multispec.loading import DEFAULT_PAIR_DIR

    tiny = save_tiny_pair(tmp_path_factory.mktemp("detok"))["target"]
    toks = {"tiny": _hf(tiny), "embedded": _hf(DEFAULT_PAIR_DIR / "target"), "letters": LetterTokenizer(),
            "merging": MergingTokenizer()}
    toks["cleaning"] = CleaningTokenizer()
    bpe_cleanup = _hf(tiny)
    bpe_cleanup.clean_up_tokenization_spaces = True  # which transformers ignores for BPE: still local
    toks["bpe_cleanup"] = bpe_cleanup
    pycode = DEFAULT_PAIR_DIR.parents[3] / "shared" / "models" / "pycode-v1" / "target"  # ../shared
    if (pycode / "tokenizer.json").exists():
        toks["pycode"] = _hf(pycode)
    return toks


def _smollm2():
    from real_models import find_smollm2

    path = find_smollm2()
    if path is None:
        pytest.skip("SmolLM2 is not here (tests/real_models.py says where it is looked for)")
    return _hf(path.parent, gguf_file=path.name)


def _sequence(rng: random.Random, tok, vocab: int) -> list[int]:
    """Encoded text with multi-byte characters, runs of random ids (bytes that do not form characters) and
    special tokens, mixed."""
    ids: list[int] = []
    while len(ids) < rng.randrange(20, 160):
        kind = rng.random()
        if kind < 0.5 and hasattr(tok, "encode"):
            text = "".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 8)))
            ids += list(tok.encode(text, add_special_tokens=False))
        elif kind < 0.9:
            ids += [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))]
        else:
            ids.append(0)  # <|endoftext|> in the byte-level tokenizers: a special token, no text
    return ids


def _stops(rng: random.Random, text: str) -> list[str]:
    stops = []
    for _ in range(rng.randrange(0, 4)):
        if text and rng.random() < 0.8:
            i = rng.randrange(len(text))
            stops.append(text[i:i + rng.randrange(1, 7)])
        else:
            stops.append(rng.choice(WORDS) + rng.choice(WORDS))
    return [s for s in stops if s]


def _run(stop_cls, streamer_cls, tok, ids, stops, after, rounds, eos_at, tokens, check_text=False):
    """What the engine and the Decoder do with a stop matcher and a streamer, round by round."""
    st = stop_cls(tok, stops, after_tokens=after)
    out: list = []
    streamer = streamer_cls(st, out.append, tokens=tokens)
    new: list[int] = []
    cuts, i, end = [], 0, None
    for r in rounds:
        new.extend(ids[i:i + r])
        i += r
        if eos_at is not None and eos_at < len(new):
            end = eos_at + 1
        elif st:
            k = st.cut_ids(new)
            cuts.append(k)
            end = k
        if end is None and i >= len(ids):
            end = len(new)
        if end is not None:
            break
        streamer.on_tokens(new)
        if check_text and st.incremental:
            assert st.detok.text == tok.decode(new, skip_special_tokens=True)
    new = new[:end]
    streamer.on_tokens(new)
    text, kept = st.final(new)
    streamer.flush(text, kept)
    return cuts, out, text, kept, new


def _compare(tok, n_sequences: int, seed: int) -> int:
    """Checks n_sequences random generations against the reference; returns how many were cut by a stop string."""
    rng = random.Random(seed)
    vocab = len(tok) if hasattr(tok, "__len__") else 26
    stopped = 0
    for _ in range(n_sequences):
        ids = _sequence(rng, tok, vocab)
        whole = tok.decode(ids, skip_special_tokens=True)
        stops, after = _stops(rng, whole), rng.choice([0, 0, 0, 1, 3, 10])
        rounds = [rng.randrange(1, 5) for _ in range(len(ids))]
        eos_at = rng.randrange(len(ids)) if rng.random() < 0.2 else None
        tokens = rng.random() < 0.5
        got = _run(StopStrings, Streamer, tok, ids, stops, after, rounds, eos_at, tokens, check_text=True)
        want = _run(OldStopStrings, OldStreamer, tok, ids, stops, after, rounds, eos_at, tokens)
        assert got == want, (ids, stops, after, rounds, eos_at, tokens)
        cuts, out, text, kept, new = got
        stopped += any(k is not None for k in cuts)
        assert tok.decode(new, skip_special_tokens=True).startswith(text)
        assert text == tok.decode(new, skip_special_tokens=True) or stops
        # a stop holding U+FFFD may let the stream show more, and so may a decoding that is not local, as they did
        if not any("\ufffd" in s for s in stops) and not isinstance(tok, (MergingTokenizer, CleaningTokenizer)):
            assert "".join(c if isinstance(c, str) else c.text for c in out) == text
    return stopped


@pytest.mark.parametrize("name", ["tiny", "embedded", "pycode", "letters", "merging", "cleaning", "bpe_cleanup"])
def test_incremental_text_stops_and_stream_equal_the_whole_decoding(tokenizers, name):
    if name not in tokenizers:
        pytest.skip(f"the {name} tokenizer is not here")
    tok = tokenizers[name]
    incremental = StopStrings(tok, ["x"]).incremental
    assert incremental == (name != "cleaning")
    stopped = _compare(tok, 120, seed=sum(map(ord, name)))
    assert stopped > 20  # the stops were taken from the text: most runs end at one


def test_incremental_matches_on_smollm2():
    assert _compare(_smollm2(), 120, seed=5) > 20


def test_token_ends_follow_rewind_and_prefix_texts(tokenizers):
    """TokenEnds' starts and ends equal the reference's; text_upto(n) is decode(ids[:n]) for every n; a shorter
    list rewinds to a clean end and a different one starts afresh, with the same state as a fresh follower."""
    tok = tokenizers["tiny"]
    rng = random.Random(3)

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    for _ in range(30):
        ids = _sequence(rng, tok, len(tok))
        ends, old = TokenEnds(decode), OldTokenEnds(decode)
        assert ends.extend(ids) == old.extend(ids) and ends.ends == old.ends
        assert ends.text == decode(ids) and ends.local
        assert all(ends.text_upto(n) == decode(ids[:n]) for n in range(len(ids) + 1))
        m = rng.randrange(len(ids))
        ends.update(ids[:m])
        fresh = TokenEnds(decode)
        fresh.extend(ids[:m])
        assert (ends.ids, ends.starts, ends.ends, ends.text) == (fresh.ids, fresh.starts, fresh.ends, fresh.text)
        other = [rng.randrange(len(tok)) for _ in range(m + 5)]
        ends.update(other)
        assert ends.ids == other and ends.text == decode(other)
