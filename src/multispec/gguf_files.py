"""GGUF files as targets and drafts: a `.gguf` file is read by transformers' GGUF loader (the optional extra
`multispec[gguf]`: the gguf and accelerate packages), dequantized to float32 once, and saved as an ordinary Hugging
Face folder under `cache_root()/gguf/<SHA-256 of the file>/` (config, safetensors weights, tokenizer and chat
template, generation config), so that later loads read that folder and take seconds. The folder is written under
a temporary name and renamed when whole: an interrupted first load leaves no cache behind.

Checked in one line each before anything slow (`open_gguf`): the file exists; the extra is installed; the header
is a GGUF header and the file holds every byte its tensors need (a truncated or corrupt file); transformers reads
GGUF files of its architecture; a target's file holds a tokenizer. `loading.load_pair` then checks the config as it
checks a folder's (a causal LM; recurrent architectures refused) before dequantizing anything.

The cache folder is verified, not trusted (gguf_cache.py): a conversion's manifest, written last, is checked against
the folder and the file given before every use; a damaged conversion is made again with one line saying so."""
from __future__ import annotations

import contextlib
import importlib.util
import mmap
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import multispec.gguf_cache as gguf_cache
from multispec.errors import MultispecError, check
from multispec.gguf_cache import FileIdentity, identify
from multispec.paths import cache_root

EXTRA = "pip install 'multispec[gguf]'"
_MAGIC = b"GGUF"
# GGUF metadata value types: struct formats of the fixed-size ones; 8 is a string, 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def is_gguf(path: object) -> bool:
    """Whether `path` names a GGUF file (by its suffix: what the user asked to load, not a guess at its content)."""
    return isinstance(path, (str, os.PathLike)) and str(path).lower().endswith(".gguf")


@dataclass
class GgufHeader:
    """What the file's header says, read without loading any tensor (`read_header`)."""

    architecture: str
    has_tokenizer: bool
    tensors: int
    has_chat_template: bool = False  # tokenizer.chat_template in the metadata


@dataclass
class GgufSource:
    """A checked GGUF file: its hash, its cache folder, and its model config (read from the cache folder when it is
    there, else from the file's metadata); identity: the file's as `open_gguf` read it (gguf_cache.identify)."""

    path: Path
    sha256: str
    folder: Path
    config: object
    identity: FileIdentity | None = None

    @property
    def cached(self) -> bool:
        """A whole conversion is there (its manifest is written last); `materialize` checks it before use."""
        return (self.folder / gguf_cache.MANIFEST).is_file()


def open_gguf(path: str, need_tokenizer: bool, quant: str | None = None) -> GgufSource:
    """Check `path` and read its config, before any weight is dequantized (one-line MultispecError otherwise).
    quant: the quantized form ("int8" / "int4") the file is loaded as; the config is read from its cache folder
    when that is there and verified (reading it from the file's metadata takes tens of seconds for a large
    vocabulary)."""
    p = Path(path)
    check(p.exists(), f"model path not found: {path}")
    check(p.is_file(), f"{path} is a folder, not a GGUF file")
    ident = identify(p)
    config = _cached_config(p, ident, quant)
    if config is None and not ident.fresh:  # nothing usable where the memo points (or it named another file's
        ident = identify(p, fresh=True)  # conversion): the file hashed now; converting reads it whole anyway
        config = _cached_config(p, ident, quant)
    folder = cache_root() / "gguf" / ident.sha256
    if config is not None:
        return GgufSource(p, ident.sha256, folder, config, ident)
    check_extra()
    header = read_header(p)
    supported = _readable_architectures()
    check(supported is None or header.architecture in supported,
          f"{path}: transformers {_transformers_version()} cannot read GGUF files of architecture "
          f"{header.architecture!r} (it reads {', '.join(sorted(supported or ()))})")
    check(header.has_tokenizer or not need_tokenizer,
          f"{path} holds no tokenizer (no tokenizer.ggml.* metadata); the target's tokenizer must be in its file")
    from transformers import AutoConfig

    try:
        with metadata_parsed_once():
            config = AutoConfig.from_pretrained(p.parent, gguf_file=p.name)
    except (ValueError, KeyError, OSError, IndexError, TypeError) as e:
        raise MultispecError(f"cannot read a model config from {path}: {_one_line(e)}") from None
    return GgufSource(p, ident.sha256, folder, config, ident)


def _cached_config(path: Path, ident: FileIdentity, quant: str | None):
    """The config of a verified conversion of the file (its `quant` form's, then its float32 form's), or None:
    none there (a damaged one is removed, with a line), or the memo's hash named another file's conversion."""
    from transformers import AutoConfig

    for folder in ([quant_folder(ident.sha256, quant)] if quant else []) + [cache_root() / "gguf" / ident.sha256]:
        state = verified(folder, ident, path.name)
        if state is None:
            return None
        if state:
            try:
                return AutoConfig.from_pretrained(folder)
            except (OSError, ValueError, KeyError, TypeError) as e:  # written by another transformers
                gguf_cache.discard(folder, path.name, f"its config.json cannot be read: {_one_line(e, 120)}")
    return None


def checked_folder(source: GgufSource, folder: Path) -> tuple[bool, FileIdentity]:
    """(whether `folder` holds a whole conversion of `source`, the identity a new one is written with). A folder
    to be written is named by the file's hash computed now, never by the memo's alone."""
    ident = source.identity or identify(source.path)
    state = verified(folder, ident, source.path.name)
    if not state and not ident.fresh:
        ident = identify(source.path, fresh=True)
        check(ident.sha256 == source.sha256, f"{source.path} changed while it was loaded (its SHA-256 is not the "
                                             "one read when it was opened); load it again")
        state = verified(folder, ident, source.path.name)
    source.identity = ident
    return bool(state), ident


def verified(folder: Path, ident: FileIdentity, label: str) -> bool | None:
    """True: `folder` holds a whole conversion of the file of identity `ident` (gguf_cache.check); False: none is
    there (a damaged one is removed, with one line on stderr saying why); None: its manifest names another
    file and `ident`'s hash came from the memo (the caller hashes the file again)."""
    if not folder.is_dir():
        return False
    reason = gguf_cache.check(folder, ident)
    if reason is None:
        return True
    if reason == gguf_cache.OTHER_FILE and not ident.fresh:
        return None
    gguf_cache.discard(folder, label, reason)
    return False


def quant_folder(sha256: str, dtype: str) -> Path:
    """The cache folder of a GGUF file's int8 / int4 form (gguf_quant.py), beside its float32 one."""
    return cache_root() / "gguf" / f"{sha256}-{dtype}"


def materialize(source: GgufSource) -> Path:
    """The cache folder of `source`, checked against its manifest and written first when absent or damaged: the
    model dequantized to float32 (the config read by `open_gguf` reused), its tokenizer and generation config, and
    the manifest last, under a temporary name renamed when whole."""
    whole, ident = checked_folder(source, source.folder)
    if whole:
        return source.folder

    from transformers import AutoModelForCausalLM, GgufConfig

    print(f"multispec: dequantizing {source.path.name} to float32 once; cached in {source.folder} (later loads "
          "read it and take seconds)", file=sys.stderr, flush=True)
    root = source.folder.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MultispecError(f"cannot write the GGUF cache in {root} ({e.strerror or e}); set MULTISPEC_CACHE_DIR "
                             "to a writable folder") from None
    tmp = root / f".tmp-{source.sha256[:16]}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    where, name = source.path.parent, source.path.name
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, config=source.config,
                                                         dtype="float32", quantization_config=GgufConfig(dequantize=True))
        except (ValueError, KeyError, OSError, IndexError, RuntimeError, TypeError) as e:
            raise MultispecError(f"cannot load the weights of {source.path}: {_one_line(e)}") from None
        tokenizer = gguf_tokenizer(source.path)
        # A model loaded from GGUF is marked quantized and refuses save_pretrained; its weights are plain float32
        # tensors once dequantized, so the marks are dropped and it is saved as the ordinary model it now is.
        model.hf_quantizer = None
        for cfg in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
        try:
            model.save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            gguf_cache.write_manifest(tmp, ident, gguf=str(source.path.resolve()),
                                      transformers=_transformers_version())
            try:
                tmp.rename(source.folder)
            except OSError:
                if not source.cached:  # not another process's complete copy, renamed there first
                    raise
        except OSError as e:
            raise MultispecError(f"cannot write the GGUF cache in {root} ({e.strerror or e}); set "
                                 "MULTISPEC_CACHE_DIR to a writable folder") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return source.folder


def gguf_tokenizer(path: Path):
    """The tokenizer in the file (with its chat template), or None when it holds none."""
    from transformers import AutoTokenizer

    try:
        with metadata_parsed_once():
            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, KeyError, OSError, IndexError, TypeError):
        return None  # a draft's file may hold none; a target's was checked by open_gguf
    finally:
        _PARSED.pop(_file_key(path), None)  # read for the config and again for the tokenizer; no more


_PARSED: dict[str, dict] = {}  # a file's config as transformers parses it, until its tokenizer is made


@contextlib.contextmanager
def metadata_parsed_once():
    """Within: transformers' parse of a GGUF file's metadata (load_gguf_checkpoint without tensors; tens of
    seconds for a vocabulary of 150,000 tokens), asked for again for the config alone (AutoTokenizer reads it so),
    reuses the parse made for the file's config (open_gguf), until its tokenizer is made (`gguf_tokenizer`). Only
    the config is kept: the vocabulary itself is read anew by the tokenizer, as transformers reads it."""
    import copy

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.load_gguf_checkpoint

    def parse(path, return_tensors=False, model_to_load=None, torch_dtype=None):
        key = _file_key(Path(path))
        if return_tensors or key not in _PARSED:
            parsed = original(path, return_tensors, model_to_load, torch_dtype)
            if not return_tensors:
                _PARSED[key] = {"config": copy.deepcopy(parsed["config"])}
            return parsed
        return copy.deepcopy(_PARSED[key])

    gguf_utils.load_gguf_checkpoint = parse
    try:
        yield
    finally:
        gguf_utils.load_gguf_checkpoint = original


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def check_extra() -> None:
    """The optional packages transformers' GGUF loader needs are importable (without importing them)."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    check(not missing, f"loading GGUF files needs the {' and '.join(missing)} package{'s' * (len(missing) > 1)}: "
                       f"{EXTRA}")


def file_sha256(path: Path) -> str:
    """The file's SHA-256, remembered under the cache folder for this (path, size, modification time) and used
    again only while the file's fingerprint is the one recorded with it (gguf_cache.identify)."""
    return identify(path).sha256


def read_header(path: Path) -> GgufHeader:
    """Walk the header (metadata, then tensor descriptions) without reading any value it does not need, and check
    that the file holds every byte its tensors need. One-line MultispecError for anything but a whole GGUF file."""
    meta, tensors = _walk(path)
    arch = meta.get("general.architecture")
    check(isinstance(arch, str), f"{path} is not a whole GGUF file (truncated or corrupt: no general.architecture)")
    assert isinstance(arch, str)
    return GgufHeader(architecture=arch, has_tokenizer="tokenizer.ggml.model" in meta, tensors=len(tensors),
                      has_chat_template=bool(meta.get("tokenizer.chat_template")))


def has_chat_template(path: Path) -> bool | None:
    """Whether the file's metadata holds a chat template (tokenizer.chat_template), read from its header without
    converting anything; None where the header cannot be read so (no gguf package, a damaged file: the load then
    says why, in one line)."""
    if importlib.util.find_spec("gguf") is None:
        return None
    try:
        return read_header(path).has_chat_template
    except (MultispecError, OSError):
        return None


@dataclass
class GgufTensor:
    """One tensor of a GGUF file: its name, shape (torch's order: rows first), ggml type, and where its bytes are
    (`start`: from the beginning of the file)."""

    name: str
    shape: tuple[int, ...]
    kind: int
    start: int
    nbytes: int


def read_tensors(path: Path) -> tuple[str, list[GgufTensor]]:
    """The file's architecture and tensors, in file order, read from its header (no tensor data read); checked as
    read_header checks the file."""
    meta, tensors = _walk(path)
    return str(meta.get("general.architecture")), tensors


def _walk(path: Path) -> tuple[dict[str, object], list[GgufTensor]]:
    """The header's metadata (arrays as their lengths) and tensor table, the file checked whole."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    bad = f"{path} is not a whole GGUF file (truncated or corrupt"
    size = path.stat().st_size
    check(size >= 24, f"{bad}: {size} bytes)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        check(m[:4] == _MAGIC, f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
        try:
            walker = _Walker(m)
            version, = walker.unpack("<I")
            check(version in (2, 3), f"{path}: GGUF version {version} is not supported (2 and 3 are)")
            n_tensors, n_kv = walker.unpack("<QQ")
            meta: dict[str, object] = {}
            for _ in range(n_kv):
                key, kind = walker.string(), walker.unpack("<I")[0]
                meta[key] = walker.value(kind)
            align = meta.get("general.alignment", 32)
            check(isinstance(align, int) and align > 0, f"{bad}: alignment {align!r})")
            assert isinstance(align, int)
            table = []
            for _ in range(n_tensors):
                name = walker.string()
                n_dims, = walker.unpack("<I")
                dims = walker.unpack(f"<{n_dims}Q")
                kind, offset = walker.unpack("<IQ")
                block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                count = 1
                for d in dims:
                    count *= d
                table.append((name, tuple(reversed(dims)), kind, offset, count // block * nbytes))
            data_start = -(-walker.pos // align) * align
        except (struct.error, ValueError, KeyError, UnicodeDecodeError, OverflowError, MemoryError) as e:
            if isinstance(e, MultispecError):
                raise
            raise MultispecError(f"{bad}: {_one_line(e, 120)})") from None
    end = max((offset + nbytes for _, _, _, offset, nbytes in table), default=0)
    check(data_start + end <= size, f"{bad}: its tensors need {data_start + end} bytes, the file has {size})")
    return meta, [GgufTensor(name, shape, kind, data_start + offset, nbytes)
                  for name, shape, kind, offset, nbytes in table]


class _Walker:
    """Reads GGUF's little-endian fields from a buffer; arrays are skipped (their length is all it returns)."""

    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 4

    def unpack(self, fmt: str) -> tuple:
        self.skip(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, self.pos - struct.calcsize(fmt))

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise ValueError(f"the header runs past the end of the file (byte {self.pos + n} of {len(self.buf)})")
        self.pos += n

    def string(self) -> str:
        n, = self.unpack("<Q")
        self.skip(n)
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8")

    def value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])[0]
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<IQ")
            if item in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[item]))
            else:
                for _ in range(count):
                    self.value(item)
            return count
        raise ValueError(f"unknown metadata type {kind}")


def _readable_architectures() -> set[str] | None:
    """The GGUF architectures this transformers reads (its legacy and its new loader's), None where it does not
    say (a version that moved them: the load itself then refuses, one line all the same)."""
    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return None
    return (set(GGUF_SUPPORTED_ARCHITECTURES) | set(GGUF_ARCHS)) - {"general", "tokenizer"}


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
