"""A feature head on disk: a folder with `config.json` and `model.safetensors` (float16), laid out after
vllm-project/speculators' Eagle layout where that costs nothing (`fc.weight`, `transformer.*` for the decoder
layer, `transformer_layer_config`, `speculators_config.verifier`), but not loadable there as is: our head reads the
target's final-norm output (the output layer's input), not the last decoder layer's, and shares the target's
embedding, norm and output layer instead of storing them.

config.json fields:
- `format` ("multispec-eagle"), `version` (1).
- `feature`: "final_norm_output" (the target hidden state the head reads, models/eagle.py).
- `fusion`: "fc(concat(embed(x_t), feature_{t-1}))", `fusion_bias` (false).
- `transformer_layer_class`: the decoder layer's class (the target's own, e.g. LlamaDecoderLayer).
- `transformer_layer_config`: the target's config with num_hidden_layers = 1 (what the layer is built from).
- `model_type`, `hidden_size`, `vocab_size`: the target's; a head is refused on a target where they differ.
- `draft_vocab_size`: the size of the head's reduced vocabulary (its ids: tensor `token_ids`), or null.
- `speculators_config`: {"algorithm": "eagle", "verifier": {"name_or_path", "architectures", "fingerprint"}}:
  the target it was trained for; fingerprint: a hash of the target's output-layer rows (informational).
- `training`: what `multispec train-head` recorded (data, minutes, tokens, held-out acceptance).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from multispec.errors import MultispecError, check
from multispec.models.eagle import EagleHead, TargetParts, layer_config
from multispec.models.int8 import first_rows, linear_shape

FORMAT = "multispec-eagle"
WEIGHTS = "model.safetensors"
SHIPPED = "shipped"  # head="shipped": the head installed with the package for this target (by fingerprint)
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "shipped_heads"


def fingerprint(target: torch.nn.Module) -> str:
    """A short hash of the target's first output-layer rows, rounded to 3 decimals (a dequantized GGUF and its
    source agree to that)."""
    rows = first_rows(TargetParts.of(target).lm_head, 32).detach().float().cpu()
    return hashlib.sha256((rows * 1000).round().to(torch.int32).numpy().tobytes()).hexdigest()[:16]


def save_head(head: EagleHead, target: torch.nn.Module, out: str | Path, target_path: str = "",
              token_ids: torch.Tensor | None = None, training: dict | None = None) -> Path:
    """Write the head to folder `out` (created; its files replaced)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = target.config
    config = {
        "format": FORMAT, "version": 1, "feature": "final_norm_output",
        "fusion": "fc(concat(embed(x_t), feature_{t-1}))", "fusion_bias": False,
        "transformer_layer_class": type(head.transformer).__name__,
        "transformer_layer_config": head.config.to_dict(),
        "model_type": cfg.model_type, "hidden_size": cfg.hidden_size, "vocab_size": linear_shape(TargetParts.of(target).lm_head)[0],
        "draft_vocab_size": None if token_ids is None else int(token_ids.numel()),
        "speculators_config": {"algorithm": "eagle", "verifier": {
            "name_or_path": str(target_path), "architectures": list(getattr(cfg, "architectures", None) or []),
            "fingerprint": fingerprint(target)}},
        "training": training or {},
    }
    tensors = {k: v.detach().to(torch.float16).cpu().contiguous() for k, v in head.state_dict().items()}
    if token_ids is not None:
        tensors["token_ids"] = token_ids.to(torch.long).cpu().contiguous()
    save_file(tensors, str(out / WEIGHTS))
    _write_config(out, config)
    return out


def _write_config(folder: Path, config: dict) -> None:
    (folder / "config.json").write_text(json.dumps(config, indent=1, default=str) + "\n")


def shipped_head(target: torch.nn.Module) -> Path:
    """The folder of the head installed with the package (multispec/shipped_heads/) for `target`, recognised by
    its output layer's fingerprint whether it was loaded from a folder or a GGUF file; one line when none ships."""
    fp = fingerprint(target)
    names = []
    for folder in sorted(SHIPPED_DIR.glob("*/")) if SHIPPED_DIR.is_dir() else []:
        try:
            verifier = read_config(folder)["speculators_config"]["verifier"]
        except (MultispecError, KeyError, TypeError):
            continue
        names.append(folder.name)
        if verifier.get("fingerprint") == fp:
            return folder
    raise MultispecError(f"no shipped head for this target (fingerprint {fp}; heads ship for: "
                         f"{', '.join(names) or 'none'}); train one with multispec train-head")


def read_config(path: str | Path) -> dict:
    path = Path(path)
    check(path.is_dir(), f"eagle head not found: {path} (a folder with config.json and {WEIGHTS})")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise MultispecError(f"eagle head {path}: cannot read config.json ({type(e).__name__})") from None
    check(isinstance(config, dict) and config.get("format") == FORMAT,
          f"eagle head {path}: config.json is not a {FORMAT} head")
    return config


DEFAULT_KEYS = ("k", "tree", "nodes", "depth", "width")  # what a head's "default" may set: its draft's shape


def record_default(path: str | Path, default: dict) -> None:
    """Record `default` (a draft shape, DEFAULT_KEYS, with notes beside it) as the head's at `path`."""
    _write_config(Path(path), {**read_config(path), "default": default})


def head_default(path: str | Path, target: torch.nn.Module) -> dict:
    """The draft shape the head at `path` ("shipped": shipped_head(target)) records as measured fastest for it: its
    config.json's "default" ({"k": 3}, {"tree": [3, 1, 1]} or {"nodes": 8, ...}; other keys there are notes), or
    {} when it records none (the method's own default then applies)."""
    path = shipped_head(target) if str(path) == SHIPPED else path
    recorded = read_config(path).get("default")
    if recorded is None:
        return {}
    check(isinstance(recorded, dict), f"eagle head {path}: config.json's default must be an object, got "
                                      f"{type(recorded).__name__}")
    return {k: recorded[k] for k in DEFAULT_KEYS if k in recorded}


def load_head(path: str | Path, target: torch.nn.Module) -> tuple[EagleHead, torch.Tensor | None]:
    """(head, token_ids or None) read from `path` ("shipped": shipped_head(target)) for `target`, in the target's
    dtype and device; refused in one line when it was made for another kind of target (model type, hidden size,
    vocabulary) or its file is bad."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = shipped_head(target) if str(path) == SHIPPED else path
    config = read_config(path)
    parts = TargetParts.of(target)
    cfg = target.config
    for key, actual in (("model_type", cfg.model_type), ("hidden_size", cfg.hidden_size),
                        ("vocab_size", linear_shape(parts.lm_head)[0])):
        check(config.get(key) == actual, f"eagle head {path} was trained for a target with {key} "
                                         f"{config.get(key)!r}; this target has {actual!r}")
    try:
        tensors = load_file(str(Path(path) / WEIGHTS))
    except (OSError, SafetensorError) as e:
        raise MultispecError(f"eagle head {path}: cannot read {WEIGHTS} ({str(e)[:120]})") from None
    token_ids = tensors.pop("token_ids", None)
    head = EagleHead(layer_config(cfg), type(target.model.layers[0]))
    param = next(target.parameters())
    try:
        head.load_state_dict({k: v.to(param.dtype) for k, v in tensors.items()}, strict=True)
    except RuntimeError as e:
        raise MultispecError(f"eagle head {path}: its weights do not fit this target's layer "
                             f"({str(e).splitlines()[0][:160]})") from None
    return head.to(device=param.device, dtype=param.dtype).eval(), token_ids
