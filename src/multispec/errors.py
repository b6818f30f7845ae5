"""One exception type for bad input, so the CLI can print one line and exit 2."""


class MultispecError(ValueError):
    """A user-facing error: the message names the problem; no traceback is shown by the CLI."""


class MultispecWarning(RuntimeWarning):
    """Something multispec ignored and went on without (a damaged cache file): the CLI prints it as one line."""


def check(condition: bool, message: str) -> None:
    """Raise MultispecError(message) unless condition holds."""
    if not condition:
        raise MultispecError(message)


def attach_partial(error: BaseException, partial: object) -> None:
    """Put what was done before `error` on it as `error.partial` (generate, generate_batch: the results so far).
    Any exception may carry it, an interrupt included, so it is set as a plain attribute of the instance."""
    setattr(error, "partial", partial)


_TRUE, _FALSE = ("true", "1"), ("false", "0")


def parse_bool(value, name: str) -> bool:
    """A strict boolean: True/False, 1/0, or the strings 'true'/'false'/'1'/'0' (any case, surrounding spaces
    ignored). Anything else (e.g. 'yes', 2, 0.5, None) raises MultispecError naming the setting."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise MultispecError(f"{name} must be a boolean (true/false/1/0), got {value!r}")
