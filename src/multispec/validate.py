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


def seed_or_fresh(seed) -> int:
    """The seed to use: `seed` checked to lie in [0, 2**63), or a fresh random one when None."""
    if seed is None:
        return secrets.randbelow(SEED_LIMIT)
    check(isinstance(seed, numbers.Integral) and not isinstance(seed, (bool, np.bool_)),
          f"seed must be an integer, got {seed!r}")
    check(0 <= int(seed) < SEED_LIMIT, f"seed must be in [0, 2**63), got {seed}")
    return int(seed)


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


def token_ids(v, name: str, vocab_size: int) -> tuple[int, ...]:
    """None or a list of token ids (stop_token_ids), each in [0, vocab_size), as a tuple."""
    if v is None:
        return ()
    check(isinstance(v, (list, tuple)), f"{name} must be a list of token ids, got {v!r}")
    ids = tuple(integer(t, name) for t in v)
    check(all(0 <= t < vocab_size for t in ids), f"{name} must be token ids in [0, {vocab_size})")
    return ids


def logit_bias(v, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """None or {token id: bias} (OpenAI's JSON spells the ids as strings: "50256": -100) as sorted (id, bias)
    pairs; ids in [0, vocab_size), biases checked by SamplingConfig."""
    if v is None:
        return ()
    check(isinstance(v, dict), f"logit_bias must be a mapping of token id to bias, got {v!r}")
    out = {}
    for key, bias in v.items():
        tok = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else key
        tok = integer(tok, "logit_bias token id")
        check(0 <= tok < vocab_size, f"logit_bias token ids must be in [0, {vocab_size}), got {key!r}")
        out[tok] = real(bias, f"logit_bias[{key!r}]")
    return tuple(sorted(out.items()))
