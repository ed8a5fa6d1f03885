"""What static analysis compiles: one kernel launch an op would make for a shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Launch:
    """One kernel launch an op would make for a shape: what static analysis compiles.

    ``signature`` maps every kernel argument to its Triton type ("*bf16", "i32", "i64", "fp32",
    or "constexpr"); ``constexprs`` gives the constexpr values. ``divisible_16`` lists the
    arguments Triton would specialise as 16-divisible at run time (16-byte aligned pointers,
    sizes and strides divisible by 16); ``equal_1`` those it would specialise as the constant 1.
    ``backend`` names the adapter that compiles it (``kernelab.core.runtime.backends``).
    """

    kernel: Any
    signature: Mapping[str, str]
    constexprs: Mapping[str, Any]
    num_warps: int
    num_stages: int
    grid: tuple[int, ...]
    divisible_16: tuple[str, ...] = ()
    equal_1: tuple[str, ...] = ()
    config: Any = None
    backend: str = "triton"

    @property
    def name(self) -> str:
        return getattr(self.kernel, "__name__", None) or self.kernel.fn.__name__
