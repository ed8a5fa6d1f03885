"""Argument checks for launchers: each error names the argument, what was given and expected."""

from __future__ import annotations

from collections.abc import Iterable

import torch

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def tensor(
    name: str,
    t,
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    ndim: int | None = None,
    min_ndim: int | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check that ``t`` is a tensor with the given properties; raise naming ``name`` otherwise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            raise TypeError(
                f"{name}: expected dtype in ({_names(dtypes)}), "
                f"got {str(t.dtype).removeprefix('torch.')}"
            )
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(
            f"{name}: expected at least {min_ndim} dimension(s), got shape {tuple(t.shape)}"
        )
    if device is not None and t.device != device:
        raise ValueError(
            f"{name}: expected a tensor on {device} (like the first input), got one on {t.device}"
        )
    return t


def same_shape(name: str, t: torch.Tensor, shape, what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)} ({what}), got {tuple(t.shape)}")


def positive(name: str, value, kind=float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: expected a positive {kind.__name__}, got {value!r}")


def boolean(name: str, value) -> bool:
    """``value`` if it is a bool (not merely truthy: 1, "no" and None are refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value
