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

    @torch.library.custom_op("kernelab::gemm", mutates_args=())
    def gemm(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return ops.gemm(a, weight, bias, b_layout="nk")

    @gemm.register_fake
    def _(a, weight, bias):
        return a.new_empty((a.shape[0], weight.shape[0]))

    @torch.library.custom_op("kernelab::w8a16_gemm", mutates_args=())
    def w8a16_gemm(
        x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return ops.w8a16_gemm(x, qweight, scales, bias)

    @w8a16_gemm.register_fake
    def _(x, qweight, scales, bias):
        return x.new_empty((x.shape[0], qweight.shape[1]))

    @torch.library.custom_op("kernelab::w4a16_gemm", mutates_args=())
    def w4a16_gemm(
        x: torch.Tensor,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        group_size: int,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        return ops.w4a16_gemm(x, qweight, scales, zeros, group_size, bias)

    @w4a16_gemm.register_fake
    def _(x, qweight, scales, zeros, group_size, bias):
        return x.new_empty((x.shape[0], qweight.shape[1]))

    @torch.library.custom_op("kernelab::fp8_gemm", mutates_args=())
    def fp8_gemm(
        a: torch.Tensor,
        weight: torch.Tensor,
        scale_a: torch.Tensor,
        scale_b: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        return ops.fp8_gemm(a, weight, scale_a, scale_b, bias, b_layout="nk")

    @fp8_gemm.register_fake
    def _(a, weight, scale_a, scale_b, bias):
        return a.new_empty((a.shape[0], weight.shape[0]), dtype=torch.bfloat16)

    return {
        "gemm": gemm,
        "w8a16_gemm": w8a16_gemm,
        "w4a16_gemm": w4a16_gemm,
        "fp8_gemm": fp8_gemm,
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


# The GEMMs: x [M, K] with a weight prepared by ``kernelab.models._linear`` → [M, N].


def gemm(a, weight, bias=None):
    """``ops.gemm(a, weight, bias, b_layout="nk")`` (weight: an nn.Linear weight [N, K])."""
    if a.device.type == "cpu":
        return ops.gemm(a, weight, bias, b_layout="nk")
    return _registered()["gemm"](a, weight, bias)


def w8a16_gemm(x, qweight, scales, bias=None):
    if x.device.type == "cpu":
        return ops.w8a16_gemm(x, qweight, scales, bias)
    return _registered()["w8a16_gemm"](x, qweight, scales, bias)


def w4a16_gemm(x, qweight, scales, zeros, group_size, bias=None):
    if x.device.type == "cpu":
        return ops.w4a16_gemm(x, qweight, scales, zeros, group_size, bias)
    return _registered()["w4a16_gemm"](x, qweight, scales, zeros, int(group_size), bias)


def fp8_gemm(a, weight, scale_a, scale_b, bias=None):
    """bfloat16 ``ops.fp8_gemm`` with the weight as [N, K] e4m3."""
    if a.device.type == "cpu":
        return ops.fp8_gemm(a, weight, scale_a, scale_b, bias, b_layout="nk")
    return _registered()["fp8_gemm"](a, weight, scale_a, scale_b, bias)
