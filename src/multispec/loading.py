"""Loading a target/draft pair: devices, dtypes, weights, tokenizers, and the load-time checks that refuse what the
backends cannot decode exactly (one line each, before any generation)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from multispec.errors import MultispecError, check
from multispec.paths import cache_root

if TYPE_CHECKING:
    from multispec.gguf_files import GgufSource
    from multispec.models.sidecar import ModelSidecar
    from multispec.models.vocab_bridge import VocabBridge

DEFAULT_PAIR_DIR = Path(__file__).parent / "default_pair"
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


CROSS_VOCAB_MODES = {"tli": "token-level intersection (the draft proposes the tokens both vocabularies have)",
                     "uag": "text re-tokenization (the draft's text re-encoded with the target's tokenizer, a chain)"}


@dataclass
class Pair:
    """A target model, an optional draft model, and the target's tokenizer (the text's tokens: the output is always
    the target's). A draft with another tokenizer drafts through `cross_vocab` ("tli" or "uag", None when the
    vocabularies agree), with `bridge` mapping the two vocabularies and `draft_tokenizer` its own.

    What the library prepares for a model (its fast backend's step, few-row table, int8 copy, ...: a
    models/sidecar.ModelSidecar) is held here, one per model (`sidecar`), never on the model."""

    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: object
    target_path: str
    draft_path: str | None
    compile: bool = False  # generate's default backend: "compiled" when True, else "hf"
    cross_vocab: str | None = None
    draft_tokenizer: object = None
    bridge: VocabBridge | None = None  # set when cross_vocab
    # what was loaded: {"target": ..., "draft": ... or None}, each {"path": ...} and for a GGUF file its "file",
    # "sha256" and "conversion" (the cache folder's id: gguf_cache.conversion_id); in every result's stats["model"]
    models: dict = field(default_factory=dict)
    sidecars: dict = field(default_factory=dict, repr=False, compare=False)  # id(model) -> its ModelSidecar

    def sidecar(self, model: torch.nn.Module, weights_dtype: str | None = None) -> ModelSidecar:
        """The sidecar of `model` (the target, the draft, the draft's int8 copy, a feature head: any model this
        pair decodes with), made on first use. weights_dtype: what the pair made its weights ("int8" / "int4" /
        "w4a8"), recorded when the sidecar is made."""
        entry = self.sidecars.get(id(model))
        if entry is None or entry.model is not model:  # (the sidecar holds its model, so an id is never reused)
            from multispec.models.sidecar import ModelSidecar

            entry = self.sidecars[id(model)] = ModelSidecar(model, weights_dtype=weights_dtype)
        return entry

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device


def load_pair(target: str | os.PathLike | torch.nn.Module | None = None,
              draft: str | os.PathLike | torch.nn.Module | None = None, device: str | None = None,
              dtype: str | torch.dtype | None = None, compile: bool = False, cross_vocab: str | None = None,
              tokenizer: object = None, draft_tokenizer: object = None) -> Pair:
    """Load a target/draft pair from local Hugging Face directories, GGUF files, models already in memory (or hub
    names where a hub is reachable).

    target=None and draft=None load the embedded default pair. A `.gguf` file loads through transformers' GGUF
    reader (pip install 'multispec[gguf]'), dequantized to float32 once and cached under multispec's cache folder
    (gguf/<its SHA-256>/), so that later loads take seconds; its tokenizer, chat template and generation config come
    from the file. A model in memory (a transformers PreTrainedModel with a language-model head: loaded, fine-tuned
    or merged) is used as it is, put in eval mode, with its tokenizer given as `tokenizer=` (and a draft object's
    as `draft_tokenizer=` when it has another vocabulary); device and dtype, when given, must be the model's.
    Every target and draft passes the same load-time checks (a causal LM, no recurrent state, the probe of
    models/probe.py), whatever it came from.
    A draft with another tokenizer drafts in the target's tokens through cross_vocab: "tli" (default: token-level
    intersection) or "uag" (text re-tokenization); one line on stderr says which (docs/cross_vocab.md).
    device: default "cuda" when available, else "cpu". dtype: default float32 on CPU, bfloat16 on CUDA; "int8" (CPU):
    the target and the draft loaded in float32, then given int8 weights and int8 activations quantized row by row
    (models/int8.py quantize_target: a different model from the float32 one, decoded exactly; a model in memory is
    copied first, not changed). "int4" (CPU): int4 weights in groups of 32 and bfloat16 rows instead, where torch's
    int4 kernel takes a layer's shape (else int8). "w4a8" (CPU): int4 weights in groups of 32 and int8 rows, by
    multispec's own kernel (models/w4a8.py, compiled once with the system C++ compiler); docs/quantized.md. A GGUF
    file is quantized as it is read, with no float32 copy of the whole model (the same bits; gguf_quant.py), and its
    quantized form cached (gguf/<its SHA-256>-<dtype>/: later loads take seconds).
    compile=True: `generate` runs on the compiled fast backend unless told otherwise (backend="compiled": the
    static-cache backend with its steps torch.compile'd; Llama-family models only, checked here). Every step size
    is compiled here, at load, with a line on stderr each (minutes the first time on a CPU; torch caches the
    compiled code on disk, so later loads take seconds). On this project's CPU it is not faster overall (README).

    Threads: torch's CPU threads are set as the CLI sets them (the free cores, at most 4; threads.py) unless you
    chose them already (torch.set_num_threads, OMP_NUM_THREADS or MKL_NUM_THREADS).
    Everything is checked before any weights load: a file that is not a .gguf, a folder without config.json, a
    target folder without tokenizer files, a truncated or corrupt GGUF file, or one transformers cannot read is
    refused in one line; a hub id while the hub cannot be reached loads from the local cache only, at once (no
    retries), or is refused in one line.
    """
    from multispec.threads import apply_library_default

    check(isinstance(compile, bool), f"compile must be True or False, got {compile!r}")
    check(cross_vocab is None or cross_vocab in CROSS_VOCAB_MODES,
          f"cross_vocab must be one of {', '.join(CROSS_VOCAB_MODES)}, got {cross_vocab!r}")
    if target is None:
        check(draft is None, "a draft was given without a target; give both, or neither for the default pair")
        target, draft = DEFAULT_PAIR_DIR / "target", DEFAULT_PAIR_DIR / "draft"
        check(target.is_dir() and draft.is_dir(),
              f"the embedded default pair is not installed (expected {DEFAULT_PAIR_DIR}); pass --target/--draft")
    check(cross_vocab is None or draft is not None, f"cross_vocab={cross_vocab!r} is for a draft with another "
                                                     "tokenizer; no draft was given")
    from multispec.models.int8 import QUANT_DTYPES

    quant = dtype if isinstance(dtype, str) and dtype in QUANT_DTYPES else None
    dtype = "float32" if quant else dtype
    given = _in_memory(target, tokenizer, "target", "tokenizer")
    given_draft = _in_memory(draft, draft_tokenizer, "draft", "draft_tokenizer") if draft is not None else None
    if given is not None:  # a model in memory decides the device and dtype, unless they were given (and agree)
        device = _same(device, given.device, "device", given.label)
        dtype = _same(dtype, next(given.model.parameters()).dtype, "dtype", given.label)
    device = resolve_device(device)
    check(not quant or device.type == "cpu", f"dtype {quant} runs on the CPU only (torch's {quant} kernels), not on "
                                            f"{device}; use device cpu or another dtype")
    check(not (quant and compile), f"the compiled backend does not run {quant} models; use the fast or hf backend")
    if isinstance(dtype, str):
        check(dtype in _DTYPES, f"unknown dtype {dtype!r}; choose one of {', '.join(_DTYPES)}")
        dtype = _DTYPES[dtype]
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if given_draft is not None:
        _same(device, given_draft.device, "device", given_draft.label)
        _same(dtype, next(given_draft.model.parameters()).dtype, "dtype", given_draft.label)
    # every source is checked before any weights load
    t_src = given or _check_path(str(target), role="target", quant=quant)
    d_src = None if draft is None else given_draft or _check_path(str(draft), role="draft", quant=quant)
    apply_library_default()
    t_model = _load_as(t_src, device, dtype, quant)
    tokenizer = t_src.tokenizer()
    d_model = d_tok = bridge = None
    if d_src is not None:
        d_model = _load_as(d_src, device, dtype, quant)
        tv, dv = vocab_rows(t_model), vocab_rows(d_model)
        d_tok = d_src.tokenizer(required=False)
        shared = tv == dv and (d_tok is None or d_tok.get_vocab() == tokenizer.get_vocab())
        if shared:
            check(cross_vocab is None, f"cross_vocab={cross_vocab!r} is for a draft with another tokenizer; this "
                                       "draft shares the target's vocabulary")
            d_tok = None
        else:
            check(d_tok is not None, f"draft and target vocabularies differ ({dv} vs {tv} output tokens) and the "
                                     f"draft has no tokenizer {d_src.tokenizer_hint}")
            cross_vocab = cross_vocab or "tli"
            bridge = _bridge(tokenizer, d_tok, tv, dv, cross_vocab)
    pair = Pair(target=t_model, draft=d_model, tokenizer=tokenizer, target_path=t_src.label,
                draft_path=None if d_src is None else d_src.label, compile=compile,
                cross_vocab=cross_vocab if bridge is not None else None, draft_tokenizer=d_tok, bridge=bridge,
                models={"target": t_src.identity(), "draft": None if d_src is None else d_src.identity()})
    models = [m for m in (t_model, d_model) if m is not None]
    for m in models:
        pair.sidecar(m, weights_dtype=quant)  # a quantized pair: its dtype recorded beside the model, not on it
    if compile:
        from multispec.models import make_backend

        for m in models:
            make_backend(m, "fast", max_len=1, sidecar=pair.sidecar(m))  # refuses, in one line, what it cannot run
        for m in models:  # every step size now, not mid-generation
            make_backend(m, "compiled", max_len=128, sidecar=pair.sidecar(m)).warm_up()
    return pair


def _load_as(src: _FromPath | _InMemory, device: torch.device, dtype: torch.dtype, quant: str | None
             ) -> torch.nn.Module:
    """The model of `src`, given `quant` weights when asked for: a GGUF file is quantized as it is read (or read
    from its quantized cache: gguf_quant.py), anything else loaded in float32 and quantized (a model in memory:
    a copy)."""
    if quant and isinstance(src, _FromPath) and src.gguf is not None:
        from multispec.gguf_files import quant_folder
        from multispec.gguf_quant import load_quantized

        model = load_quantized(src.gguf, quant)
        if model is not None:  # probed as quantize_target's model is, once for its cache folder (`_probe_stamp`)
            src.quant_ready = True
            stamp = _probe_stamp(str(quant_folder(src.gguf.sha256, quant)), quant, device, QUANT_CODE)
            check_supported(model, f"{src.label} ({quant})", stamp=stamp)
            return model
    model = src.load(device, dtype)
    return _quantized(model, src.label, quant, copy=isinstance(src, _InMemory)) if quant else model


def _quantized(model: torch.nn.Module, label: str, dtype: str, copy: bool) -> torch.nn.Module:
    """The model with int8 (int4) weights, row-exact (models/int8.py), probed again: the probe checks
    that the backend's cached forwards reproduce the quantized model's own full forward. copy: a model the caller
    holds is copied first."""
    import copy as copy_module

    from multispec.models.int8 import quantize_target
    from multispec.models.probe import probe_model

    model = quantize_target(copy_module.deepcopy(model) if copy else model, dtype)
    probe_model(model, f"{label} ({dtype})")
    return model


@dataclass
class _FromPath:
    """A model folder, hub id or GGUF file, checked (`_check_path`) and not loaded yet; a GGUF file loads from its
    cache folder, written the first time (gguf_files.materialize)."""

    label: str
    hub: dict
    gguf: GgufSource | None = None
    quant_ready: bool = False  # a GGUF file loaded as int8 / int4: its quantized cache folder holds the tokenizer
    quant: str | None = None

    @property
    def tokenizer_hint(self) -> str:
        return (f"(no tokenizer metadata in {self.label})" if self.gguf is not None else
                f"files to map one to the other; put the draft's tokenizer files beside its weights in {self.label}")

    def folder(self) -> str:
        from multispec.gguf_files import materialize, quant_folder

        if self.gguf is None:
            return self.label
        if self.quant_ready and self.quant:
            return str(quant_folder(self.gguf.sha256, self.quant))
        return str(materialize(self.gguf))

    def load(self, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
        return _load_model(self.folder(), device, dtype, self.hub, self.label)

    def tokenizer(self, required: bool = True):
        return load_tokenizer(self.folder(), required=required, hub=self.hub)

    def identity(self) -> dict:
        """What was loaded (Pair.models): the path, and for a GGUF file its name, SHA-256 and conversion's id."""
        if self.gguf is None:
            return {"path": self.label}
        from multispec.gguf_cache import conversion_id

        return {"path": self.label, "file": self.gguf.path.name, "sha256": self.gguf.sha256,
                "conversion": conversion_id(Path(self.folder()))}


@dataclass
class _InMemory:
    """A transformers model the caller already holds, with the tokenizer they gave (`_in_memory`)."""

    label: str
    model: torch.nn.Module
    given_tokenizer: object
    tokenizer_hint = "to map one to the other; pass the draft's as draft_tokenizer="

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def load(self, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
        self.model.eval()  # no dropout: decoding must be the model's deterministic forward
        check_supported(self.model, self.label)
        return self.model

    def tokenizer(self, required: bool = True):
        return self.given_tokenizer

    def identity(self) -> dict:
        return {"path": self.label}


def _check_path(path: str, role: str, quant: str | None = None) -> _FromPath:
    """Everything about a path that can be checked before its weights load (one line each). quant: the int8 /
    int4 form it is to be loaded as."""
    from multispec.gguf_files import is_gguf, open_gguf

    if is_gguf(path):
        source = open_gguf(path, need_tokenizer=role == "target", quant=quant)
        _check_config(source.config, path)
        return _FromPath(path, {}, source, quant=quant)
    hub = _hub_access(path)
    _check_config(_read_config(path, hub), path)
    if role == "target":
        _check_tokenizer_files(path)
    return _FromPath(path, hub)


def _in_memory(model: object, tokenizer: object, role: str, tok_name: str) -> _InMemory | None:
    """The model object given as `role` with its tokenizer, checked; None when `role` is a path."""
    if isinstance(model, (str, os.PathLike)):
        check(tokenizer is None, f"{tok_name}= goes with a {role} model object; a {role} read from a folder or a "
                                 ".gguf file brings its own tokenizer")
        return None
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    check(isinstance(model, PreTrainedModel), f"{role} must be a model folder, a .gguf file or a transformers "
                                              f"PreTrainedModel, got {type(model).__name__}")
    assert isinstance(model, PreTrainedModel)
    label = f"<{type(model).__name__} in memory>"
    check(model.get_output_embeddings() is not None, f"{role} {label} is not a causal language model (no "
                                                     "language-model head): load it with AutoModelForCausalLM")
    _check_config(model.config, label)
    check(tokenizer is not None or role != "target", f"a target model object needs its tokenizer: "
                                                     f"load_pair(target=model, {tok_name}=tokenizer)")
    check(tokenizer is None or isinstance(tokenizer, PreTrainedTokenizerBase),
          f"{tok_name} must be a transformers tokenizer (AutoTokenizer.from_pretrained), got {type(tokenizer).__name__}")
    if tokenizer is not None:
        n, rows = len(tokenizer), vocab_rows(model)
        check(n <= rows, f"{tok_name} has {n} tokens, more than the {rows} output rows of {label}: not this model's "
                         "tokenizer")
    return _InMemory(label, model, tokenizer)


def _same(value, actual, what: str, label: str):
    """A model in memory stays as it is: `value` (a device or a dtype), when given, must be the model's."""
    if value is None:
        return actual
    if what == "device":
        want = resolve_device(value)
        ok = want == actual or (want.type == actual.type and want.index is None)
    else:
        check(not isinstance(value, str) or value in _DTYPES, f"unknown dtype {value!r}; choose one of "
                                                              f"{', '.join(_DTYPES)}")
        ok = _DTYPES.get(value, value) == actual if isinstance(value, str) else value == actual
    check(ok, f"{label} has {what} {actual}, not {value}: convert it first (model.to(...)) or leave {what} unset")
    return actual


def _bridge(tokenizer, d_tok, tv: int, dv: int, mode: str):
    """The two vocabularies' map, and the one line on stderr that says how this draft drafts."""
    import sys

    from multispec.models.vocab_bridge import VocabBridge

    bridge = VocabBridge(tokenizer, d_tok, tv, dv)
    check(mode != "tli" or bridge.size > 0, "the draft's and the target's vocabularies share no token; "
                                            "use cross_vocab='uag' (text re-tokenization)")
    print(f"multispec: the draft has another tokenizer; drafting by {CROSS_VOCAB_MODES[mode]} "
          f"[{mode}; {bridge.describe()}]", file=sys.stderr, flush=True)
    return bridge


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to load on: `device`, checked (cpu, cuda[:N] when CUDA is available, mps when available), or
    CUDA when available, else the CPU. Raises MultispecError for anything else."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check(isinstance(device, (str, torch.device)), f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise MultispecError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    check(d.type in ("cpu", "cuda", "mps"), f"device {str(device)!r} cannot run a model here; use cpu, cuda or cuda:N")
    if d.type == "cuda":
        check(torch.cuda.is_available(), f"device {str(device)!r} asked for, but CUDA is not available on this machine "
                                         "(torch.cuda.is_available() is False); use cpu")
        check(d.index is None or d.index < torch.cuda.device_count(),
              f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if d.type == "mps":
        check(torch.backends.mps.is_available(), f"device {str(device)!r} asked for, but MPS is not available")
    return d


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model",
                   "vocab.txt")  # any one of them: transformers can build the tokenizer
HUB_PROBE_S = 3.0  # seconds to wait for the hub before loading hub ids from the local cache only


def _hub_access(path: str) -> dict:
    """from_pretrained keywords for `path`, checked before anything loads. A local path must be a model folder (not
    a file: a .gguf file goes to gguf_files, `_check_path`; with a config.json); a path that is not local is a hub id: where the hub cannot be
    reached (HF_HUB_OFFLINE set, or no connection within HUB_PROBE_S), it loads from the local cache only, so that
    a model not cached fails at once instead of after transformers' retries."""
    p = Path(path)
    check(not p.is_file(), f"{path} is a file; give a Hugging Face model folder (config.json and safetensors "
                           "weights) or a .gguf file")
    if p.is_dir():
        check((p / "config.json").is_file(), f"{path} has no config.json: not a Hugging Face model folder (expected "
                                             "config.json and safetensors weights, as save_pretrained writes them)")
        return {}
    check(not (p.is_absolute() or path.startswith(".") or path.count("/") > 1), f"model path not found: {path}")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on") or not _hub_reachable():
        return {"local_files_only": True}
    return {}


def _hub_reachable() -> bool:
    """Whether a TCP connection to the Hugging Face hub (HF_ENDPOINT, default huggingface.co) opens in time."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=HUB_PROBE_S).close()
    except OSError:
        return False
    return True


def has_chat_template(target: str | os.PathLike | None) -> bool | None:
    """Whether the target's tokenizer has a chat template, told from its files before any model loads: a GGUF
    file's metadata (tokenizer.chat_template), a folder's tokenizer_config.json (its chat_template) or
    chat_template.jinja / chat_template.json. None where its files cannot tell (a hub id, a folder without a
    tokenizer config). target None: the embedded default pair's."""
    import json

    from multispec.gguf_files import has_chat_template as gguf_has_chat_template
    from multispec.gguf_files import is_gguf

    path = DEFAULT_PAIR_DIR / "target" if target is None else Path(target)
    if is_gguf(path):
        return gguf_has_chat_template(path) if path.is_file() else None
    if not path.is_dir():
        return None
    if any((path / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return bool(config.get("chat_template")) if isinstance(config, dict) else None


def _check_tokenizer_files(path: str) -> None:
    """A local target folder holds tokenizer files: the text's tokens are the target's (checked before loading)."""
    p = Path(path)
    if p.is_dir():
        check(any((p / name).is_file() for name in TOKENIZER_FILES),
              f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...): the target's tokenizer must "
              "sit beside its weights; copy it there from the model it was trained with")


def _read_config(path: str, hub: dict):
    """Read the model's config before any weights load (hub: from_pretrained keywords, `_hub_access`): one line
    when it cannot be read."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, **hub)
    except (OSError, ValueError) as e:
        if hub.get("local_files_only"):
            raise MultispecError(f"{path} is not a local folder, the Hugging Face hub cannot be reached (offline), and "
                                 "it is not in the local cache; give a model folder, or download it first "
                                 f"(hf download {path})") from None
        raise MultispecError(f"cannot load a model config from {path}: {_one_line(e)}") from None


def _check_config(config, path: str) -> None:
    """One line when the config names a model with no causal-LM class, or one the backends cannot decode exactly
    (recurrent or cache-sharing architectures: refused from the config, before any weights)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    check(type(config) in MODEL_FOR_CAUSAL_LM_MAPPING, f"{path} is not a causal language model (config type "
                                                       f"{type(config).__name__} has no AutoModelForCausalLM class)")
    from multispec.models.layout import attention_layout

    try:
        attention_layout(config)
    except MultispecError as e:
        raise MultispecError(f"{path}: {e}") from None


def _load_model(path: str, device: torch.device, dtype: torch.dtype, hub: dict, label: str) -> torch.nn.Module:
    """The model at `path` (a folder or hub id; `label`: what the user named, a .gguf file's cache folder being
    `path`), once `_check_config` accepted its config (hub: its from_pretrained keywords)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # no "Loading weights" bars on every run
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **hub)
    except (ValueError, OSError, SafetensorError, RuntimeError) as e:  # missing, truncated or corrupt weight files
        raise MultispecError(f"cannot load {label}: {_one_line(e)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    model = model.to(device).eval()
    check_supported(model, label, stamp=_probe_stamp(path, dtype, device))
    return model


def check_supported(model: torch.nn.Module, path: str, stamp: Path | None = None) -> None:
    """Refuse, in one line, what the backends cannot decode exactly: recurrent / linear-attention caches, and any
    model whose cached, tree-masked forwards disagree with its own full forward (see models/probe.py). stamp: where
    a pass of this very model is remembered (`_probe_stamp`), so a second load skips the probe's forwards."""
    from multispec.models.probe import probe_model

    if stamp is not None and stamp.is_file():
        return
    probe_model(model, path)
    if stamp is not None:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.touch()
        except OSError:  # a read-only cache: probe again next time
            pass


def _probe_stamp(path: str, dtype: torch.dtype | str, device: torch.device, code: tuple[str, ...] = ()
                 ) -> Path | None:
    """The mark of a passed probe of the model in local folder `path`: keyed by the folder, each of its files' size
    and modification time, the dtype and device type, the torch and transformers versions and the source of the
    code the probe checks (probe, hf backend, layout; `code`: more files of models/), so any change to any of them
    probes again. None (always probe) for a hub id."""
    import hashlib

    import transformers

    folder = Path(path)
    if not folder.is_dir():
        return None
    import multispec.models as models_pkg

    source = Path(models_pkg.__file__).parent
    parts = [str(folder.resolve()), str(dtype), device.type, torch.__version__, transformers.__version__]
    parts += [hashlib.sha256((source / f).read_bytes()).hexdigest() for f in PROBED_CODE + code]
    parts += [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in sorted(folder.iterdir()) if f.is_file()]
    return cache_root() / "probe" / hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


PROBED_CODE = ("probe.py", "hf.py", "hf_compat.py", "layout.py", "base.py")  # models/: what a probe verdict rests on
QUANT_CODE = ("int8.py", "w4a8.py", "w4a8.cpp")  # and for a quantized model, its quantized layers


def _one_line(e: BaseException, limit: int = 300) -> str:
    """A library's message as one line: its whitespace collapsed (not cut at its first line break, which can fall
    mid-sentence), at most `limit` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def vocab_rows(model: torch.nn.Module) -> int:
    from multispec.models.int8 import linear_shape

    return linear_shape(model.get_output_embeddings())[0]


def load_tokenizer(path: str, required: bool = True, hub: dict | None = None):
    """The tokenizer at `path` (hub: from_pretrained keywords, `_hub_access`); None when not required and absent."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, **(hub or {}))
    except (OSError, ValueError, TypeError) as e:
        if not required:
            return None
        raise MultispecError(f"cannot load a tokenizer from {path}: {_one_line(e)}") from None


def max_positions(model: torch.nn.Module) -> int | None:
    """The model's number of positions from its config (max_position_embeddings, n_positions, ...), or None."""
    cfg = getattr(model, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


# The tokens llama.cpp ends a generation at besides a GGUF file's one eos token (src/llama-vocab.cpp, the text rule
# that fills `special_eog_ids`): a GGUF file keeps one eos id where the model's Hugging Face generation config lists
# several (Qwen2.5: <|im_end|> and <|endoftext|>); a model that ends with the other one ran on past its answer.
GGUF_END_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
                   "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>")


def eos_ids(pair: Pair) -> set[int]:
    """The tokens that end a generation: the target's generation config's (else its tokenizer's eos token); for a
    GGUF target, also the special tokens llama.cpp ends at (GGUF_END_TOKENS, where its vocabulary has them)."""
    eos = pair.target.generation_config.eos_token_id if pair.target.generation_config is not None else None
    eos = eos if eos is not None else pair.tokenizer.eos_token_id
    ids = set() if eos is None else set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}
    if (pair.models.get("target") or {}).get("file") and hasattr(pair.tokenizer, "get_added_vocab"):
        added = pair.tokenizer.get_added_vocab()
        ids |= {int(added[t]) for t in GGUF_END_TOKENS if t in added}
    return ids
