"""One exception type for bad input, so the CLI can print one line and exit 2."""


class MultispecError(ValueError):
    """A user-facing error: the message names the problem; no traceback is shown by the CLI."""


def check(condition: bool, message: str) -> None:
    """Raise MultispecError(message) unless condition holds."""
    if not condition:
        raise MultispecError(message)
