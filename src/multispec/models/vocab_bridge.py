"""What a draft with another tokenizer can say in the target's tokens (issue 29).

Two tokenizers agree on a token when it stands for the same bytes. `VocabBridge` reads every token's bytes from each
tokenizer (byte-level BPE through the GPT-2 byte alphabet, SentencePiece through "▁" and its <0xNN> byte tokens,
anything else through decode) and builds:
- the intersection: draft id -> target id for tokens with the same bytes (vLLM's token-level intersection), special
  tokens matched by role (BOS with BOS, EOS with EOS) or by equal text;
- `expand(t)`: the draft ids that spell target token t, so that the draft can read any committed text (the
  intersection token itself, else a longest-match spelling of its bytes over the draft's vocabulary).

Nothing here decides what the output is: the target verifies every proposal, and the draft's law is exactly what it
proposes from. A mapping that missed a token would only lower acceptance.
"""
from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (the map every byte-level BPE uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _scheme(tokenizer) -> str:
    """"byte_level", "metaspace" or "decode": how this tokenizer's token strings map to bytes."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = repr(getattr(backend, "decoder", None))
    if "ByteLevel" in decoder:
        return "byte_level"
    if "Metaspace" in decoder or "▁" in decoder:
        return "metaspace"
    return "decode"


def token_bytes(tokenizer, vocab_size: int) -> list[bytes | None]:
    """The bytes each id in [0, vocab_size) stands for; None for special tokens, ids past the tokenizer and tokens
    whose bytes cannot be read."""
    special = set(tokenizer.all_special_ids)
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(tokenizer)))))
    scheme, alphabet = _scheme(tokenizer), _byte_alphabet()
    out: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(None)
        elif scheme == "byte_level":
            try:
                out.append(bytes(alphabet[c] for c in piece))
            except KeyError:  # an added token outside the byte alphabet: its text
                out.append(piece.encode())
        elif scheme == "metaspace":
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(bytes([int(piece[3:5], 16)]))
            else:
                out.append(piece.replace("▁", " ").encode())
        else:
            text = tokenizer.decode([i])
            out.append(None if "\ufffd" in text or not text else text.encode())
    return out + [None] * (vocab_size - len(out))


class VocabBridge:
    """The map between a target's and a draft's vocabularies. target_vocab / draft_vocab: the models' output rows.

    draft_ids, target_ids: long [K], the intersection (draft_ids[i] spells target_ids[i]); each target id once."""

    def __init__(self, target_tokenizer, draft_tokenizer, target_vocab: int, draft_vocab: int):
        self.target_tokenizer, self.draft_tokenizer = target_tokenizer, draft_tokenizer
        self.target_vocab, self.draft_vocab = target_vocab, draft_vocab
        t_bytes = token_bytes(target_tokenizer, target_vocab)
        d_bytes = token_bytes(draft_tokenizer, draft_vocab)
        self._t_bytes = t_bytes
        by_bytes = {b: i for i, b in enumerate(t_bytes) if b is not None}
        pairs = {}  # target id -> draft id
        for d, b in enumerate(d_bytes):
            t = by_bytes.get(b) if b is not None else None
            if t is not None and t not in pairs:
                pairs[t] = d
        for t, d in self._special_pairs():
            pairs.setdefault(t, d)
        items = sorted(pairs.items())
        self.target_ids = torch.tensor([t for t, _ in items], dtype=torch.long)
        self.draft_ids = torch.tensor([d for _, d in items], dtype=torch.long)
        self._t2d = dict(pairs)
        self._d_by_bytes = {b: i for i, b in reversed(list(enumerate(d_bytes))) if b is not None}
        self._longest = max((len(b) for b in self._d_by_bytes), default=1)
        self._fallback = self._d_special("unk") or self._d_special("eos") or 0
        self._expansions: dict[int, list[int]] = {}

    def _special_pairs(self) -> list[tuple[int, int]]:
        """(target id, draft id) for special tokens: the same role (bos, eos) or the same text."""
        out = []
        for role in ("bos", "eos"):
            t, d = self._t_special(role), self._d_special(role)
            if t is not None and d is not None:
                out.append((t, d))
        d_text = {tok: i for tok, i in zip(self.draft_tokenizer.all_special_tokens,
                                           self.draft_tokenizer.all_special_ids)}
        for tok, t in zip(self.target_tokenizer.all_special_tokens, self.target_tokenizer.all_special_ids):
            if tok in d_text and t < self.target_vocab and d_text[tok] < self.draft_vocab:
                out.append((t, d_text[tok]))
        return out

    def _t_special(self, role: str) -> int | None:
        i = getattr(self.target_tokenizer, f"{role}_token_id", None)
        return i if isinstance(i, int) and i < self.target_vocab else None

    def _d_special(self, role: str) -> int | None:
        i = getattr(self.draft_tokenizer, f"{role}_token_id", None)
        return i if isinstance(i, int) and i < self.draft_vocab else None

    @property
    def size(self) -> int:
        """Tokens in the intersection."""
        return int(self.target_ids.numel())

    def to_target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """float [N, V_draft] -> float32 [N, V_target]: the draft's logits on the intersection, -inf elsewhere, so
        that softmax gives the draft's law renormalised over the intersection."""
        out = torch.full((draft_logits.shape[0], self.target_vocab), float("-inf"), dtype=torch.float32,
                         device=draft_logits.device)
        ids = self.draft_ids.to(draft_logits.device)
        return out.index_copy_(1, self.target_ids.to(draft_logits.device), draft_logits.index_select(1, ids).float())

    def expand(self, t: int) -> list[int]:
        """The draft ids (at least one) that spell target token t: its intersection token, else a longest-match
        spelling of its bytes (bytes the draft cannot spell are skipped; the draft's unknown token when none can)."""
        got = self._expansions.get(t)
        if got is not None:
            return got
        if t in self._t2d:
            got = [self._t2d[t]]
        else:
            b = self._t_bytes[t] if 0 <= t < len(self._t_bytes) else None
            got = self._spell(b) if b else []
            got = got or [self._fallback]
        self._expansions[t] = got
        return got

    def _spell(self, b: bytes) -> list[int]:
        out, i = [], 0
        while i < len(b):
            for n in range(min(self._longest, len(b) - i), 0, -1):
                d = self._d_by_bytes.get(b[i:i + n])
                if d is not None:
                    out.append(d)
                    i += n
                    break
            else:
                i += 1
        return out

    def describe(self) -> str:
        return (f"{self.size:,} of the target's {self.target_vocab:,} tokens are in the draft's vocabulary of "
                f"{self.draft_vocab:,}")
