"""RMSNorm fused with per-token float8 quantization (with the optional residual add, in place).

    residual ← x + residual;  y = h · rsqrt(mean(h²) + eps) · w   (h = residual or x)
    scale = max(max|y| / FP8_MAX, MIN_SCALE) per row;  values = fp8(y / scale)

The norm family's kernel (``kernelab.ops.norm._common``) with QUANT on: one pass, and the normalised
activations never go through memory. Quantization conventions as in ``kernelab.ops.fp8_quant``.
"""

from __future__ import annotations

import torch

from kernelab.core import Contract, Cost, Op, Sampling, Shape, Variant, register
from kernelab.core.runtime import fp8
from kernelab.core.runtime.fp8 import FP8_DTYPES, MIN_SCALE
from kernelab.core.runtime.launch import LaunchPlan
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.norm import _common as _norm
from kernelab.ops.norm._kernels import _norm_kernel

#: The fused op runs the norm family's kernel with QUANT on; the name lets tests replace it.
_rmsnorm_quant_kernel = _norm_kernel

# --- reference, eager, launcher, public function ----------------------------------------------


def _fused(h, weight, eps, fp8_dtype):
    """RMSNorm then per-token quantization, in h's dtype. The values are computed as
    FP8_MAX·(h·w) / max|h·w|, which equals y / scale (y = h·rstd·w, scale = max|y| / FP8_MAX)
    with rstd cancelled: exact ties (common with 16-bit inputs) then round as in exact
    arithmetic instead of by the last bits of rstd. A scale clamped at MIN_SCALE divides y."""
    fmax = torch.finfo(fp8_dtype).max
    hw = h * weight
    rstd = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    amax = fp8.amax(hw, True)
    ratio = amax * rstd / fmax
    scale = ratio.clamp_min(MIN_SCALE)
    q = torch.where(ratio >= MIN_SCALE, hw * fmax / amax, hw * rstd / scale)
    return q.clamp(-fmax, fmax), scale


def rmsnorm_fp8_quant_ref(x, weight, eps=1e-6, residual=None, fp8_dtype=FP8_DTYPES[0]):
    """RMSNorm (updating ``residual``), then per-token quantization (exact in float64)."""
    h = x
    if residual is not None:
        residual.add_(x)
        h = residual
    q, scale = _fused(h, weight, eps, fp8_dtype)
    return q.to(torch.float32).to(fp8_dtype).to(h.dtype), scale


def rmsnorm_fp8_quant_torch(x, weight, eps=1e-6, residual=None, fp8_dtype=FP8_DTYPES[0]):
    """Eager PyTorch: the same float32 formula, the norm never rounded before quantization."""
    _norm.validate(x, weight, eps, residual, None)
    fp8.check_dtype("fp8_dtype", fp8_dtype)
    h = x
    if residual is not None:
        residual.add_(x)
        h = residual
    q, scale = _fused(h.float(), weight.float(), eps, fp8_dtype)
    return q.to(fp8_dtype), scale


def _plan(x, weight, eps=1e-6, residual=None, fp8_dtype=FP8_DTYPES[0], config=None):
    """The launch of ``_rmsnorm_quant_kernel`` (QUANT on) for these (validated) arguments."""
    values = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    scales = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return LaunchPlan(result=(values, scales.fill_(MIN_SCALE)))
    return _norm.plan(
        _rmsnorm_quant_kernel,
        x,
        weight,
        None,
        eps,
        residual,
        values,
        config,
        is_rms=True,
        scale=scales,
        result=(values, scales),
    )


def rmsnorm_fp8_quant_triton(
    x, weight, eps=1e-6, residual=None, fp8_dtype=FP8_DTYPES[0], config=None
):
    """The norm family's kernel with QUANT on: one pass, float8 values and per-row scales."""
    _norm.validate(x, weight, eps, residual, None)
    fp8.check_dtype("fp8_dtype", fp8_dtype)
    return _plan(x, weight, eps, residual, fp8_dtype, config).run()


def rmsnorm_fp8_quant(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    fp8_dtype: torch.dtype = FP8_DTYPES[0],
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm (with the optional fused residual add, in place) quantized per token to float8.

    Returns (values of ``x``'s shape in ``fp8_dtype``, float32 scales of shape (..., 1)).
    """
    if isinstance(x, torch.Tensor) and use_triton(x):
        return rmsnorm_fp8_quant_triton(x, weight, eps, residual, fp8_dtype)
    return rmsnorm_fp8_quant_torch(x, weight, eps, residual, fp8_dtype)


# --- the declaration ---------------------------------------------------------------------------


def _fused_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    inputs = _norm.inputs(shape, dtype, device, gen, dist, eps=1e-6)
    return {**inputs, "fp8_dtype": fp8.of_shape(shape)}


def _fused_cost(inputs: dict) -> Cost:
    x, w, residual = inputs["x"], inputs["weight"], inputs.get("residual")
    n = x.numel()
    n_rows = n // max(1, x.shape[-1])
    # Read x and weight, write one byte per value and a float32 scale per row; with a residual,
    # also read and write it.
    nbytes = n * x.element_size() + w.numel() * w.element_size() + n + 4 * n_rows
    flops = 7 * n  # the norm (4), max|y|, divide, clamp
    if residual is not None:
        nbytes += 2 * n * residual.element_size()
        flops += n
    return Cost(flops=flops, bytes=nbytes)


_FUSED_OPTIONS = ({"residual": False}, {"residual": True})

RMSNORM_FP8_QUANT = register(
    Op(
        "rmsnorm_fp8_quant",
        description="RMSNorm (optional fused residual, in place) quantized per token to float8",
        reference=rmsnorm_fp8_quant_ref,
        make_inputs=_fused_inputs,
        sampling=Sampling(
            rows={"x": 0, "residual": 0, "values": 0, "scales": 0},
            cut={"cols": 128},
            tile={"rows": 32},
        ),
        shapes={
            "representative": lambda: _norm.representative(_FUSED_OPTIONS),
            "edge": lambda: _norm.edge((*_FUSED_OPTIONS, {"residual": True, "fp8": "e4m3fnuz"})),
        },
        cost=_fused_cost,
        # One floor for every output: the float32 scales must be rejected when computed at
        # lower precision (about 1e-4 off at 12 bits), while the float8 values track eager
        # torch, whose float32 arithmetic makes the same rounding choices at ties (measured: the
        # kernel's error never exceeded max(2x eager, 1e-5) over 351 interpreted cases).
        contract=Contract(
            inplace=("residual",),
            floors={"float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5},
        ),
        outputs=("values", "scales"),
        out_arg=None,
        kernels=(_rmsnorm_quant_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: _norm.NormConfig.tuning_space(shape.dims["cols"]),
    )
)
RMSNORM_FP8_QUANT.add_variant(
    Variant(
        "kernelab",
        rmsnorm_fp8_quant_triton,
        "triton",
        description="the norm family's kernel with per-row float8 output, one pass",
    )
)
RMSNORM_FP8_QUANT.add_torch(rmsnorm_fp8_quant_torch)
