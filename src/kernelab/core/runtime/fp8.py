"""Float8 conventions shared by the ops that quantize (fp8_quant, rmsnorm_fp8_quant).

    scale = max(max|x| / FP8_MAX, MIN_SCALE);  values = fp8(clamp(x / scale, ±FP8_MAX))

FP8_MAX is 448 for float8_e4m3fn (NVIDIA) and 240 for float8_e4m3fnuz (AMD gfx942).
"""

from __future__ import annotations

import torch

#: The e4m3 formats this torch has: the OCP one first (NVIDIA), then AMD's fnuz.
FP8_DTYPES = tuple(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, name)
)

#: Smallest scale a quantized row gets (the smallest normal float32): an all-zero row has this
#: finite, non-zero scale, and its reciprocal is finite too.
MIN_SCALE = float(torch.finfo(torch.float32).tiny)

#: A shape's ``fp8`` parameter → the dtype it names.
BY_NAME = {str(d).removeprefix("torch.float8_"): d for d in FP8_DTYPES}


def amax(x: torch.Tensor, per_token: bool) -> torch.Tensor:
    """max|x| per row (shape (..., 1)) or over the tensor (shape (1,)); 0 over nothing."""
    a = x.abs()
    if per_token:
        return a.amax(dim=-1, keepdim=True) if x.shape[-1] else a.new_zeros((*x.shape[:-1], 1))
    return a.amax().reshape(1) if x.numel() else a.new_zeros(1)


def check_dtype(name: str, fp8_dtype) -> None:
    if fp8_dtype not in FP8_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in FP8_DTYPES)
        raise TypeError(f"{name}: expected one of ({names}), got {fp8_dtype!r}")


def of_shape(shape) -> torch.dtype:
    """The float8 dtype a shape asks for (its ``fp8`` parameter; e4m3fn by default)."""
    return BY_NAME[shape.params.get("fp8", "e4m3fn")]
