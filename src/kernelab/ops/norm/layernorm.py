"""LayerNorm with optional bias and the fused residual add of inference servers.

    residual ← x + residual          (only when ``residual`` is given; in place)
    out      = (h − mean(h)) / sqrt(var(h) + eps) · weight (+ bias),   h = residual or x

The kernel is the norm family's (``kernelab.ops.norm._common``) with IS_RMS off; the ladder is
``layernorm_triton`` (launcher) → ``layernorm`` (public) beside ``layernorm_ref`` (reference,
exact in float64) and ``layernorm_torch`` (eager PyTorch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelab.core import Contract, Cost, Op, Sampling, Shape, Variant, register
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.norm import _common as _norm
from kernelab.ops.norm._kernels import _norm_kernel

#: LayerNorm runs the family kernel with IS_RMS off; the name lets tests replace it.
_layernorm_kernel = _norm_kernel
LayerNormConfig = _norm.NormConfig


def layernorm_ref(x, weight, bias=None, eps=1e-5, residual=None, out=None):
    """Plain PyTorch in the inputs' dtype (exact when given float64); updates ``residual``."""
    h = x
    if residual is not None:
        residual.add_(x)
        h = residual
    mean = h.mean(dim=-1, keepdim=True)
    var = (h - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (h - mean) * torch.rsqrt(var + eps) * weight
    if bias is not None:
        y = y + bias
    return y if out is None else out.copy_(y)


def layernorm_torch(x, weight, bias=None, eps=1e-5, residual=None, out=None):
    """Eager PyTorch as inference code writes it: ``F.layer_norm`` in the input's dtype."""
    _norm.validate(x, weight, eps, residual, out, bias)
    h = x
    if residual is not None:
        residual.add_(x)
        h = residual
    b = bias.to(h.dtype) if bias is not None else None
    y = F.layer_norm(h, (h.shape[-1],), weight.to(h.dtype), b, eps)
    return y if out is None else out.copy_(y)


def _plan(x, weight, bias=None, eps=1e-5, residual=None, out=None, config=None):
    """The launch of ``_layernorm_kernel`` for these (validated) arguments."""
    result = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    return _norm.plan(
        _layernorm_kernel, x, weight, bias, eps, residual, result, config, is_rms=False
    )


def layernorm_triton(x, weight, bias=None, eps=1e-5, residual=None, out=None, config=None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _norm.validate(x, weight, eps, residual, out, bias)
    return _plan(x, weight, bias, eps, residual, out, config).run()


def layernorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Layer normalisation over the last dimension, with optional bias and fused residual.

    Parameters
    ----------
    x : tensor (..., n) of float32, float16 or bfloat16; any leading shape, any row stride.
    weight : tensor (n,), any float dtype.
    bias : optional tensor (n,), any float dtype.
    eps : added to the variance before the reciprocal square root.
    residual : optional tensor like ``x``; updated in place to ``x + residual``, and the
        output is then the normalised residual.
    out : optional preallocated output like ``x``.

    Triton on CUDA/ROCm; torch on CPU (the interpreter with KERNELAB_INTERPRET=1).
    """
    if isinstance(x, torch.Tensor) and use_triton(x):
        return layernorm_triton(x, weight, bias, eps, residual, out)
    return layernorm_torch(x, weight, bias, eps, residual, out)


# --- the declaration ---------------------------------------------------------------------------

_OPTIONS = (
    {"bias": False, "residual": False},
    {"bias": True, "residual": True},
)


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    return _norm.inputs(shape, dtype, device, gen, dist, eps=1e-5, bias=True)


def _cost(inputs: dict) -> Cost:
    # sum, subtract mean, square, accumulate, scale by rstd, scale by weight
    return _norm.cost(inputs, 6)


LAYERNORM = register(
    Op(
        "layernorm",
        description="LayerNorm over the last dimension, optional bias, fused residual (in place)",
        reference=layernorm_ref,
        make_inputs=_make_inputs,
        sampling=Sampling(
            rows={"x": 0, "residual": 0, "out": 0}, cut={"cols": 128}, tile={"rows": 32}
        ),
        shapes={
            "representative": lambda: _norm.representative(_OPTIONS),
            "edge": lambda: _norm.edge(_OPTIONS),
        },
        cost=_cost,
        # offset inputs: a variance must be taken about the mean (one pass cancels)
        contract=Contract(
            inplace=("residual",), distributions=("offset",), reduction=_norm.row_length
        ),
        kernels=(_layernorm_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: LayerNormConfig.tuning_space(shape.dims["cols"]),
    )
)
LAYERNORM.add_variant(
    Variant(
        "kernelab",
        layernorm_triton,
        "triton",
        description="Triton kernel (the norm family's), one pass for rows up to 16384",
    )
)
LAYERNORM.add_torch(layernorm_torch)
