"""GGUF conversions in the cache folder verified, not trusted (gguf_files.py writes them, gguf_quant.py too).

A `.gguf` file is known by its identity (`identify`): its size, modification time, a fingerprint of its first and
last MiB (read at every use: milliseconds) and its SHA-256 (the whole file read; remembered in the cache folder's
`file_hashes/` memo under its path, size and modification time). A memo is used only when the size, modification
time and fingerprint it recorded are the file's now; any other memo (damaged, edited, of another format) is ignored
and the file hashed again.

Each conversion folder is written under a temporary name with its manifest (`manifest.json`) written last: every
file written, with its size, modification time and SHA-256, and the source file's identity. Before every use
(`check`), the manifest is read and the folder checked against it and against the file given:
- the source: the manifest's SHA-256, size and fingerprint must be the file's (a folder found through a memo that
  named another file's hash is not this file's conversion, whatever the folder holds);
- every file's size, always; every file under HASH_ALWAYS bytes (config, tokenizer, generation config: a few MiB)
  hashed at every use; a larger one (the weights) hashed when its modification time is not the one recorded (a
  copied folder: hashed once, then its new time recorded). Hashing SmolLM2-135M's float32 weights (538 MB) takes
  0.5 s on this project's CPU, a 7B model's (28 GB) half a minute: at every load that would cost more than the
  load itself, so a file that keeps its size and time is trusted to keep its bytes.
A conversion that fails any of these (or has no manifest: made by an older multispec) is removed and made again,
with one line on stderr saying why; one that cannot be removed (a read-only cache folder) is refused in one line."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from multispec.errors import MultispecError
from multispec.paths import cache_root

MANIFEST = "manifest.json"
FORMAT = 1
HASH_ALWAYS = 16 << 20  # files smaller than this are hashed at every use
_CHUNK = 1 << 20
_EDGE = 1 << 20  # the fingerprint reads this many bytes at each end of the file


@dataclass(frozen=True)
class FileIdentity:
    """What a GGUF file is: size, modification time (ns), fingerprint (SHA-256 of its size and first and last MiB)
    and content hash. fresh: the hash was computed now, not read from the memo."""

    size: int
    mtime_ns: int
    fingerprint: str
    sha256: str
    fresh: bool = False

    def record(self) -> dict:
        return {"size": self.size, "mtime_ns": self.mtime_ns, "fingerprint": self.fingerprint, "sha256": self.sha256}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def fingerprint(path: Path, size: int) -> str:
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_EDGE))
        if size > _EDGE:
            f.seek(max(_EDGE, size - _EDGE))
            h.update(f.read(_EDGE))
    return h.hexdigest()


def memo_path(path: Path, size: int, mtime_ns: int) -> Path:
    stamp = hashlib.sha256(f"{path.resolve()}|{size}|{mtime_ns}".encode()).hexdigest()[:32]
    return cache_root() / "file_hashes" / stamp


def identify(path: Path, fresh: bool = False) -> FileIdentity:
    """The identity of the file at `path`: its hash from the memo when the memo's record is the file's now (size,
    modification time, fingerprint) and `fresh` is not asked for, else computed (and the memo written)."""
    st = path.stat()
    mark = fingerprint(path, st.st_size)
    memo = memo_path(path, st.st_size, st.st_mtime_ns)
    if not fresh:
        try:
            known = json.loads(memo.read_text())
        except (OSError, ValueError):
            known = None
        if memo_agrees(known, st.st_size, st.st_mtime_ns, mark):
            return FileIdentity(st.st_size, st.st_mtime_ns, mark, known["sha256"])
    ident = FileIdentity(st.st_size, st.st_mtime_ns, mark, sha256_of(path), fresh=True)
    _write_json(memo, ident.record())  # a read-only cache: hashed again next time
    return ident


def memo_agrees(known: object, size: int, mtime_ns: int, mark: str) -> bool:
    """Whether a memo's record is of the file as it is now (its size, modification time and fingerprint)."""
    return isinstance(known, dict) and known.get("size") == size and known.get("mtime_ns") == mtime_ns \
        and known.get("fingerprint") == mark and _is_digest(known.get("sha256"))


def write_manifest(folder: Path, source: FileIdentity, **extra) -> None:
    """Record every file now in `folder` (size, modification time, SHA-256) and the source's identity, in
    `folder`/manifest.json: the last file a conversion writes."""
    files = {}
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name != MANIFEST:
            st = f.stat()
            files[f.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256_of(f)}
    manifest = {"format": FORMAT, "source": source.record(), "files": files, **extra}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def conversion_id(folder: Path) -> str | None:
    """A short name of what a conversion folder holds: the SHA-256 of its files' names and hashes (first 16 hex
    digits), or None when it has no readable manifest."""
    manifest = _read(folder)
    if manifest is None or not isinstance(manifest.get("files"), dict):
        return None
    listing = json.dumps({k: v.get("sha256") for k, v in sorted(manifest["files"].items()) if isinstance(v, dict)})
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


OTHER_FILE = "it was made from another file"


def check(folder: Path, source: FileIdentity) -> str | None:
    """Why the conversion in `folder` cannot be used for the file of identity `source` (OTHER_FILE when its manifest
    names another source), or None when it is whole and this file's. The folder must exist."""
    manifest = _read(folder)
    if manifest is None:
        return "it has no manifest" if not (folder / MANIFEST).exists() else "its manifest cannot be read"
    recorded, files = manifest.get("source"), manifest.get("files")
    if manifest.get("format") != FORMAT or not isinstance(recorded, dict) or not isinstance(files, dict) or not files:
        return "its manifest cannot be read"
    if any(recorded.get(k) != getattr(source, k) for k in ("sha256", "size", "fingerprint")):
        return OTHER_FILE
    touched = {}
    for name, want in files.items():
        problem = _check_file(folder / name, want)
        if problem is True:
            touched[name] = (folder / name).stat().st_mtime_ns
        elif problem:
            return f"{name} {problem}"
    if touched:  # hashed whole and found as written: the new modification times recorded (best effort)
        for name, mtime in touched.items():
            files[name]["mtime_ns"] = mtime
        _write_json(folder / MANIFEST, manifest)
    return None


def _check_file(path: Path, want) -> str | bool | None:
    """None: the file is as recorded without hashing it again; True: hashed whole and found as written (its
    modification time had changed); else what is wrong with it."""
    if not isinstance(want, dict) or not isinstance(want.get("size"), int):
        return "is not recorded in the manifest"
    try:
        st = path.stat()
    except OSError:
        return "is missing"
    if st.st_size != want["size"]:
        return f"has {st.st_size} bytes, {want['size']} were written"
    small = st.st_size < HASH_ALWAYS
    if not small and st.st_mtime_ns == want.get("mtime_ns"):
        return None
    try:
        same = sha256_of(path) == want.get("sha256")
    except OSError:
        return "cannot be read"
    if not same:
        return "is not the file that was written (its SHA-256 differs)"
    return None if small else True


def discard(folder: Path, label: str, reason: str) -> None:
    """Remove a conversion that cannot be used, with one line on stderr saying so; one-line MultispecError when it
    cannot be removed (nothing else said)."""
    aside = folder.with_name(f".bad-{folder.name[:24]}-{os.getpid()}")
    try:
        folder.rename(aside)
    except FileNotFoundError:  # another process removed it first
        return
    except OSError as e:
        raise MultispecError(f"the cached conversion of {label} in {folder} cannot be used ({reason}) and cannot be "
                             f"removed ({e.strerror or e}); delete it, or set MULTISPEC_CACHE_DIR to a writable "
                             "folder") from None
    print(f"multispec: the cached conversion of {label} in {folder} cannot be used ({reason}); making it again",
          file=sys.stderr, flush=True)
    shutil.rmtree(aside, ignore_errors=True)


def _read(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MANIFEST).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
