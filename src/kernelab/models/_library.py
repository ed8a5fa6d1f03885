"""kernelab ops as torch custom ops, so torch.compile treats each kernel as one opaque node.

Registered on first use (never at import). Only device tensors go through them: on the CPU the
public ops run plain torch code, which torch.compile traces as it is.
"""

from __future__ import annotations

import functools

import torch

from kernelab import ops


@functools.cache
def _registered():
    @torch.library.custom_op("kernelab::rmsnorm", mutates_args=())
    def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return ops.rmsnorm(x, weight, eps)

    @rmsnorm.register_fake
    def _(x, weight, eps):
        return torch.empty_like(x)

    @torch.library.custom_op("kernelab::rmsnorm_residual", mutates_args=("residual",))
    def rmsnorm_residual(
        x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
    ) -> torch.Tensor:
        return ops.rmsnorm(x, weight, eps, residual=residual)

    @rmsnorm_residual.register_fake
    def _(x, weight, eps, residual):
        return torch.empty_like(x)

    return {"rmsnorm": rmsnorm, "rmsnorm_residual": rmsnorm_residual}


def rmsnorm(x, weight, eps, residual=None):
    """``ops.rmsnorm``, through the custom op for device tensors."""
    if x.device.type == "cpu":
        return ops.rmsnorm(x, weight, eps, residual=residual)
    lib = _registered()
    if residual is None:
        return lib["rmsnorm"](x, weight, float(eps))
    return lib["rmsnorm_residual"](x, weight, float(eps), residual)
