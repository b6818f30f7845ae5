"""Checks of the values a caller passes (numbers, seeds, stop strings), shared by the API, the server and the CLI.
Each returns the value in its canonical type or raises MultispecError with a one-line message."""
from __future__ import annotations

import numbers
import secrets

import numpy as np

from multispec.errors import MultispecError, check

SEED_LIMIT = 2**63  # seeds are integers in [0, 2**63)


def integer(v, name: str) -> int | None:
    """None, or an int from an int-like value (numpy integers too); bool and floats are refused."""
    if v is None:
        return None
    check(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)),
          f"{name} must be an integer, got {v!r}")
    return int(v)


def real(v, name: str) -> float | None:
    """None, or a float from a real number (numpy scalars too); bool and strings are refused."""
    if v is None:
        return None
    check(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)), f"{name} must be a number, got {v!r}")
    return float(v)


def seed(v) -> int | None:
    """None, or `v` checked to be an integer in [0, 2**63)."""
    if v is None:
        return None
    check(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)), f"seed must be an integer, got {v!r}")
    check(0 <= int(v) < SEED_LIMIT, f"seed must be in [0, 2**63), got {v}")
    return int(v)


def seed_or_fresh(v) -> int:
    """The seed to use: `v` checked (`seed`), or a fresh random one when None."""
    checked = seed(v)
    return secrets.randbelow(SEED_LIMIT) if checked is None else checked


def stop_strings(stop) -> list[str]:
    """`stop` as a list of non-empty strings: a str is one stop string (not its characters)."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    check(isinstance(stops, (list, tuple)), f"stop must be a string or a list of strings, got {stop!r}")
    for s in stops:
        check(isinstance(s, str), f"stop strings must be strings, got {s!r}")
        check(s != "", "a stop string is empty (it would match before any text); remove it")
        check_text(s, f"the stop string {s!r}")
    return list(stops)


def check_text(text: str, what: str) -> None:
    """Refuse a str that is not valid Unicode text (a lone surrogate, from a JSON escape or from argv bytes that were
    not UTF-8): no tokenizer can encode it, and as a stop string it could never match generated text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MultispecError(f"{what} is not valid UTF-8 text (a lone surrogate {text[e.start]!r} at index "
                             f"{e.start})") from None


def token_ids(v, name: str, vocab_size: int | None) -> tuple[int, ...]:
    """None or a list of token ids (stop_token_ids), each in [0, vocab_size) (>= 0 when vocab_size is None: the
    request's own check, before a model is known), as a tuple."""
    if v is None:
        return ()
    check(isinstance(v, (list, tuple)), f"{name} must be a list of token ids, got {v!r}")
    ids = tuple(integer(t, name) for t in v)
    if vocab_size is None:
        check(all(t >= 0 for t in ids), f"{name} must be token ids >= 0, got {list(ids)}")
    else:
        check(all(0 <= t < vocab_size for t in ids), f"{name} must be token ids in [0, {vocab_size})")
    return ids


def logit_bias(v, vocab_size: int | None) -> tuple[tuple[int, float], ...]:
    """None, {token id: bias} (OpenAI's JSON spells the ids as strings: "50256": -100) or (id, bias) pairs, as
    sorted (id, bias) pairs; ids in [0, vocab_size) (>= 0 when vocab_size is None), biases checked by
    SamplingConfig."""
    if v is None or v == ():
        return ()
    items = v.items() if isinstance(v, dict) else v if isinstance(v, tuple) else None
    check(items is not None, f"logit_bias must be a mapping of token id to bias, got {v!r}")
    out = {}
    for key, bias in items:
        tok = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else key
        tok = integer(tok, "logit_bias token id")
        if vocab_size is None:
            check(tok >= 0, f"logit_bias token ids must be integers >= 0, got {key!r}")
        else:
            check(0 <= tok < vocab_size, f"logit_bias token ids must be in [0, {vocab_size}), got {key!r}")
        out[tok] = real(bias, f"logit_bias[{key!r}]")
    return tuple(sorted(out.items()))
