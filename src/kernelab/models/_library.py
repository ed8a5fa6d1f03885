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

    @torch.library.custom_op("kernelab::rope", mutates_args=("query", "key"))
    def rope(
        positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> None:
        ops.rope(positions, query, key, cos_sin_cache)

    @rope.register_fake
    def _(positions, query, key, cos_sin_cache):
        return None

    @torch.library.custom_op("kernelab::silu_and_mul", mutates_args=())
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x)

    @silu_and_mul.register_fake
    def _(x):
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))

    return {
        "rmsnorm": rmsnorm,
        "rmsnorm_residual": rmsnorm_residual,
        "rope": rope,
        "silu_and_mul": silu_and_mul,
    }


def rmsnorm(x, weight, eps, residual=None):
    """``ops.rmsnorm``, through the custom op for device tensors."""
    if x.device.type == "cpu":
        return ops.rmsnorm(x, weight, eps, residual=residual)
    lib = _registered()
    if residual is None:
        return lib["rmsnorm"](x, weight, float(eps))
    return lib["rmsnorm_residual"](x, weight, float(eps), residual)


def rope(positions, query, key, cos_sin_cache):
    """``ops.rope`` in place, through the custom op for device tensors."""
    if query.device.type == "cpu":
        ops.rope(positions, query, key, cos_sin_cache)
    else:
        _registered()["rope"](positions, query, key, cos_sin_cache)


def silu_and_mul(x):
    if x.device.type == "cpu":
        return ops.silu_and_mul(x)
    return _registered()["silu_and_mul"](x)
