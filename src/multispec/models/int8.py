"""Int8 draft weights on CPU: every `nn.Linear` of a copy of the draft becomes a dynamically quantized int8 linear
(int8 weights, one scale per output row; activations quantized per call), through torch's own
`torch.ao.quantization.quantize_dynamic` and the fbgemm / onednn / qnnpack kernels that ship with torch.

Why this and not torchao: torch 2.13 still ships eager dynamic quantization (it warns that it is deprecated in
favour of torchao's `quantize_`), and it needs no new dependency; torchao (0.18 on PyPI) is the migration path when
torch drops it. `torch.ops.aten._weight_int8pack_mm` (weight-only int8) exists too but is 5-40x slower than fp32 on
CPU at a small draft's sizes. Dynamic int8 costs ~15 us more per call than fp32 on 256-wide layers and halves a
[8192, 256] output layer (benchmarks/results/cheap_draft/steps.md): it pays where the weights are large.

Only a draft is quantized: losslessness comes from the target alone, and the verifier reads the q the quantized
draft actually produced. The target is never touched (the draft is copied first). The embedding stays float
(a lookup, no matmul to save).
"""
from __future__ import annotations

import copy
import warnings

import torch

from multispec.errors import check

FAST_NET_KEY = "_multispec_fast_net"  # models/fast.py keeps its FastNet on the model under this key


def quantize_draft(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose nn.Linear layers (output layer included) hold int8 weights (per-row scales) and
    quantize their activations dynamically. `model` itself is left unchanged. CPU and float32 only; anything else
    is refused in one line (MultispecError)."""
    weight = model.get_input_embeddings().weight
    check(weight.device.type == "cpu",
          f"int8 draft weights run on CPU only (torch's dynamic int8 kernels); this draft is on {weight.device}")
    check(weight.dtype == torch.float32,
          f"int8 draft weights are made from a float32 draft, not {weight.dtype}; load the draft in float32")
    engines = torch.backends.quantized.supported_engines
    check(any(e in engines for e in ("x86", "fbgemm", "onednn", "qnnpack")),
          f"this torch build has no int8 CPU kernels (quantized engines: {engines})")
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    fresh = copy.copy(model)  # drop a cached FastNet: its modules would be the float copies
    fresh.__dict__ = {k: v for k, v in model.__dict__.items() if k != FAST_NET_KEY}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notices for eager quantization (see module docstring)
        out = quantize_dynamic(fresh, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                               inplace=False)
    return out.eval()


def is_int8(module: torch.nn.Module) -> bool:
    """Whether `module` is a dynamically quantized int8 linear (from quantize_draft)."""
    from torch.ao.nn.quantized.dynamic import Linear

    return isinstance(module, Linear)


def linear_shape(module: torch.nn.Module) -> tuple[int, int]:
    """(out_features, in_features) of a float or int8 output layer (an int8 linear's `weight` is a method)."""
    if is_int8(module):
        return int(module.out_features), int(module.in_features)
    return int(module.weight.shape[0]), int(module.weight.shape[1])
