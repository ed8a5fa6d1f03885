"""What every family's launchers share: shape helpers, the row-wise launch config, and
:class:`KernelCall` / :class:`LaunchPlan`, through which a kernel's arguments are bound once."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernelab.core.launch import Launch
from kernelab.core.runtime.triton import next_pow2, num_sms

#: Triton's names for the element types of pointer arguments.
TL = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.int8: "i8",
}
if hasattr(torch, "float8_e4m3fn"):
    TL[torch.float8_e4m3fn] = "fp8e4nv"
if hasattr(torch, "float8_e4m3fnuz"):
    TL[torch.float8_e4m3fnuz] = "fp8e4b8"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shrink_to_fill(
    extents: tuple[int, ...],
    blocks: tuple[int, ...],
    min_tile: int,
    device: torch.device | None = None,
    unit: int = 1,
) -> tuple[int, ...]:
    """Decode-sized work: halve the tile's blocks, the first one first, until the grid has two
    programs per SM or a tile (``unit`` elements per block cell) is down to ``min_tile``."""
    blocks = list(blocks)
    target = 2 * num_sms(device)

    def programs() -> int:
        return math.prod(cdiv(e, b) for e, b in zip(extents, blocks, strict=True))

    while math.prod(blocks) * unit > min_tile and programs() < target:
        i = next((i for i, b in enumerate(blocks) if b > 1), None)
        if i is None:
            break
        blocks[i] //= 2
    return tuple(blocks)


def rows(t: torch.Tensor) -> torch.Tensor:
    """A 2-D view (rows, cols) with unit column stride; a copy only if no such view exists."""
    t2 = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    if t2.shape[-1] > 1 and t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2


def write_back(view: torch.Tensor, target: torch.Tensor) -> None:
    """Copy a 2-D working ``view`` into ``target`` when it had to be a copy of ``target``."""
    if view.data_ptr() != target.data_ptr():
        target.copy_(view.view(target.shape))


@dataclass(frozen=True)
class RowConfig:
    """Launch config of the row-wise kernels (norms, softmax): ``block_m`` rows of ``block_n``
    columns per program; a row wider than ``MAX_SINGLE_PASS`` loops in blocks of ``LOOP_BLOCK``."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1

    #: Widest row kept in registers in one pass; wider rows loop.
    MAX_SINGLE_PASS = 16384
    #: Block width when looping over a long row.
    LOOP_BLOCK = 4096
    #: Elements a program should hold when several short rows share it (8 KB of bf16).
    TILE_ELEMENTS = 4096

    @classmethod
    def default_for(cls, n_rows: int, n_cols: int, device: torch.device | None = None):
        block_n = next_pow2(n_cols) if n_cols <= cls.MAX_SINGLE_PASS else cls.LOOP_BLOCK
        # Several short rows per program, but never so many that the grid under-fills the GPU
        # (at least two programs per SM while rows allow).
        block_m = 1
        if block_n < cls.TILE_ELEMENTS:
            block_m = cls.TILE_ELEMENTS // block_n
            per_sm = max(1, n_rows // (2 * num_sms(device)))
            block_m = max(1, min(block_m, 1 << (per_sm.bit_length() - 1)))
        # About 8-16 values per thread: one or two 128-bit vectors of 16-bit data.
        num_warps = min(16, max(1, block_m * block_n // 512))
        return cls(block_m, block_n, num_warps)

    @classmethod
    def tuning_space(cls, n_cols: int) -> list[RowConfig]:
        widths = [next_pow2(n_cols)] if n_cols <= cls.MAX_SINGLE_PASS else [2048, 4096, 8192]
        space = [cls(m, n, w) for n in widths for m in (1, 2, 4, 8, 16) for w in (1, 2, 4, 8, 16)]

        def keep(c: RowConfig) -> bool:
            per_thread = c.block_m * c.block_n // (32 * c.num_warps)
            return 4 <= per_thread <= 64 and c.block_m * c.block_n <= cls.MAX_SINGLE_PASS

        return [c for c in space if keep(c)] or [cls.default_for(1, n_cols)]


# --- one kernel launch, its arguments bound once -----------------------------------------------


@dataclass(frozen=True)
class KernelCall:
    """One launch of a Triton kernel with its arguments bound by name.

    A family's ``plan`` function builds these from tensors (real ones in the launcher, meta
    tensors for static analysis), so a kernel's argument list is written only in the kernel:
    :meth:`run` orders the values by the kernel's own argument names, and :meth:`describe`
    derives the inspect :class:`~kernelab.core.Launch` (types, specialisations,
    constexprs) from the same values, as Triton's JIT would see them.
    """

    kernel: Any
    grid: tuple[int, ...]
    args: Mapping[str, Any]
    num_warps: int
    num_stages: int = 1
    config: Any = None

    def __post_init__(self):
        names = _arg_names(self.kernel)
        missing = [n for n in names if n not in self.args]
        extra = [n for n in self.args if n not in names]
        if missing or extra:
            raise TypeError(
                f"{_kernel_name(self.kernel)}: arguments do not match the kernel's "
                f"(missing {missing}, unknown {extra})"
            )

    def run(self) -> None:
        """Launch the kernel (natively, or through the interpreter for CPU tensors)."""
        const = _constexpr_names(self.kernel)
        names = _arg_names(self.kernel)
        self.kernel[self.grid](
            *(self.args[n] for n in names if n not in const),
            **{n: self.args[n] for n in names if n in const},
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )

    def describe(self) -> Launch:
        """The launch as static analysis compiles it: Triton types from the bound values, and
        the arguments Triton would specialise (16-byte aligned pointers, integers divisible by
        16, integers equal to 1)."""
        const = _constexpr_names(self.kernel)
        unspecialised = _unspecialised(self.kernel)
        signature, constexprs, div16, eq1 = {}, {}, [], []
        for name in _arg_names(self.kernel):
            value = self.args[name]
            if name in const:
                signature[name] = "constexpr"
                constexprs[name] = value
                continue
            signature[name] = triton_type(name, value)
            if name in unspecialised or _descriptor(value):
                continue  # a descriptor is not a pointer: never specialised as aligned
            if isinstance(value, torch.Tensor):
                if value.data_ptr() % 16 == 0:
                    div16.append(name)
            elif isinstance(value, int) and not isinstance(value, bool):
                if value == 1:
                    eq1.append(name)
                elif value % 16 == 0:
                    div16.append(name)
        return Launch(
            self.kernel,
            signature,
            constexprs,
            self.num_warps,
            self.num_stages,
            tuple(self.grid),
            divisible_16=tuple(div16),
            equal_1=tuple(eq1),
            config=self.config,
        )


def _descriptor(value) -> bool:
    """A TMA tensor descriptor (``triton.tools.tensor_descriptor.TensorDescriptor``)."""
    return isinstance(getattr(value, "base", None), torch.Tensor) and hasattr(value, "block_shape")


def triton_type(name: str, value) -> str:
    """Triton's type for a runtime argument value, as its JIT mangles it (a TMA descriptor as
    ``tensordesc<bf16[128, 64]>``)."""
    if _descriptor(value):
        shape = ", ".join(map(str, value.block_shape))
        return f"tensordesc<{triton_type(name, value.base).lstrip('*')}[{shape}]>"
    if isinstance(value, torch.Tensor):
        if value.dtype not in TL:
            raise TypeError(f"{name}: no Triton type for a tensor of {value.dtype}")
        return f"*{TL[value.dtype]}"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return "i32"
        return "u64" if value >= 2**63 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"{name}: expected a tensor, int, float or bool, got {type(value).__name__}")


@dataclass(frozen=True)
class LaunchPlan:
    """What a launcher does for its inputs: kernel calls in order, then copies of working views
    back into the tensors they stand for (``write_back``), then ``result`` is returned."""

    calls: tuple[KernelCall, ...] = ()
    result: Any = None
    write_backs: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()

    def run(self):
        for c in self.calls:
            c.run()
        for view, target in self.write_backs:
            write_back(view, target)
        return self.result

    def describe(self) -> list[Launch]:
        return [c.describe() for c in self.calls]


def _jit(kernel):
    seen = 0
    while not hasattr(kernel, "arg_names") and hasattr(kernel, "fn") and seen < 8:
        kernel, seen = kernel.fn, seen + 1
    return kernel


def _arg_names(kernel) -> tuple[str, ...]:
    return tuple(_jit(kernel).arg_names)


def _kernel_name(kernel) -> str:
    return getattr(_jit(kernel), "__name__", None) or _jit(kernel).fn.__name__


def _constexpr_names(kernel) -> frozenset[str]:
    return frozenset(p.name for p in _jit(kernel).params if p.is_constexpr)


def _unspecialised(kernel) -> frozenset[str]:
    jit = _jit(kernel)
    idx = set(getattr(jit, "do_not_specialize", ()) or ())
    return frozenset(p.name for i, p in enumerate(jit.params) if i in idx or p.name in idx)
