"""Quantized models on CPU: int8 drafts (quantize_draft) and row-exact int8 / int4 targets (quantize_target).

Int8 draft weights: every `nn.Linear` of a copy of the draft becomes a dynamically quantized int8 linear
(int8 weights, one scale per output row; activations quantized per call), through torch's own
`torch.ao.quantization.quantize_dynamic` and the fbgemm / onednn / qnnpack kernels that ship with torch.

Why this and not torchao: torch 2.13 still ships eager dynamic quantization (it warns that it is deprecated in
favour of torchao's `quantize_`), and it needs no new dependency; torchao (0.18 on PyPI) is the migration path when
torch drops it. `torch.ops.aten._weight_int8pack_mm` (weight-only int8) exists too but is 5-40x slower than fp32 on
CPU at a small draft's sizes. Dynamic int8 costs ~15 us more per call than fp32 on 256-wide layers and halves a
[8192, 256] output layer (benchmarks/results/cheap_draft/steps.md): it pays where the weights are large.

quantize_draft quantizes a draft only: losslessness comes from the target alone, and the verifier reads the q the
quantized draft actually produced; the target is never touched (the draft is copied first). The embedding stays
float (a lookup, no matmul to save). A quantized *target* (`quantize_target`, `--dtype int8|int4`) needs row-exact
products instead: see "int8 targets" below.
"""
from __future__ import annotations

import functools
import warnings

import torch

from multispec.errors import MultispecError, check
from multispec.models.products import SharedProduct


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

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notices for eager quantization (see module docstring)
        out = quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                               inplace=False)
    return out.eval()


def is_int8(module: torch.nn.Module) -> bool:
    """Whether `module` is an int8 linear: dynamically quantized (quantize_draft) or row-exact (quantize_target)."""
    from torch.ao.nn.quantized.dynamic import Linear

    return isinstance(module, (Linear, QuantLinear))


def linear_shape(module: torch.nn.Module) -> tuple[int, int]:
    """(out_features, in_features) of a float or int8 output layer (an int8 linear has no weight tensor)."""
    if is_int8(module):
        return int(module.out_features), int(module.in_features)
    return int(module.weight.shape[0]), int(module.weight.shape[1])


def float_weight(module: torch.nn.Module) -> torch.Tensor:
    """float [out, in]: a float linear's weight, or an int8 linear's int8 values times their row scales."""
    if isinstance(module, QuantLinear):
        return module.float_weight()
    if is_int8(module):
        return module.weight().dequantize()
    return module.weight.detach()


def float_bias(module: torch.nn.Module) -> torch.Tensor | None:
    """float [out] or None: a float or int8 linear's bias."""
    if isinstance(module, QuantLinear):
        bias = module.packed.bias
        return None if bias is None else bias[module.start:module.stop]
    bias = module.bias() if is_int8(module) else getattr(module, "bias", None)
    return None if bias is None else bias.detach()


# ---------------------------------------------------------------------------------------------------------------
# int8 targets: row-exact W8A8 (issue 43)
#
# A verification runs k + 1 rows through the model where a decode step runs one; lossless speculation needs row i of
# the k-row forward to be what a one-row forward of that row gives. torch's dynamic int8 (quantize_draft above)
# quantizes the activations with one scale for the whole input, so a row's result depends on the other rows in the
# call: fine for a draft (the verifier reads the q the draft produced), wrong for a target. QuantLinear scales
# each row to max |x| = 1 itself and appends an anchor row (+1, -1, 0, ...), so the per-tensor range the kernel
# measures is always [-1, 1] and its activation scale a constant: each row is quantized by its own max alone, the
# int8 products are summed in int32 (exact), and the float epilogue is elementwise. A row's output is then the
# same bits in any company (tests/test_quantized.py checks it). The kernel is torch's dynamic int8 linear (fbgemm,
# AVX-512 VNNI here), the fastest int8 product torch has on this CPU at 1-16 rows, ahead of weight-only int8
# (_weight_int8pack_mm) and int8 x int8 (_int_mm), the products torchao's CPU int8 layouts run on
# (benchmarks/results/quantized/kernels.json). Rows are quantized with 8 bits where the CPU has VNNI (int8 dot products summed
# straight into int32), else with 7 (reduce_range, as torch does on x86: no int16 saturation); on SmolLM2 the
# 7-bit rows cost 11-15 % perplexity against float32, the 8-bit rows 3 %.
#
# The int8 products are then exact, and so sensitive: a float32 sum that another row count orders differently (the
# attention's, which the fp32 model shares) moves a value by one bit, which can move an int8 rounding by one step,
# a change that grows through the layers (SmolLM2: logits 3-6 apart between a 16-row and a one-row forward). So an
# int8 model attends in float64 (both backends: FastNet.attend, and a transformers attention function registered
# below) and rounds the result to float32: a one-bit float64 difference survives that rounding about once in 10^9
# values, and then moves an int8 rounding about once in 10^5. A 16-row forward then equals 16 one-row forwards
# bit for bit (tests/test_quantized.py, on SmolLM2 at contexts 37-517).

def _has_vnni() -> bool:
    """Whether this CPU sums int8 products in int32 in one instruction (AVX512-VNNI or AVX-VNNI; Linux flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


REDUCE_RANGE = not _has_vnni()  # 7-bit rows where 8-bit ones could saturate fbgemm's int16 sums
_FUSE = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # siblings that read the same input


class PackedInt8(SharedProduct):
    """int8 weights, one scale per output row; each input row quantized by its own max |x| (see above)."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None]):
        w = _joined(weights)  # [N, K]
        rows = []  # int8 values, quantized QUANT_ROWS rows at a time: the same values, less memory at once
        scale = torch.empty(w.shape[0], dtype=torch.float64)
        for i in range(0, w.shape[0], QUANT_ROWS):
            part = w[i:i + QUANT_ROWS]
            s = scale[i:i + QUANT_ROWS] = (part.abs().amax(1) / 127).clamp_min(1e-12).double()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's deprecation notice for quantized tensors
                rows.append(torch.quantize_per_channel(part, s, torch.zeros(part.shape[0], dtype=torch.long), 0,
                                                       torch.qint8).int_repr())
        self._set(rows[0] if len(rows) == 1 else torch.cat(rows), scale, _joined_bias(weights, biases))

    def _set(self, values: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Pack int8 `values` [N, K] with their row `scale` [N] (float64) for the kernel."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(values, scale, torch.zeros(values.shape[0],
                                                                                     dtype=torch.long), 0)
        self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.bias = bias
        self.shape = tuple(values.shape)
        self.anchor = torch.zeros(1, values.shape[1])
        self.anchor[0, 0], self.anchor[0, -1] = 1.0, -1.0

    def state(self, meta: bool = False) -> dict[str, torch.Tensor]:
        """What rebuilds this product (`from_state`): the int8 values, their row scales, the bias. The kernel's
        packed form itself cannot be saved; it is packed again from these. meta: their shapes and dtypes alone
        (on the meta device), without unpacking."""
        if meta:
            out = {"values": torch.empty(self.shape, dtype=torch.int8, device="meta"),
                   "scale": torch.empty(self.shape[0], dtype=torch.float64, device="meta")}
        else:
            w, _ = torch.ops.quantized.linear_unpack(self.packed)
            out = {"values": w.int_repr(), "scale": w.q_per_channel_scales().double()}
        return out if self.bias is None else {**out, "bias": self.bias}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> PackedInt8:
        product = cls.__new__(cls)
        product._set(state["values"], state["scale"], state.get("bias"))
        return product

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """float [M, K] -> float [M, N], no sharing (the fast backend calls this directly)."""
        r = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_min(1e-30)  # [M, 1]
        y = torch.ops.quantized.linear_dynamic(torch.cat([x / r, self.anchor]), self.packed, REDUCE_RANGE)[:-1] * r
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        w, _ = torch.ops.quantized.linear_unpack(self.packed)
        return w.dequantize()


class PackedInt4(SharedProduct):
    """int4 weights in groups of INT4_GROUP along K (w = (q - 8) * scale + zero, asymmetric: the layout of torch's
    CPU int4 kernel, gpt-fast's tinygemm), rows in bfloat16, the output rounded to bfloat16. Row-exact as it is:
    the kernel sums each row alone (tests/test_quantized.py)."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None]):
        w = _joined(weights)  # [N, K]
        n, k = w.shape
        scales, packs = [], []  # QUANT_ROWS rows at a time (a multiple of the kernel's row blocks): the same
        for i in range(0, n, QUANT_ROWS):  # bytes as one call, less memory at once
            wg = w[i:i + QUANT_ROWS].reshape(-1, k // INT4_GROUP, INT4_GROUP)
            low, high = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
            scale = ((high - low) / 15).clamp_min(1e-12)
            q = torch.round((wg - low) / scale).clamp(0, 15).to(torch.int32).reshape(-1, k)
            scales.append(torch.cat([scale, low + 8 * scale], -1).transpose(0, 1).to(torch.bfloat16))
            packs.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2))
        self.scales = (scales[0] if len(scales) == 1 else torch.cat(scales, 1)).contiguous()
        self.packed = packs[0] if len(packs) == 1 else torch.cat(packs)
        self.bias = _joined_bias(weights, biases)
        self.shape = (n, k)

    def state(self, meta: bool = False) -> dict[str, torch.Tensor]:
        """What rebuilds this product (`from_state`): the packed weights (in the layout of this CPU's kernel:
        `layout()`), the group scales and zeros, the bias (meta: the same; nothing to unpack)."""
        out = {"packed": self.packed, "scales": self.scales, "shape": torch.tensor(self.shape)}
        return out if self.bias is None else {**out, "bias": self.bias}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> PackedInt4:
        product = cls.__new__(cls)
        product.packed, product.scales, product.bias = state["packed"], state["scales"], state.get("bias")
        n, k = (int(v) for v in state["shape"])
        product.shape = (n, k)
        return product

    @staticmethod
    def layout() -> str:
        """What the packed bytes depend on: torch's int4 CPU kernel blocks rows by its vector width."""
        return f"torch {torch.__version__.split('+')[0]}, {torch.backends.cpu.get_cpu_capability()}"

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, INT4_GROUP, self.scales)
        return y.float() if self.bias is None else y.float() + self.bias

    def dequantized(self) -> torch.Tensor:
        eye = torch.eye(self.shape[1], dtype=torch.bfloat16)  # the product of the identity: each weight once
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, INT4_GROUP, self.scales).float().t()

    @staticmethod
    def fits(linear: torch.nn.Linear) -> bool:
        return linear.in_features % (INT4_GROUP * 2) == 0 and linear.out_features % 16 == 0


INT4_GROUP = 32
QUANT_ROWS = 4096  # rows quantized at once (a multiple of 64, the int4 kernel's widest row block)


def _joined(weights: list[torch.Tensor]) -> torch.Tensor:
    """float [N, K]: the weights one above the other (one weight: itself, not a copy)."""
    return weights[0].detach().float() if len(weights) == 1 else torch.cat([x.detach().float() for x in weights])


def _joined_bias(weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> torch.Tensor | None:
    """float [N] or None: the biases one after the other, zeros for a weight without one."""
    if all(b is None for b in biases):
        return None
    return torch.cat([torch.zeros(x.shape[0]) if b is None else b.detach().float() for x, b in zip(weights, biases)])


class QuantLinear(torch.nn.Module):
    """An nn.Linear with int8 or int4 weights, row-exact (see above): columns [start, stop) of a shared product."""

    def __init__(self, packed: SharedProduct, start: int, stop: int, in_features: int, last: bool):
        super().__init__()
        self.packed, self.start, self.stop, self.last = packed, start, stop, last
        self.in_features, self.out_features = in_features, stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = self.packed(flat, keep=not self.last)
        if (self.start, self.stop) != (0, y.shape[-1]):
            y = y[:, self.start:self.stop]
        return y.reshape(*x.shape[:-1], self.out_features)

    def float_weight(self) -> torch.Tensor:
        """float [out, in]: the int8 weight times its row scales (what a float gather of its rows reads)."""
        return self.packed.dequantized()[self.start:self.stop]

    def extra_repr(self) -> str:
        kind = (f"int4 weights in groups of {INT4_GROUP}, bfloat16 rows" if isinstance(self.packed, PackedInt4)
                else "int8 weights, row-exact int8 rows" if isinstance(self.packed, PackedInt8)
                else "int4 weights in groups of 32, row-exact int8 rows")
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


def fused(*layers: torch.nn.Module) -> SharedProduct | None:
    """The one packed product behind `layers` (q/k/v, or gate/up) when they share one, laid out in this order with
    nothing else in it; else None."""
    if not all(isinstance(m, QuantLinear) for m in layers):
        return None
    packed = layers[0].packed
    stops = [0] + [m.stop for m in layers]
    ok = all(m.packed is packed and m.start == a for m, a in zip(layers, stops))
    return packed if ok and stops[-1] == sum(m.out_features for m in layers) else None


QUANT_DTYPES = ("int8", "int4", "w4a8")  # w4a8: models/w4a8.py


def quantize_target(model: torch.nn.Module, dtype: str = "int8") -> torch.nn.Module:
    """Replace, in place, every nn.Linear of `model` (output layer included; the embedding stays float) by a
    QuantLinear with `dtype` weights ("int8"; "int4": layers whose shape torch's int4 kernel does not take stay
    int8; "w4a8": models/w4a8.py, layers whose values float16 scales cannot hold stay int8); q/k/v and gate/up
    siblings share one packed product. CPU and float32 only, refused in one line otherwise.
    Returns `model` (`weights_dtype(model)` then says `dtype`, read from its layers). A GGUF file is quantized as it
    is read instead (gguf_quant.py), to the same bits."""
    weight = model.get_input_embeddings().weight
    check_quantizable(dtype, weight.device, weight.dtype)
    head = model.get_output_embeddings()
    source_rows = head.weight[:32].detach().clone() if isinstance(head, torch.nn.Linear) else None
    quantize_linears(model, dtype)
    if source_rows is not None and isinstance(model.get_output_embeddings(), QuantLinear):
        model.get_output_embeddings().packed.first_rows = source_rows  # what the shipped head's key is read from
    return finish_target(model, dtype)


def check_quantizable(dtype: str, device: torch.device, weights: torch.dtype) -> None:
    """One line unless a model on `device` with `weights` float weights can be given `dtype` weights here."""
    check(dtype in QUANT_DTYPES, f"quantized dtype must be one of {', '.join(QUANT_DTYPES)}, got {dtype!r}")
    check(device.type == "cpu",
          f"{dtype} models run on CPU only (torch's {dtype} kernels); this one is on {device}; use --device cpu")
    check(weights == torch.float32, f"{dtype} weights are made from a float32 model, not {weights}")
    engines = torch.backends.quantized.supported_engines
    check(any(e in engines for e in ("x86", "fbgemm", "onednn")),
          f"this torch build has no int8 CPU kernels (quantized engines: {engines})")
    if dtype == "w4a8":
        from multispec.models.w4a8 import load_kernel

        load_kernel()  # built on first use: a missing compiler is refused here, before any layer changes


def finish_target(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """A model whose linears are quantized, made ready to decode: attention in float64 (see above), eval mode."""
    _attend_in_float64(model, dtype)
    return model.eval()


def quantize_linears(module: torch.nn.Module, dtype: str = "int8") -> torch.nn.Module:
    """Replace, in place, every nn.Linear under `module` by a QuantLinear (q/k/v and gate/up siblings sharing one
    packed product) with `dtype` weights. Returns `module`."""
    for parent, names, linears in linear_groups(module):
        install(parent, names, pack([m.weight for m in linears], [m.bias for m in linears], dtype,
                                    all(PackedInt4.fits(m) for m in linears)))
    return module


def linear_groups(module: torch.nn.Module) -> list[tuple[torch.nn.Module, list[str], list[torch.nn.Linear]]]:
    """(parent, child names, linears) for every nn.Linear under `module`, in the order quantize_linears replaces
    them: q/k/v and gate/up siblings reading the same input as one group, every other linear alone. Read from the
    modules alone (their weights may still be on the meta device)."""
    groups = []
    for parent in list(module.modules()):
        children = dict(parent.named_children())
        done: set[str] = set()
        for names in _FUSE:
            group = [children.get(n) for n in names]
            if all(isinstance(c, torch.nn.Linear) for c in group) and len({c.in_features for c in group}) == 1:
                groups.append((parent, list(names), group))
                done.update(names)
        for name, child in children.items():
            if name not in done and type(child) is torch.nn.Linear:
                groups.append((parent, [name], [child]))
    return groups


def pack(weights: list[torch.Tensor], biases: list[torch.Tensor | None], dtype: str, int4_fits: bool
         ) -> SharedProduct:
    """The packed product of a group's weights (and biases): int4 when asked for and the kernel takes the shape
    (int4_fits: PackedInt4.fits of each linear); w4a8 when asked for and float16 holds its group scales; else
    int8."""
    if dtype == "w4a8":
        from multispec.models.w4a8 import PackedW4A8

        if all(PackedW4A8.fits_weight(w) for w in weights):
            return PackedW4A8(weights, biases)
    return (PackedInt4 if dtype == "int4" and int4_fits else PackedInt8)(weights, biases)


def install(parent: torch.nn.Module, names: list[str], packed: SharedProduct) -> None:
    """Put QuantLinears over `packed` in place of `parent`'s children `names` (in that order, sharing it)."""
    start = 0
    for i, name in enumerate(names):
        old = getattr(parent, name)
        setattr(parent, name, QuantLinear(packed, start, start + old.out_features, old.in_features,
                                          i == len(names) - 1))
        start += old.out_features


ATTENTION_64 = "multispec_float64"  # the transformers attention implementation of an int8 model (over sdpa;
# over another implementation X: ATTENTION_64 + "_" + X, so the name itself says which one it wraps)


def _attend_in_float64(model: torch.nn.Module, dtype: str) -> None:
    """Route the model's transformers attention through ATTENTION_64: its own implementation (sdpa or the
    family's eager code), on float64 copies of q, k and v, the result rounded back."""
    from transformers import AttentionInterface

    base = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if not base.startswith(ATTENTION_64):
        name = ATTENTION_64 if base == "sdpa" else f"{ATTENTION_64}_{base}"
        AttentionInterface.register(name, functools.partial(_attention_64, base))
        try:
            model.set_attn_implementation(name)
        except (ValueError, AttributeError, NotImplementedError, TypeError) as e:
            first = (str(e).splitlines() or [""])[0][:160]
            raise MultispecError(f"{dtype} needs the model's attention routed through float64, which "
                                 f"{type(model).__name__} does not allow ({first}); use another dtype") from None


def _attention_64(base: str, module, query, key, value, attention_mask, **kwargs):
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    fn = (getattr(sys.modules[type(module).__module__], "eager_attention_forward") if base == "eager"
          else ALL_ATTENTION_FUNCTIONS[base])
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.double()
    out, weights = fn(module, query.double(), key.double(), value.double(), attention_mask, **kwargs)
    return out.to(query.dtype), weights


def attends_in_float64(model: torch.nn.Module) -> bool:
    """Whether the fast backend must attend in float64 for this model (an int8 or int4 model, see above)."""
    return weights_dtype(model) in QUANT_DTYPES


def first_rows(module: torch.nn.Module, n: int) -> torch.Tensor:
    """float [n, in]: the first rows of an output layer as it was before quantize_target (a head's fingerprint)."""
    if isinstance(module, QuantLinear) and module.start == 0 and module.packed.first_rows is not None:
        return module.packed.first_rows[:n]
    return float_weight(module)[:n]


def weights_dtype(model: torch.nn.Module) -> str:
    """"int8", "int4" or "w4a8" for a model from quantize_target (read from its layers: "int4" / "w4a8" where any
    holds such weights), else its parameters' dtype ("float32", "bfloat16", ...). A pair records what it asked for in the
    model's sidecar (models/sidecar.py)."""
    packs = {type(m.packed) for m in model.modules() if isinstance(m, QuantLinear)}
    if packs:
        names = {p.__name__ for p in packs}
        return "int4" if PackedInt4 in packs else "w4a8" if "PackedW4A8" in names else "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")
