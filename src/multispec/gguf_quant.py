"""GGUF files straight to int8 / int4 / w4a8 weights (`load_pair(..., dtype="int4"|"int8"|"w4a8")`): the model's
skeleton is made without float weights (accelerate's init_empty_weights), the file is read tensor by tensor, each
tensor dequantized to float32 as transformers' GGUF reader does it (gguf's dequantize, transformers' name map and
tensor processors), and each linear (q/k/v and gate/up: each group) quantized as soon as its weights are there. No
float32 copy of the whole model is ever held, and the result is the bits models/int8.quantize_target gives the
float32 model (tests/test_gguf_quant.py).

The quantized form is cached under `cache_root()/gguf/<SHA-256 of the file>-<dtype>/` (config, generation config,
tokenizer, and the packed products in one safetensors file: int4 weights in the layout of this CPU's kernel with
their group scales, w4a8 weights in their kernel's layout, int8 weights with their row scales, packed again for the
kernel at load, the float parameters),
written under a temporary name and renamed when whole, so that later loads read it and take seconds. A cache made
by another torch (or, for int4, a CPU with other vector registers) is made again.

Architectures transformers reads another way (its newer GGUF loader, or a model with weight conversions of its
own) are not read here: `load_quantized` returns None and the caller quantizes the float32 model instead."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from multispec.errors import MultispecError, check
import multispec.gguf_cache as gguf_cache
from multispec.gguf_cache import FileIdentity
from multispec.gguf_files import (GgufSource, GgufTensor, check_extra, checked_folder, gguf_tokenizer, quant_folder,
                                  read_tensors)
from multispec.models.int8 import (PackedInt4, PackedInt8, check_quantizable, finish_target, install, linear_groups,
                                   pack)

FORMAT = 1
MANIFEST, WEIGHTS = "quantized.json", "weights.safetensors"
_DEQUANT_ROWS = 4096  # rows dequantized at once: gguf's numpy dequantizers hold several copies of what they make


def load_quantized(source: GgufSource, dtype: str, folder: Path | None = None) -> torch.nn.Module | None:
    """The model of `source` with `dtype` weights ("int8" / "int4" / "w4a8"), as quantize_target makes them from its float32
    form: read from its cache folder (`folder`, default gguf_files.quant_folder) when that was made here, else
    built from the file tensor by tensor and cached there. None when this file is not read this way (see above)."""
    check_quantizable(dtype, torch.device("cpu"), torch.float32)
    check_extra()
    folder = folder or quant_folder(source.sha256, dtype)
    whole, ident = checked_folder(source, folder)  # its manifest checked first (gguf_cache.py)
    model = _read_cache(folder, dtype) if whole else None
    return model if model is not None else _build(source, ident, dtype, folder)


def _skeleton(config) -> torch.nn.Module:
    """The model of `config` with its parameters on the meta device (buffers made as usual), tied as
    from_pretrained ties them (an output layer that is the embedding: one parameter, loaded once)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config)
        model.tie_weights()
        return model
    finally:
        hf_logging.set_verbosity(verbosity)


def _plain_keys(model: torch.nn.Module) -> bool:
    """Whether transformers loads this model's weights under their own names, with no conversion of its own."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    mapping = get_model_conversion_mapping(model)
    if any(isinstance(m, WeightConverter) for m in mapping):
        return False
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    return all(rename_source_key(k, renamings, [])[0] == k for k in model.state_dict())


class _Slots:
    """Where each tensor of the model goes: the name each alias (tied parameters) is loaded under, the linear
    groups waiting for their weights, and the float parameters and buffers set as they come."""

    def __init__(self, model: torch.nn.Module, dtype: str):
        self.model, self.dtype = model, dtype
        first: dict[int, str] = {}
        self.canonical: dict[str, str] = {}
        self.aliases: dict[str, list[str]] = {}
        for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
            key = first.setdefault(id(t), name)
            self.canonical[name] = key
            self.aliases.setdefault(key, []).append(name)
        names = {id(m): n for n, m in model.named_modules()}
        head = model.get_output_embeddings()
        self.groups: list[dict] = []
        self.waiting: dict[str, list[int]] = {}  # canonical name -> the groups that need it
        in_linear: set[str] = set()
        for parent, children, linears in linear_groups(model):
            prefix = names[id(parent)] + "." if names[id(parent)] else ""
            keys = []
            for child, linear in zip(children, linears):
                own = [f"{prefix}{child}.weight"] + ([f"{prefix}{child}.bias"] if linear.bias is not None else [])
                in_linear.update(own)
                keys += [self.canonical[k] for k in own]
            group = {"parent": parent, "prefix": prefix, "names": children, "linears": linears, "keys": keys,
                     "have": {}, "head": any(m is head for m in linears)}
            for k in keys:
                self.waiting.setdefault(k, []).append(len(self.groups))
            self.groups.append(group)
        # the names a tensor is set under as a float parameter (every alias outside a linear that is quantized)
        self.plain = {k: [a for a in names_ if a not in in_linear] for k, names_ in self.aliases.items()}
        self.done: set[str] = set()

    def put(self, name: str, value: torch.Tensor) -> None:
        key = self.canonical.get(name)
        if key is None or key in self.done:  # not the model's, or an alias already loaded (tied: the first wins)
            return
        self.done.add(key)
        if self.plain[key]:
            self._set(self.plain[key], value)
        for g in self.waiting.get(key, ()):
            group = self.groups[g]
            group["have"][key] = value
            if len(group["have"]) == len(group["keys"]):
                self._pack(group)

    def _set(self, names: list[str], value: torch.Tensor) -> None:
        param = None
        for name in names:
            owner, _, leaf = name.rpartition(".")
            module = self.model.get_submodule(owner)
            if leaf in module._parameters:
                old = module._parameters[leaf]
                param = param if param is not None else torch.nn.Parameter(value, requires_grad=old.requires_grad)
                module._parameters[leaf] = param
            else:
                module._buffers[leaf] = value

    def _pack(self, group: dict) -> None:
        have, prefix = group.pop("have"), group["prefix"]
        weights = [have[self.canonical[f"{prefix}{n}.weight"]] for n in group["names"]]
        biases = [have[self.canonical[f"{prefix}{n}.bias"]] if m.bias is not None else None
                  for n, m in zip(group["names"], group["linears"])]
        packed = pack(weights, biases, self.dtype, all(PackedInt4.fits(m) for m in group["linears"]))
        if group["head"]:  # as quantize_target keeps it: the rows a shipped feature head's key is read from
            packed.first_rows = weights[0][:32].detach().clone()
        install(group["parent"], group["names"], packed)
        group["packed"] = packed

    def missing(self) -> list[str]:
        return [n for n, t in [*self.model.named_parameters(), *self.model.named_buffers()] if t.is_meta]


def _build(source: GgufSource, ident: FileIdentity, dtype: str, folder: Path) -> torch.nn.Module | None:
    """The quantized model read from the file tensor by tensor (see the module's docstring), then cached."""
    from gguf import GGMLQuantizationType
    from transformers.integrations.gguf import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import (GGUF_SUPPORTED_ARCHITECTURES, TENSOR_PROCESSORS,
                                                          TensorProcessor, get_gguf_hf_weights_map)

    arch, infos = read_tensors(source.path)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES or arch in GGUF_ARCHS:  # transformers' newer reader
        return None
    model = _skeleton(source.config)
    if not _plain_keys(model):
        return None
    print(f"multispec: quantizing {source.path.name} to {dtype} as it is read, once; cached in {folder} (later "
          "loads read it and take seconds)", file=sys.stderr, flush=True)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=source.config.to_dict())
    with _name_maps_once():
        key_map = get_gguf_hf_weights_map(model, processor)
    slots = _Slots(model, dtype)
    parsed: dict = {"config": processor.config, "tensors": {}}
    try:
        with open(source.path, "rb") as f:
            for info in infos:
                weights = _dequantized(f, info, GGMLQuantizationType(info.kind))
                result = processor.process(weights=weights, name=info.name, tensor_key_mapping=key_map,
                                           parsed_parameters=parsed)
                del weights
                if result.name in key_map:
                    slots.put(key_map[result.name], _torch(result.weights))
                del result
        for name, value in parsed["tensors"].items():  # what a processor assembled itself (experts)
            slots.put(name, value.to(torch.float32))
    except (ValueError, KeyError, IndexError, NotImplementedError, OSError, RuntimeError) as e:
        raise MultispecError(f"cannot load the weights of {source.path}: {_one_line(e)}") from None
    missing = slots.missing()
    check(not missing, f"cannot load the weights of {source.path}: {len(missing)} tensors are not in the file "
                       f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    _write_cache(source, ident, model, slots, dtype, folder)
    return finish_target(model, dtype)


@contextlib.contextmanager
def _name_maps_once():
    """Within: gguf's name map of an architecture made once, not once per module (get_gguf_hf_weights_map asks for
    it at every module; each takes tens of milliseconds, seconds in all)."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def _dequantized(f, info: GgufTensor, kind):
    """float32 numpy [*shape]: the tensor's bytes read from the open file (not mapped: no file pages stay in the
    process's memory) and dequantized by gguf, as transformers' reader does, a block of rows at a time."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    raw = np.empty(info.nbytes, dtype=np.uint8)
    f.seek(info.start)
    check(f.readinto(memoryview(raw)) == info.nbytes, f"{f.name}: the file ended inside tensor {info.name}")
    plain = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
             GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
             GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
             GGMLQuantizationType.I64: np.int64}
    if kind in plain:
        return dequantize(raw.view(plain[kind]).reshape(info.shape), kind)
    block, size = GGML_QUANT_SIZES[kind]
    data = raw.reshape(*info.shape[:-1], info.shape[-1] // block * size)
    if data.ndim != 2 or data.shape[0] <= _DEQUANT_ROWS:
        return dequantize(data, kind)
    out = np.empty(info.shape, dtype=np.float32)
    for i in range(0, data.shape[0], _DEQUANT_ROWS):
        out[i:i + _DEQUANT_ROWS] = dequantize(data[i:i + _DEQUANT_ROWS], kind)
    return out


def _torch(weights) -> torch.Tensor:
    """The float32 tensor of a dequantized numpy array (as transformers' reader converts it)."""
    import numpy as np

    array = weights if weights.flags.writeable and weights.flags.c_contiguous else np.copy(weights)
    return torch.from_numpy(array).to(torch.float32)


def _layout(dtype: str) -> str:
    """What the cached bytes depend on besides the file: int4, the CPU kernel's blocking; w4a8, its packing."""
    if dtype == "w4a8":
        from multispec.models.w4a8 import LAYOUT

        return LAYOUT
    return PackedInt4.layout() if dtype == "int4" else f"torch {torch.__version__.split('+')[0]}"


def _write_cache(source: GgufSource, ident: FileIdentity, model: torch.nn.Module, slots: _Slots, dtype: str,
                 folder: Path) -> None:
    """Save the quantized model and the file's tokenizer into `folder`, the manifest of what was written last
    (gguf_cache.py), under a temporary name renamed when whole."""
    import transformers

    parts: list[tuple[str, Callable[[bool], dict[str, torch.Tensor]]]] = []
    groups = []
    for i, group in enumerate(slots.groups):
        packed = group["packed"]
        parts.append((f"g{i}.", functools.partial(_group_state, packed)))
        groups.append({"module": group["prefix"].rstrip("."), "names": group["names"],
                       "kind": _kind(packed)})
    params = {}
    for key, names in slots.plain.items():
        if names:
            t = model.get_parameter(names[0]) if _is_param(model, names[0]) else model.get_buffer(names[0])
            parts.append(("p.", functools.partial(_one, key, t.detach())))
            params[key] = names
    root = folder.parent
    tmp = root / f".tmp-{folder.name[:24]}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _save(tmp / WEIGHTS, parts)
        model.config.save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer = gguf_tokenizer(source.path)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / MANIFEST).write_text(json.dumps({
            "format": FORMAT, "dtype": dtype, "layout": _layout(dtype), "gguf": str(source.path.resolve()),
            "sha256": source.sha256, "transformers": transformers.__version__, "groups": groups,
            "params": params}) + "\n")
        gguf_cache.write_manifest(tmp, ident, gguf=str(source.path.resolve()), dtype=dtype)
        old = root / f".old-{folder.name[:24]}-{os.getpid()}"
        if folder.exists():  # made by another torch or CPU: replaced
            folder.rename(old)
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / gguf_cache.MANIFEST).is_file():  # not another process's whole copy, renamed there first
                raise
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise MultispecError(f"cannot write the GGUF cache in {root} ({e.strerror or e}); set MULTISPEC_CACHE_DIR "
                             "to a writable folder") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _kind(packed) -> str:
    from multispec.models.w4a8 import PackedW4A8

    return "int4" if isinstance(packed, PackedInt4) else "w4a8" if isinstance(packed, PackedW4A8) else "int8"


def _group_state(packed, meta: bool) -> dict[str, torch.Tensor]:
    state = packed.state(meta)
    return state if packed.first_rows is None else {**state, "first_rows": packed.first_rows}


def _one(name: str, value: torch.Tensor, meta: bool) -> dict[str, torch.Tensor]:
    return {name: value}


def _is_param(model: torch.nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf in model.get_submodule(owner)._parameters


_ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int8: "I8", torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL"}
_TORCH_DTYPES = {v: k for k, v in _ST_DTYPES.items()}


_ALIGN = 64  # every tensor's bytes start at a multiple of this in the file (a mapped tensor's elements aligned)


def _save(path: Path, parts: list[tuple[str, Callable[[bool], dict[str, torch.Tensor]]]]) -> None:
    """A safetensors file of the tensors `parts` make (each name prefixed), each part made when it is written, so
    that an int8 product's unpacked copy exists one group at a time (safetensors' save_file wants them all at once).
    Each part is asked first for its tensors' shapes and dtypes alone (meta=True: the header), then for them. Each
    tensor starts at a multiple of _ALIGN bytes (padding between them is a tensor too, `pad.N`: no byte unnamed)."""
    specs: dict[str, dict] = {}
    pads: list[int] = []  # bytes of padding before each tensor, in write order
    offset = 0
    for prefix, make in parts:
        for name, t in make(True).items():
            pad = -offset % _ALIGN
            if pad:
                specs[f"pad.{len(specs)}"] = {"dtype": "U8", "shape": [pad], "data_offsets": [offset, offset + pad]}
                offset += pad
            pads.append(pad)
            nbytes = t.numel() * t.element_size()
            specs[prefix + name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                                    "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
    header = json.dumps({"__metadata__": {"format": "pt"}, **specs}).encode()
    header += b" " * (-(8 + len(header)) % _ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        written = iter(pads)
        for _, make in parts:
            for t in make(False).values():
                f.write(bytes(next(written)))
                f.write(memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()))


class _Tensors:
    """The tensors of a safetensors file written by `_save`: mapped (read when first used; an embedding's unused
    rows never), or read into memory of their own (an int8 weight, packed again for the kernel and dropped: mapped,
    its pages would stay counted in the process's memory)."""

    def __init__(self, path: Path):
        import numpy as np

        self.file = open(path, "rb")
        n, = struct.unpack("<Q", self.file.read(8))
        self.specs = json.loads(self.file.read(n))
        self.start = 8 + n
        self.mapped = np.memmap(path, dtype=np.uint8, mode="c")  # private: the file is never written through it

    def get(self, name: str, mapped: bool = True) -> torch.Tensor:
        spec = self.specs[name]
        a, b = (self.start + x for x in spec["data_offsets"])
        if mapped:
            buf = torch.from_numpy(self.mapped[a:b])
        else:
            buf = torch.empty(b - a, dtype=torch.uint8)
            self.file.seek(a)
            if self.file.readinto(memoryview(buf.numpy())) != b - a:
                raise OSError(f"{self.file.name} ends inside {name}")
        return buf.view(_TORCH_DTYPES[spec["dtype"]]).reshape(spec["shape"])


def _read_cache(folder: Path, dtype: str) -> torch.nn.Module | None:
    """The quantized model saved in `folder`, or None when there is none (whole, readable) made by this torch on
    this kind of CPU."""
    from transformers import AutoConfig, GenerationConfig

    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("format") != FORMAT or manifest.get("dtype") != dtype or manifest.get("layout") != _layout(dtype):
        return None
    try:
        model = _skeleton(AutoConfig.from_pretrained(folder))
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError):  # written by another transformers: made again
        return None
    from multispec.models.w4a8 import PackedW4A8

    kinds = {"int4": PackedInt4, "int8": PackedInt8, "w4a8": PackedW4A8}
    try:
        tensors = _Tensors(folder / WEIGHTS)
        with tensors.file:
            for i, group in enumerate(manifest["groups"]):
                prefix = f"g{i}."
                state = {k[len(prefix):]: tensors.get(k, mapped=group["kind"] != "int8")
                         for k in tensors.specs if k.startswith(prefix)}
                first = state.pop("first_rows", None)
                packed = kinds[group["kind"]].from_state(state)
                packed.first_rows = first
                install(model.get_submodule(group["module"]), group["names"], packed)
            for key, names in manifest["params"].items():
                value, param = tensors.get(f"p.{key}"), None
                for name in names:
                    owner, _, leaf = name.rpartition(".")
                    module = model.get_submodule(owner)
                    if leaf in module._parameters:
                        param = param if param is not None else torch.nn.Parameter(
                            value, requires_grad=module._parameters[leaf].requires_grad)
                        module._parameters[leaf] = param
                    else:
                        module._buffers[leaf] = value
    except (OSError, ValueError, KeyError, RuntimeError, struct.error):  # a damaged folder: made again
        return None
    missing = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if missing:  # an incomplete folder: made again
        return None
    return finish_target(model, dtype)


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
