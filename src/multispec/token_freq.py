"""Token frequencies of a tokenizer on a calibration text: what a reduced draft vocabulary is chosen from
(models/reduced_vocab.py; FR-Spec, 2025).

A frequency file is JSON: {"format": 1, "fingerprint": sha256 of the tokenizer's vocabulary, "vocab_size",
"source": where the text came from, "tokens": how many were counted, "counts": one count per token id}. It is only
used with a tokenizer of the same fingerprint. The embedded default pair's file is package data
(default_pair/token_freq.json, made by `python -m multispec.token_freq`).

The default calibration text is the running interpreter's standard library (.py files in sorted order, up to a
size budget): Python source like the default pair's training corpus, and disjoint from HumanEval.
"""
from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from multispec.errors import MultispecError, check

FORMAT = 1
DEFAULT_PAIR_FILE = Path(__file__).parent / "default_pair" / "token_freq.json"


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 (hex) of the tokenizer's vocabulary, token -> id, added tokens included."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class TokenFrequencies:
    """counts: one int per token id [0, vocab_size)."""

    fingerprint: str
    vocab_size: int
    counts: tuple[int, ...]
    source: str

    def __post_init__(self) -> None:
        check(len(self.counts) == self.vocab_size,
              f"token frequencies: {len(self.counts)} counts for a vocabulary of {self.vocab_size}")

    def top(self, n: int) -> torch.Tensor:
        """long [n]: the n most frequent token ids, most frequent first (ties: the smaller id first)."""
        check(isinstance(n, int) and 1 <= n <= self.vocab_size,
              f"draft vocabulary size must be an integer in [1, {self.vocab_size}], got {n!r}")
        counts = torch.tensor(self.counts, dtype=torch.long)
        order = torch.argsort(-counts, stable=True)  # stable: equal counts keep id order
        return order[:n]

    def check_tokenizer(self, tokenizer) -> None:
        """Refuse (one line) a tokenizer other than the one these counts were made with."""
        check(tokenizer_fingerprint(tokenizer) == self.fingerprint,
              "this token-frequency file was made with a different tokenizer (fingerprint mismatch); make one "
              "for this tokenizer with multispec.token_freq.count_tokens")

    def save(self, path: str | Path) -> None:
        data = {"format": FORMAT, "fingerprint": self.fingerprint, "vocab_size": self.vocab_size,
                "source": self.source, "tokens": sum(self.counts), "counts": list(self.counts)}
        Path(path).write_text(json.dumps(data, separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "TokenFrequencies":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise MultispecError(f"cannot read token frequencies from {path}: {e}") from None
        check(data.get("format") == FORMAT, f"{path}: not a format-{FORMAT} token-frequency file")
        return cls(fingerprint=data["fingerprint"], vocab_size=int(data["vocab_size"]),
                   counts=tuple(int(c) for c in data["counts"]), source=data["source"])


def count_tokens(tokenizer, texts: Iterable[str], source: str, vocab_size: int | None = None) -> TokenFrequencies:
    """Count the tokens of `texts` (each encoded without special tokens). vocab_size: the count table's length
    (default len(tokenizer); pass the model's output rows when it pads its vocabulary)."""
    size = vocab_size or len(tokenizer)
    counts = torch.zeros(size, dtype=torch.long)
    for text in texts:
        ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)
        if ids.numel():
            counts += torch.bincount(ids, minlength=size)[:size]
    return TokenFrequencies(tokenizer_fingerprint(tokenizer), size, tuple(counts.tolist()), source)


def calibration_texts(max_mb: float = 4.0) -> tuple[list[str], str]:
    """(texts, source): the standard library's .py files in sorted path order until max_mb of text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        size += len(text.encode())
        if size >= max_mb * 1e6:
            break
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return texts, f"python {version} stdlib (sorted .py files, tests excluded), {size / 1e6:.1f} MB"


def draft_vocab(freq: TokenFrequencies, n: int, prompt_ids: Iterable[int] = ()) -> torch.Tensor:
    """long [K] sorted: the n most frequent ids plus the prompt's ids (K >= n)."""
    top = freq.top(n)
    prompt = torch.as_tensor(list(prompt_ids), dtype=torch.long)
    return torch.cat([top, prompt]).unique()


def default_pair_frequencies() -> TokenFrequencies:
    """The embedded default pair's token frequencies (package data)."""
    return TokenFrequencies.load(DEFAULT_PAIR_FILE)


def main() -> None:
    """Write default_pair/token_freq.json from the default pair's tokenizer and the stdlib calibration text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEFAULT_PAIR_FILE.parent / "target")
    texts, source = calibration_texts()
    freq = count_tokens(tok, texts, source)
    freq.save(DEFAULT_PAIR_FILE)
    print(f"wrote {DEFAULT_PAIR_FILE}: {sum(freq.counts)} tokens, {source}")


if __name__ == "__main__":
    main()
