"""Argument checks for launchers: each error names the argument, what was given and expected.

Scalars that reach a kernel's address arithmetic or its numerics are checked for their type
first (a TypeError: ``64.0`` is not a group size, ``True`` is not a count) and then for their
value (a ValueError: ``eps=inf`` would turn every row into zeros).
"""

from __future__ import annotations

import math
import numbers
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


def integer(name: str, value, *, min_value: int | None = None) -> int:
    """``value`` as an int if it is an integer (Python's or numpy's); a bool or a float, even
    a whole one such as 64.0, is a TypeError. ``min_value``: the smallest one accepted."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if min_value is not None and value < min_value:
        raise ValueError(f"{name}: expected an int >= {min_value}, got {value}")
    return value


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} {value!r}")
    return float(value)


def finite(name: str, value) -> float:
    """``value`` as a float if it is a real number (not a bool) that is neither NaN nor
    infinite."""
    x = _real(name, value)
    if not math.isfinite(x):
        raise ValueError(f"{name}: expected a finite float, got {value!r}")
    return x


def finite_positive(name: str, value) -> float:
    """``value`` as a float if it is a real number (not a bool), finite and above zero."""
    x = _real(name, value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name}: expected a finite positive float, got {value!r}")
    return x


def boolean(name: str, value) -> bool:
    """``value`` if it is a bool (not merely truthy: 1, "no" and None are refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value
