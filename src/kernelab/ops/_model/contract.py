"""What an op must cost and how close it must be: the cost model and the numerical contract."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

#: Per-dtype floor of the relative L2 tolerance (METHOD.md: derived tolerance, small floor).
DEFAULT_FLOORS: Mapping[str, float] = {
    "float64": 1e-12,
    "float32": 1e-6,
    "float16": 2e-3,
    "bfloat16": 1e-2,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Cost:
    """Work an op must do: FLOPs, and the minimum bytes that must cross device memory."""

    flops: float
    bytes: float

    def floor_seconds(self, peak_flops: float | None, bandwidth: float) -> float:
        """Speed-of-light time: the larger of compute time and memory time."""
        t_mem = self.bytes / bandwidth if bandwidth else 0.0
        t_flop = self.flops / peak_flops if peak_flops else 0.0
        return max(t_mem, t_flop)

    def bound(self, peak_flops: float | None, bandwidth: float) -> str:
        t_mem = self.bytes / bandwidth if bandwidth else 0.0
        t_flop = self.flops / peak_flops if peak_flops else 0.0
        return "compute" if t_flop > t_mem else "memory"


@dataclass(frozen=True)
class Contract:
    """How close to the float64 reference a variant must be (METHOD.md, "Correct first").

    The tolerance on relative L2 error is ``max(k × eager-torch error, floor[dtype])`` unless
    ``tolerance`` fixes it per dtype. ``inplace`` lists arguments the op writes.
    """

    k: float = 2.0
    floors: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_FLOORS))
    tolerance: Mapping[str, float] | None = None
    inplace: tuple[str, ...] = ()
    nondeterministic: bool = False
    #: Inputs that may carry NaN and ±Inf when a check plants special values (None: any
    #: floating-point input). Prepared parameters such as quantization scales are never
    #: infinite in use, and an infinite scale is not a case an op must reproduce.
    special_inputs: tuple[str, ...] | None = None

    def floor(self, dtype: torch.dtype) -> float:
        return self.floors.get(dtype_name(dtype), 1e-6)

    def tolerance_for(self, dtype: torch.dtype, eager_error: float | None) -> tuple[float, str]:
        """The tolerance and a few words on where it came from."""
        name = dtype_name(dtype)
        if self.tolerance is not None and name in self.tolerance:
            return self.tolerance[name], "contract"
        floor = self.floor(dtype)
        if eager_error is None:
            return floor, "floor"
        derived = self.k * eager_error
        if derived >= floor:
            return derived, f"{self.k:g}x eager torch"
        return floor, "floor"
