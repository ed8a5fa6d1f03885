"""Small helpers shared by the launchers and launch declarations of the row-wise op families."""

from __future__ import annotations

import torch

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


def specialised(ints: dict[str, int], pointers: tuple[str, ...]) -> tuple[tuple, tuple]:
    """(divisible_16, equal_1) as Triton specialises arguments at run time: 16-byte aligned
    pointers (every allocation and every view here starts aligned) and integer arguments that
    are multiples of 16 or equal to 1."""
    div16 = (*pointers, *(k for k, v in ints.items() if v % 16 == 0))
    eq1 = tuple(k for k, v in ints.items() if v == 1)
    return div16, eq1
