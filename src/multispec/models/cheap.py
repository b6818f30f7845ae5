"""One construction site for a cheap draft (issue 25): the draft options `draft_vocab=N` (a reduced output layer,
models/reduced_vocab.py) and `draft_dtype="int8"` (int8 Linear weights, models/int8.py), validated when built.

    cheap = CheapDraft(vocab=1024, dtype="int8")           # validated here, before any model loads
    model = cheap.draft_model(draft)                       # once per decoder: the int8 copy (or draft itself)
    freq = cheap.frequencies(tokenizer)                    # once per decoder: None when vocab is None
    backend = make_backend(model, kind, max_len)           # as for any draft
    backend.set_vocab_subset(cheap.subset(freq, prompt_ids))   # per request, before the draft's prefill

Token frequencies: the file given, else the embedded default pair's when the tokenizer is its own, else counted once
on the calibration text (token_freq.calibration_texts, ~8 s) and kept in $MULTISPEC_CACHE_DIR (default
~/.cache/multispec) under the tokenizer's fingerprint.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from multispec.errors import check

DRAFT_DTYPES = ("float32", "int8")  # float32: the draft as loaded


@dataclass(frozen=True)
class CheapDraft:
    """vocab: the draft's output layer on the `vocab` most frequent tokens plus the prompt's (None: every token).
    dtype: "int8" for int8 draft weights (CPU, float32 drafts), "float32" or None for the draft as loaded.
    frequency_file: a token_freq JSON for the draft's tokenizer (None: see the module docstring)."""

    vocab: int | None = None
    dtype: str | None = None
    frequency_file: str | None = None

    def __post_init__(self) -> None:
        check(self.vocab is None or (isinstance(self.vocab, int) and not isinstance(self.vocab, bool)
                                     and self.vocab >= 1),
              f"draft_vocab must be an integer >= 1, got {self.vocab!r}")
        check(self.dtype is None or self.dtype in DRAFT_DTYPES,
              f"draft_dtype must be one of {', '.join(DRAFT_DTYPES)}, got {self.dtype!r}")
        check(self.frequency_file is None or Path(self.frequency_file).is_file(),
              f"token-frequency file not found: {self.frequency_file}")

    @property
    def active(self) -> bool:
        return self.vocab is not None or self.dtype == "int8"

    def draft_model(self, draft: torch.nn.Module) -> torch.nn.Module:
        """The model the draft backend runs: an int8 copy for dtype "int8" (refused in one line off CPU or for a
        non-float32 draft), else `draft` itself. The target never goes through here."""
        if self.dtype != "int8":
            return draft
        from multispec.models.int8 import quantize_draft

        return quantize_draft(draft)

    def frequencies(self, tokenizer, vocab_size: int | None = None):
        """token_freq.TokenFrequencies for the draft's tokenizer, or None when no reduced vocabulary is asked
        for. vocab_size: the draft's output rows (checked against vocab)."""
        if self.vocab is None:
            return None
        from multispec.token_freq import (DEFAULT_PAIR_FILE, TokenFrequencies, calibration_texts, count_tokens,
                                          tokenizer_fingerprint)

        if self.frequency_file is not None:
            freq = TokenFrequencies.load(self.frequency_file)
            freq.check_tokenizer(tokenizer)
        else:
            fingerprint = tokenizer_fingerprint(tokenizer)
            default = TokenFrequencies.load(DEFAULT_PAIR_FILE)
            if default.fingerprint == fingerprint and (vocab_size in (None, default.vocab_size)):
                freq = default
            else:
                root = os.environ.get("MULTISPEC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                             "multispec")
                path = Path(root) / "token_freq" / f"{fingerprint[:16]}-{vocab_size or len(tokenizer)}.json"
                if path.is_file():
                    freq = TokenFrequencies.load(path)
                else:
                    texts, source = calibration_texts()
                    freq = count_tokens(tokenizer, texts, source, vocab_size=vocab_size)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    freq.save(path)
        check(vocab_size is None or freq.vocab_size == vocab_size,
              f"token frequencies cover {freq.vocab_size} ids but the draft has {vocab_size} output rows")
        check(self.vocab <= freq.vocab_size,
              f"draft_vocab must be an integer in [1, {freq.vocab_size}], got {self.vocab}")
        return freq

    def subset(self, freq, prompt_ids) -> torch.Tensor | None:
        """long [K] sorted: the draft vocabulary for one request (top `vocab` plus the prompt's ids), or None (the
        full layer) when no reduced vocabulary is asked for. Pass it to the draft backend's set_vocab_subset."""
        if self.vocab is None:
            return None
        from multispec.token_freq import draft_vocab

        return draft_vocab(freq, self.vocab, prompt_ids)
