"""What the normalisation ops share: the launch heuristic, argument checks, the launch plan of
the family kernel (``_kernels._norm_kernel``), inputs, cost and shapes. The op modules
(rmsnorm, layernorm, rmsnorm_fp8_quant) declare the ops.
"""

from __future__ import annotations

import torch

from kernelab.core import Cost, Shape
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime import shapes as _shapes
from kernelab.core.runtime import tuned as _tuned
from kernelab.core.runtime.fp8 import MIN_SCALE
from kernelab.core.runtime.launch import KernelCall, LaunchPlan, RowConfig, cdiv, rows

# --- launch heuristics as data ----------------------------------------------------------------

#: One row-wise config for the family (see ``_launch.RowConfig``): rows up to 16384 values stay
#: in registers in one pass (32 fp32 per thread over 16 warps, no spills on sm_90 per
#: benchmarks/ptx_check.py); wider rows loop over blocks.
NormConfig = RowConfig
MAX_SINGLE_PASS = RowConfig.MAX_SINGLE_PASS


# --- the launcher ------------------------------------------------------------------------------


def validate(x, weight, eps, residual, out, bias=None, out_dtypes=None) -> None:
    """Arguments of the norm ops; ``out_dtypes`` (default: x's dtype) for quantized outputs."""
    _check.tensor("x", x, dtypes=_check.FLOATS, min_ndim=1)
    _check.tensor("weight", weight, dtypes=_check.FLOATS, ndim=1, device=x.device)
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight: expected shape ({x.shape[-1]},) to match x's last dimension, "
            f"got {tuple(weight.shape)}"
        )
    if bias is not None:
        _check.tensor("bias", bias, dtypes=_check.FLOATS, ndim=1, device=x.device)
        _check.same_shape("bias", bias, weight.shape, "the shape of weight")
    _check.finite_positive("eps", eps)
    if residual is not None:
        _check.tensor("residual", residual, dtypes=(x.dtype,), device=x.device)
        _check.same_shape("residual", residual, x.shape, "the shape of x")
    if out is not None:
        _check.tensor("out", out, dtypes=out_dtypes or (x.dtype,), device=x.device)
        _check.same_shape("out", out, x.shape, "the shape of x")


def plan(
    kern,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None,
    out: torch.Tensor,
    config: NormConfig | None,
    *,
    is_rms: bool,
    scale: torch.Tensor | None = None,
    result=None,
) -> LaunchPlan:
    """Normalise ``x`` into ``out`` with ``kern`` (the family kernel, or a planted-defect copy
    of it); with ``scale`` (float32, one per row), ``out`` is float8 and each row is quantized
    with its own scale. Nothing is launched for empty ``x``. ``result`` is what the launcher
    returns (``out`` by default)."""
    result = out if result is None else result
    if x.numel() == 0:
        return LaunchPlan(result=result)
    x2 = rows(x)
    n_rows, n_cols = x2.shape
    out2 = rows(out)
    res2 = rows(residual) if residual is not None else x2
    quant = scale is not None
    cfg = (
        config
        or (
            None
            if quant
            else _tuned.config_for(
                "rmsnorm" if is_rms else "layernorm",
                (kern,),
                NormConfig,
                {"rows": n_rows, "cols": n_cols},
                "rows",
                x.dtype,
                x.device,
            )
        )
        or NormConfig.default_for(n_rows, n_cols, x.device)
    )
    call = KernelCall(
        kern,
        (cdiv(n_rows, cfg.block_m),),
        dict(
            Out=out2,
            stride_out=out2.stride(0),
            Scale=scale if quant else out2,
            X=x2,
            stride_x=x2.stride(0),
            Res=res2,
            stride_res=res2.stride(0),
            W=weight.contiguous(),
            B=bias.contiguous() if bias is not None else weight,
            n_rows=n_rows,
            n_cols=n_cols,
            eps=float(eps),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            IS_RMS=is_rms,
            HAS_BIAS=bias is not None,
            HAS_RESIDUAL=residual is not None,
            SINGLE_PASS=n_cols <= cfg.block_n,
            QUANT=quant,
            FP8_MAX=float(torch.finfo(out.dtype).max) if quant else 1.0,
            MIN_SCALE=MIN_SCALE,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    backs = ((out2, out),) + (((res2, residual),) if residual is not None else ())
    return LaunchPlan((call,), result, backs)


# --- inputs, cost and shapes ----------------------------------------------


def inputs(shape: Shape, dtype, device, gen, dist, eps: float, bias: bool = False) -> dict:
    """x [rows, cols], weight (near 1, as trained norm weights are, with enough spread to catch
    misindexing), a bias when asked, eps and the residual the shape asks for; x and the
    residual get the shape's row padding. Drawn in that order, so a seed gives the same
    tensors to every member of the family."""
    n_rows, n_cols = shape.dims["rows"], shape.dims["cols"]
    x = _inputs.randn((n_rows, n_cols), dtype, device, gen, dist)
    weight = _inputs.randn((n_cols,), dtype, device, gen, "normal", scale=0.1, mean=1.0)
    out = {"x": x, "weight": weight}
    if bias:
        out["bias"] = None
        if shape.params.get("bias"):
            out["bias"] = _inputs.randn((n_cols,), dtype, device, gen, "normal", scale=0.1)
    residual = None
    if shape.params.get("residual"):
        residual = _inputs.randn((n_rows, n_cols), dtype, device, gen, dist)
    pad = shape.params.get("row_pad", 0)
    if pad:
        out["x"] = _inputs.strided_rows(x, pad)
        if residual is not None:
            residual = _inputs.strided_rows(residual, pad)
    out["eps"] = eps
    out["residual"] = residual
    return out


def cost(inputs: dict, flops_per_element: int) -> Cost:
    """Read x, weight (and bias), write out; with a residual also read and write it (one more
    FLOP per element for the add, and for the bias)."""
    x, w, b, residual = inputs["x"], inputs["weight"], inputs.get("bias"), inputs.get("residual")
    n = x.numel()
    nbytes = 2 * n * x.element_size() + w.numel() * w.element_size()
    flops = flops_per_element * n
    if b is not None:
        nbytes += b.numel() * b.element_size()
        flops += n
    if residual is not None:
        nbytes += 2 * n * residual.element_size()
        flops += n
    return Cost(flops=flops, bytes=nbytes)


# Shapes: the row-wise shape sets of kernelab.core.runtime.shapes.
suffix = _shapes.row_suffix
representative = _shapes.hidden_rows
edge = _shapes.row_edge


def row_length(inputs: dict) -> int:
    """``Contract.reduction`` of a norm: the row length it sums over."""
    return int(inputs["x"].shape[-1])
