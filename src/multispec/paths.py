"""Output paths checked before slow work starts: a bench or optimal run that can't write its results should say so
at once, not after an hour of generation."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from multispec.errors import MultispecError, check


def writable_dir(path: str | Path, what: str = "--out") -> Path:
    """Create `path` (and parents) if needed and prove it writable by writing a probe file. Returns it."""
    p = Path(path)
    check(not p.exists() or p.is_dir(), f"{what} {p}: exists and is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        raise MultispecError(f"{what} {p}: cannot write there ({e.strerror or e})") from None
    return p


def creatable_dir(path: str | Path, what: str = "--out") -> Path:
    """Check, leaving nothing behind, that `path` is a folder or can be made one: its nearest existing ancestor is a
    folder a folder can be made in (one is made there and removed; a path under a regular file, or in a read-only
    folder, is refused). Returns it. For a job that writes its folder only at the end (train-head), checked before
    the work starts."""
    p = Path(path)
    check(not p.exists() or p.is_dir(), f"{what} {p}: exists and is not a folder")
    parent = p if p.exists() else p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    check(parent.is_dir(), f"{what} {p}: {parent} is a file, not a folder")
    check(os.access(parent, os.W_OK | os.X_OK), f"{what} {p}: cannot write in {parent}")
    try:  # os.access says yes to root everywhere; a folder made and removed at once proves it (read-only mounts)
        os.rmdir(tempfile.mkdtemp(prefix=".multispec-probe-", dir=parent))
    except OSError as e:
        raise MultispecError(f"{what} {p}: cannot write in {parent} ({e.strerror or e})") from None
    return p


def writable_file(path: str | Path, what: str = "--out") -> Path:
    """Check that a file can be written at `path` (its folder is created if needed). Returns it."""
    p = Path(path)
    check(not p.is_dir(), f"{what} {p}: is a folder, expected a file name")
    writable_dir(p.parent if str(p.parent) else ".", what)
    return p


def cache_root() -> Path:
    """multispec's cache folder: $MULTISPEC_CACHE_DIR, else $XDG_CACHE_HOME/multispec, else ~/.cache/multispec.
    Holds the default machine profile (profile-v1.json: multispec/profile.py), GGUF conversions, token frequencies
    and compiled code (inductor/)."""
    root = os.environ.get("MULTISPEC_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")) / "multispec"


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """A MultispecWarning (a RuntimeWarning), once per process and message (a bad cache file is named once, not every
    generation); the CLI prints it as one `warning:` line."""
    import warnings

    from multispec.errors import MultispecWarning

    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, MultispecWarning, stacklevel=3)


def load_cache_json(path: Path, what: str, then: str) -> dict:
    """A cache file's JSON object, or {} when absent. An unreadable or malformed file (not UTF-8 JSON, or not an
    object) is ignored with one warning naming it, `what` it holds and what happens `then` (the next save replaces
    it); its entries are checked where they are used."""
    import json

    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        warn_once(f"ignoring {what} {path}: it cannot be read ({type(e).__name__}); {then}")
        return {}
    if not isinstance(data, dict):
        warn_once(f"ignoring {what} {path}: expected a JSON object, found {type(data).__name__}; {then}")
        return {}
    return data


def save_cache_json(path: Path, data) -> None:
    """Write a cache file (JSON) whole or not at all: through a temporary file (named per process and thread, so
    that two saving at once, the server's workers included, do not mix their writes) renamed over it. A cache that
    cannot be written is only measured again next time, so failing to write it is silent. Returns whether it was
    written."""
    import json
    import threading

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        return False
    return True
