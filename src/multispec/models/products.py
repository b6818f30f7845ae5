"""The product a quantized linear layer runs (models/int8.py's QuantLinear): `SharedProduct`, a packed weight whose
result siblings reading the same input (q/k/v, gate/up) share. Its own module so that every kind of product
(int8.py's PackedInt8 and PackedInt4, w4a8.py's PackedW4A8) builds on it without importing the others."""
from __future__ import annotations

import torch


class SharedProduct:
    """A packed weight [N, K] (`apply`: float [M, K] -> float [M, N], row-exact) and the last input it was applied
    to, so that siblings reading the same tensor (q/k/v, gate/up) share one product: their outputs are column ranges
    of it. Subclasses: int8.PackedInt8, int8.PackedInt4, w4a8.PackedW4A8."""

    _last: tuple | None = None  # (input, output, input's version) for the next sibling
    bias: torch.Tensor | None = None
    first_rows: torch.Tensor | None = None  # the output layer's source rows (eagle_io.fingerprint): quantize_target

    def __call__(self, x: torch.Tensor, keep: bool) -> torch.Tensor:
        """float [M, K] -> float [M, N] by `apply`, or the result already held for this very input.
        keep: hold the result for a sibling's call on the same tensor (the last sibling passes False and drops it).
        The input is held with it, so its memory cannot be reused by another tensor while the result is kept."""
        last = self._last
        y = last[1] if last is not None and _same_tensor(last[0], last[2], x) else self.apply(x)
        self._last = (x, y, _version(x)) if keep else None
        return y

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantized(self) -> torch.Tensor:
        raise NotImplementedError


def _version(x: torch.Tensor) -> int:
    """x's version counter; -1 for an inference-mode tensor, which keeps none (no code between sibling projections
    writes their input in place)."""
    return -1 if x.is_inference() else x._version


def _same_tensor(a: torch.Tensor, version: int, b: torch.Tensor) -> bool:
    """b views the memory of a (held, so not reused) with the same shape and strides, unwritten since a was seen
    at `version`."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and _version(b) == version)
