"""Error metrics shared by every instrument: relative L2, max absolute and relative error.

All metrics are computed in float64 on the CPU, on the elements where both tensors are finite;
special values (NaN, Inf) are compared by pattern separately (see ``special_mismatch``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Error:
    rel_l2: float
    max_abs: float
    max_rel: float
    worst_index: tuple[int, ...] | None  # where |out - ref| is largest
    worst_out: float | None
    worst_ref: float | None

    def as_dict(self) -> dict:
        return {
            "rel_l2": self.rel_l2,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "worst_index": None if self.worst_index is None else list(self.worst_index),
            "worst_out": self.worst_out,
            "worst_ref": self.worst_ref,
        }


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements reinterpreted as integers of the same width, for bitwise comparison
    (NaN equal to the same NaN, -0.0 unequal to 0.0)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_complex():
        return torch.view_as_real(t).view(_BITS[t.element_size() // 2])
    return t.view(_BITS[t.element_size()])


def as_f64(t: torch.Tensor) -> torch.Tensor:
    """A float64 CPU copy of ``t`` (fp8 and integer tensors are converted by value)."""
    return t.detach().to(device="cpu").to(torch.float64)


def error(out: torch.Tensor, ref: torch.Tensor) -> Error:
    """Relative L2 error ‖out − ref‖ / ‖ref‖ plus max errors and the worst element.

    Shapes must match. Non-finite elements of either side are left out of the metrics; compare
    their pattern with ``special_mismatch``. If ‖ref‖ is 0, the relative error is ‖out‖ (0 when
    both are zero, so an all-zero reference is matched only by an all-zero output).
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out: expected shape {tuple(ref.shape)}, got {tuple(out.shape)}")
    o, r = as_f64(out), as_f64(ref)
    finite = torch.isfinite(o) & torch.isfinite(r)
    diff = torch.where(finite, o - r, torch.zeros((), dtype=torch.float64))
    rf = torch.where(finite, r, torch.zeros((), dtype=torch.float64))
    if o.numel() == 0:
        return Error(0.0, 0.0, 0.0, None, None, None)
    num = torch.linalg.vector_norm(diff).item()
    den = torch.linalg.vector_norm(rf).item()
    rel = num / den if den > 0 else num
    absd = diff.abs()
    flat = int(torch.argmax(absd).item())
    # numpy's, not torch.unravel_index: that one imports sympy on its first call (0.3-0.5 s
    # CPU at the start of a process)
    idx = tuple(int(i) for i in np.unravel_index(flat, tuple(o.shape)))
    max_abs = absd.reshape(-1)[flat].item()
    denom = rf.abs().clamp_min(torch.finfo(torch.float64).tiny)
    max_rel = (absd / denom).max().item()
    return Error(rel, max_abs, max_rel, idx, o.reshape(-1)[flat].item(), r.reshape(-1)[flat].item())


def special_mismatch(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Boolean mask of elements whose NaN / +Inf / −Inf status differs between out and ref."""
    o, r = as_f64(out), as_f64(ref)
    return (
        (torch.isnan(o) != torch.isnan(r))
        | (torch.isposinf(o) != torch.isposinf(r))
        | (torch.isneginf(o) != torch.isneginf(r))
    )
