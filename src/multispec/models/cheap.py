"""One construction site for a cheap draft (issue 25): the draft options `draft_vocab=N` (a reduced output layer,
models/reduced_vocab.py) and `draft_dtype="int8"` (int8 Linear weights, models/int8.py), validated when built.

    cheap = CheapDraft(vocab=1024, dtype="int8")           # validated here, before any model loads
    model = cheap.draft_model(draft, sidecar)              # the int8 copy (kept in the sidecar) or draft itself
    freq = cheap.frequencies(tokenizer)                    # once per decoder: None when vocab is None
    backend = make_backend(model, kind, max_len, sidecar)  # as for any draft (sidecar: the model's)
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

    def draft_model(self, draft: torch.nn.Module, sidecar=None) -> torch.nn.Module:
        """The model the draft backend runs: an int8 copy for dtype "int8" (refused in one line off CPU or for a
        non-float32 draft), else `draft` itself. sidecar: the draft's (models/sidecar.py; the pair's keeps one
        copy per draft; default a fresh one, so a new copy). The target never goes through here."""
        if self.dtype != "int8":
            return draft
        from multispec.models.sidecar import ModelSidecar

        return (sidecar if sidecar is not None else ModelSidecar(draft)).int8_copy()

    def frequencies(self, tokenizer, vocab_size: int | None = None, count: bool = True):
        """token_freq.TokenFrequencies for the draft's tokenizer, or None when no reduced vocabulary is asked
        for. vocab_size: the draft's output rows (checked against vocab). count=False: None instead of counting
        the calibration text (~8 s) when no frequencies are at hand (a file given, the default pair's, or one
        counted on this machine before)."""
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
                path = _freq_path(fingerprint, vocab_size or len(tokenizer))
                if path.is_file():
                    freq = TokenFrequencies.load(path)
                elif not count:
                    return None
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


def _freq_path(fingerprint: str, vocab_size: int) -> Path:
    root = os.environ.get("MULTISPEC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "multispec")
    return Path(root) / "token_freq" / f"{fingerprint[:16]}-{vocab_size}.json"


# ---------------------------------------------------------------------------------------- auto's choice of draft
AUTO_VOCAB = 1024  # acceptance within 1 % of the full draft's once S grows with the text (cheap_draft/steps.md)
CHOICE_GAIN = 0.9  # a cheaper form is used when its step takes at most this share of the full draft's


def choose_cheap_draft(draft: torch.nn.Module, tokenizer, kind: str, sidecar=None,
                       profile=None) -> tuple[CheapDraft, dict]:
    """The cheapest form of `draft` on this machine for `auto` (which chooses when the user sets neither
    draft_vocab nor draft_dtype): the full draft, int8 weights (CPU, float32), a reduced output layer of AUTO_VOCAB
    tokens (where token frequencies are at hand without counting), or both, whichever has the fastest one-token
    step, if it takes at most CHOICE_GAIN of the full draft's. The machine profile's choice (section
    "cheap_draft", keyed per draft, backend, device, threads), else timed now (~0.3 s). sidecar: the draft's
    (models/sidecar.py; its int8 copy and FastNet are reused; default a fresh one). Returns the choice and the new
    profile entries ({} when the profile had it)."""
    from multispec.models.int8 import linear_shape

    key = _choice_key(draft, kind)
    stored = profile.get("cheap_draft", key) if profile is not None else None
    if isinstance(stored, dict) and set(stored) <= {"vocab", "dtype"}:
        try:
            return CheapDraft(**stored), {}
        except Exception:  # noqa: BLE001 - a malformed entry is measured again
            pass
    weight = draft.get_input_embeddings().weight
    candidates = [CheapDraft()]
    from multispec.models.int8 import QUANT_DTYPES, weights_dtype

    # an int8 copy is made from float32 weights: a draft quantized already (int8 / int4 / w4a8) has none
    int8 = weight.device.type == "cpu" and weight.dtype == torch.float32 and weights_dtype(draft) not in QUANT_DTYPES
    if int8:
        candidates.append(CheapDraft(dtype="int8"))
    vocab = linear_shape(draft.get_output_embeddings())[0]
    freq = CheapDraft(vocab=AUTO_VOCAB).frequencies(tokenizer, vocab, count=False) if vocab > 2 * AUTO_VOCAB \
        else None
    if freq is not None:
        candidates.append(CheapDraft(vocab=AUTO_VOCAB))
        if int8:
            candidates.append(CheapDraft(vocab=AUTO_VOCAB, dtype="int8"))
    seconds = _time_steps(draft, candidates, freq, kind, sidecar) if len(candidates) > 1 else [1.0]
    best = min(range(len(candidates)), key=lambda i: seconds[i])
    choice = candidates[best] if seconds[best] <= CHOICE_GAIN * seconds[0] else candidates[0]
    return choice, {key: {"vocab": choice.vocab, "dtype": choice.dtype}}


def _time_steps(draft, candidates: list[CheapDraft], freq, kind: str, sidecar=None, steps: int = 12) -> list[float]:
    """The fastest of `steps` one-token steps (after 64 tokens of context, fewer for a draft with fewer positions)
    of each candidate, interleaved."""
    import time

    from multispec.models import make_backend
    from multispec.models.base import forward_chain
    from multispec.models.sidecar import ModelSidecar

    from multispec.models.int8 import linear_shape

    vocab = linear_shape(draft.get_output_embeddings())[0]
    cfg = getattr(draft, "config", None)
    limit = getattr(cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg, "max_position_embeddings", None)
    ctx = max(1, min(64, (limit or 96) - 2))  # a context the draft can hold
    sidecar = sidecar if sidecar is not None else ModelSidecar(draft)
    quantized = None
    backends = []
    for c in candidates:
        if c.dtype == "int8":
            quantized = quantized or ModelSidecar(c.draft_model(draft, sidecar))
        model_sidecar = quantized if c.dtype == "int8" else sidecar
        b = make_backend(model_sidecar.model, kind, **({} if kind == "hf" else {"max_len": ctx + 2}),
                         sidecar=model_sidecar)
        if c.vocab is not None:
            b.set_vocab_subset(c.subset(freq, []))
        forward_chain(b, torch.arange(ctx) % vocab)
        backends.append(b)
    best = [float("inf")] * len(candidates)
    token = torch.tensor([11 % vocab])
    with torch.inference_mode():
        for _ in range(steps):
            for i, b in enumerate(backends):
                t0 = time.perf_counter()
                forward_chain(b, token)
                best[i] = min(best[i], time.perf_counter() - t0)
                b.keep(torch.arange(ctx))
    return best


def _choice_key(draft, kind: str) -> str:
    import platform

    cfg = getattr(draft, "config", None)
    name = getattr(cfg, "_name_or_path", "") or type(draft).__name__
    weight = draft.get_input_embeddings().weight
    from multispec.models.int8 import weights_dtype

    return "|".join(str(x) for x in (name, sum(p.numel() for p in draft.parameters()), kind, weight.device,
                                      weights_dtype(draft), torch.get_num_threads(),
                                      platform.processor() or platform.machine()))
