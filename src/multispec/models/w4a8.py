"""Row-exact W4A8 products on CPU (`--dtype w4a8`): 4-bit weights, 8-bit rows, a C++ kernel built on first use.

torch's CPU int4 kernel (PackedInt4) is compute-bound here (~4 GB/s of weights at one row, and linear in the rows)
and its int8 one (PackedInt8, fbgemm) quantizes rows to 7 bits without VNNI. This product reads 0.625 bytes per
weight near the memory bandwidth at one row and shares each weight's unpacking across the rows of the call; past
two rows AVX2 without VNNI is compute-bound (the 1.5B's products: 45 / 62 / 104 / 371 ms at 1 / 2 / 4 / 16 rows,
int8 76 / 89 / 118 / 362: benchmarks/results/quantized/w4a8_kernels.json).

Arithmetic (models/w4a8.cpp):
- Weights in groups of W4A8_GROUP along K, asymmetric like PackedInt4 and llama.cpp's Q4_1 / Q4_K: w = q * s + o,
  q in 0..15, s and o per group in float16 (q is rounded against the float16 s and o). Asymmetric, because the
  4-bit GGUF files this serves are themselves asymmetric groups of 32 (Q4_1; Q4_K's sub-blocks): where a group
  uses its extreme levels, requantizing reproduces the file's values up to float16 (SmolLM2's Q4_1 weights: relative
  squared error 0.0009, against 0.008-0.011 for symmetric groups, (q - 8) * s).
- Rows quantized to int8 in [-127, 127] group by group, each group of each row by its own max |x| (as llama.cpp's
  Q8_0 rows): a row's result never depends on the other rows, and one outlier coarsens 32 values, not a row.
- Per group the products q * xq are summed exactly in int32 (AVX2 maddubs u8 x s8: each int16 lane sums 16
  products of at most 15 * 127, 30480 < 32767, so full 8-bit rows cannot saturate), then
  acc = fma(dot, s * xs, acc); acc = fma(o, xs * sum(xq), acc) over the groups in order, y = acc (+ bias).
  Every row runs those operations whatever M is; threads split the outputs, never a sum. The plain C++ loop
  (a CPU without AVX2/FMA/F16C) does the same integer sums and float operations, so the same bits.
The model attends in float64 as the int8 and int4 models do (models/int8.py: "int8 targets").

Built once per source, torch and compiler into cache_root()/kernels/<hash>/ with the system C++ compiler (no
ninja), under a temporary name renamed when whole; no compiler is refused in one line when the kernel is first needed.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

from multispec.errors import MultispecError, check
from multispec.models.products import SharedProduct

W4A8_GROUP = 32
LAYOUT = "w4a8 v1: blocks of 8 outputs x 32 inputs, nibbles then float16 scales and offsets"  # `pack`'s; cached
_OUT = 8  # outputs per block (the kernel's layout)
_SOURCE = Path(__file__).with_name("w4a8.cpp")
_AVX2_FLAGS = ("avx2", "fma", "f16c")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _compile_command(cxx: str, source: Path, out: Path, avx2: bool) -> list[str]:
    root = Path(torch.__file__).parent
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    flags = ["-mavx2", "-mfma", "-mf16c"] if avx2 else []
    openmp = ["-fopenmp"] if torch.backends.openmp.is_available() else []
    return [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", *flags, *openmp,
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I", str(root / "include"),
            "-I", str(root / "include" / "torch" / "csrc" / "api" / "include"),
            "-I", sysconfig.get_paths()["include"], str(source), "-o", str(out),
            "-L", str(root / "lib"), "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{root / 'lib'}"]


def _kernel_dir(cxx: str, avx2: bool) -> Path:
    from multispec.paths import cache_root

    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    key = hashlib.sha256(b"\0".join([_SOURCE.read_bytes(), torch.__version__.encode(), version.encode(),
                                     str(avx2).encode(), sys.platform.encode()])).hexdigest()[:16]
    return cache_root() / "kernels" / f"w4a8-{key}"


@functools.cache
def load_kernel() -> object:
    """torch.ops.multispec_w4a8, compiled on first use (seconds to a minute) and cached; MultispecError in one line
    where it cannot be built."""
    if hasattr(torch.ops, "multispec_w4a8") and hasattr(torch.ops.multispec_w4a8, "linear"):
        return torch.ops.multispec_w4a8
    cxx = _compiler()
    check(cxx is not None, "w4a8 needs a C++ compiler to build its kernel once (none found: install g++ or set CXX); "
                           "use dtype int8 or int4")
    assert cxx is not None
    avx2 = all(f in _cpu_flags() for f in _AVX2_FLAGS)
    lib = build(_kernel_dir(cxx, avx2), cxx, avx2)
    try:
        torch.ops.load_library(str(lib))
    except (OSError, RuntimeError) as e:
        first = (str(e).splitlines() or [""])[0][:200]
        raise MultispecError(f"w4a8: cannot load its kernel {lib} ({first}); delete the folder to rebuild it") from None
    return torch.ops.multispec_w4a8


def build(folder: Path, cxx: str, avx2: bool) -> Path:
    """folder/w4a8.so, compiled unless there: under a temporary name, renamed when whole (a killed build leaves no
    half library behind). MultispecError in one line when the compiler cannot be run or fails."""
    lib = folder / "w4a8.so"
    if lib.exists():
        return lib
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so.part", dir=folder)
        os.close(fd)
    except OSError as e:
        raise MultispecError(f"w4a8: cannot write its kernel to {folder} ({e.strerror or e})") from None
    print(f"multispec: building the w4a8 kernel once into {folder} ...", file=sys.stderr)
    try:
        run = subprocess.run(_compile_command(cxx, _SOURCE, Path(tmp), avx2), capture_output=True, text=True,
                             timeout=900)
        if run.returncode != 0:
            lines = [x for x in run.stderr.splitlines() if "error" in x] or run.stderr.splitlines() or [""]
            raise MultispecError(f"w4a8: the kernel did not compile with {cxx}: {lines[0].strip()[:200]}; "
                                 "use dtype int8 or int4")
        os.replace(tmp, lib)
    except (OSError, subprocess.SubprocessError) as e:
        raise MultispecError(f"w4a8: could not run the compiler {cxx} ({e}); use dtype int8 or int4") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def quantize_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float [N, K] -> (q uint8 [Np, Kp] in 0..15, scales and offsets float16 [Np, Kp / 32]), padded with zeros to
    whole blocks (Np a multiple of 8, Kp of 32). w ~ q * s + o per group."""
    n, k = w.shape
    np_, kp = -(-n // _OUT) * _OUT, -(-k // W4A8_GROUP) * W4A8_GROUP
    w = torch.nn.functional.pad(w.float(), (0, kp - k, 0, np_ - n))
    wg = w.reshape(np_, kp // W4A8_GROUP, W4A8_GROUP)
    low, high = wg.amin(-1), wg.amax(-1)
    scale = ((high - low) / 15).to(torch.float16)
    offset = low.to(torch.float16)
    s = scale.float().unsqueeze(-1)
    q = torch.where(s > 0, torch.round((wg - offset.float().unsqueeze(-1)) / s.clamp_min(1e-30)), 0.0)
    return q.clamp(0, 15).to(torch.uint8).reshape(np_, kp), scale, offset


def pack(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The kernel's layout (models/w4a8.cpp): uint8 [Np / 8, Kp / 32, 160]."""
    np_, kp = q.shape
    nb, groups = np_ // _OUT, kp // W4A8_GROUP
    # k = 32 g + 8 c + 4 h + j  ->  [block, group, chunk c, half h, output o, j]
    t = q.reshape(nb, _OUT, groups, 4, 2, 4).permute(0, 2, 3, 4, 1, 5)
    nibbles = (t[:, :, :, 0] | (t[:, :, :, 1] << 4)).reshape(nb, groups, 128)
    s = scale.reshape(nb, _OUT, groups).transpose(1, 2).contiguous().view(torch.uint8)  # [nb, groups, 16]
    o = offset.reshape(nb, _OUT, groups).transpose(1, 2).contiguous().view(torch.uint8)
    return torch.cat([nibbles, s, o], -1).contiguous()


def unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack's inverse: (q [Np, Kp], scales, offsets [Np, Kp / 32])."""
    nb, groups, _ = packed.shape
    t = packed[..., :128].reshape(nb, groups, 4, _OUT, 4)
    t = torch.stack([t & 15, t >> 4], 3)  # [nb, groups, c, h, o, j]
    q = t.permute(0, 4, 1, 2, 3, 5).reshape(nb * _OUT, groups * W4A8_GROUP)
    s = packed[..., 128:144].contiguous().view(torch.float16).transpose(1, 2).reshape(nb * _OUT, groups)
    o = packed[..., 144:].contiguous().view(torch.float16).transpose(1, 2).reshape(nb * _OUT, groups)
    return q, s, o


class PackedW4A8(SharedProduct):
    """4-bit weights in groups of 32 along K (scale and offset per group), rows quantized to int8 in groups of 32
    (each by its own max |x|), int32 sums per group (see above). Row-exact."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None]):
        load_kernel()  # built (or refused in one line) before any weight is packed
        w = torch.cat([x.detach().float() for x in weights])  # [N, K]
        self.shape = tuple(w.shape)
        self.packed = pack(*quantize_weights(w))
        self.bias = None if all(b is None for b in biases) else torch.cat(
            [torch.zeros(x.shape[0]) if b is None else b.detach().float() for x, b in zip(weights, biases)])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """float [M, K] -> float [M, N], no sharing (the fast backend calls this directly)."""
        # the op namespace is looked up per call (cached), not held: a product must deepcopy and pickle
        return load_kernel().linear(x.float(), self.packed, self.shape[0], self.bias)

    def dequantized(self) -> torch.Tensor:
        q, s, o = unpack(self.packed)
        w = q.float().reshape(q.shape[0], -1, W4A8_GROUP) * s.float()[..., None] + o.float()[..., None]
        return w.reshape(q.shape)[:self.shape[0], :self.shape[1]]

    def state(self, meta: bool = False) -> dict[str, torch.Tensor]:
        """What rebuilds this product (`from_state`): the packed weights with their group scales and offsets (the
        kernel's layout, the same on every CPU), the shape, the bias."""
        out = {"packed": self.packed, "shape": torch.tensor(self.shape)}
        return out if self.bias is None else {**out, "bias": self.bias}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> PackedW4A8:
        product = cls.__new__(cls)
        load_kernel()
        product.packed, product.bias = state["packed"], state.get("bias")
        n, k = (int(v) for v in state["shape"])
        product.shape = (n, k)
        return product

    @staticmethod
    def fits(linear: torch.nn.Linear) -> bool:
        """Whether float16 holds the layer's group scales and offsets (any shape is padded to whole blocks)."""
        return PackedW4A8.fits_weight(linear.weight)

    @staticmethod
    def fits_weight(weight: torch.Tensor) -> bool:
        w = weight.detach()
        return bool(w.isfinite().all()) and float(w.abs().max()) < 30000.0
