"""The normalisation family's one kernel and launcher: RMSNorm, LayerNorm, and RMSNorm with
per-token float8 quantization of its output, each with the optional fused residual add.

    residual ← x + residual                  (HAS_RESIDUAL; in place)
    h        = residual if given else x
    RMSNorm:   y = h / sqrt(mean(h²) + eps) · w
    LayerNorm: y = (h − mean(h)) / sqrt(var(h) + eps) · w (+ b)
    QUANT:     s = max(max|y| / FP8_MAX, MIN_SCALE) per row;  out = fp8(y / s), scale = s

The op modules (rmsnorm, layernorm, fp8_quant) declare the ops; this module holds what they
share: the kernel, its launch heuristic, the launcher and the launch declarations.
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernelab.ops import _check, _inputs, _shapes, _tuned
from kernelab.ops._launch import TL, RowConfig, cdiv, rows, specialised, write_back
from kernelab.ops._model import Cost, Launch, Shape
from kernelab.ops._triton import kernel

#: Smallest scale a quantized row gets (the smallest normal float32): an all-zero row has this
#: finite, non-zero scale, and its reciprocal is finite too.
MIN_SCALE = float(torch.finfo(torch.float32).tiny)


@kernel
def _norm_kernel(
    Out,
    stride_out,
    Scale,
    X,
    stride_x,
    Res,
    stride_res,
    W,
    B,
    n_rows,
    n_cols,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    QUANT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
):
    """BLOCK_M rows per program; statistics in float32.

    Bytes, SINGLE_PASS (the row fits in BLOCK_N): reads x (and residual) once and weight (and
    bias) once per program; writes out (and residual, and one scale per row) once. Longer rows
    loop over blocks and re-read the row: once more for RMSNorm, twice for LayerNorm (the
    variance about the mean, not E[h²] − mean², which cancels), once more for QUANT.
    With a residual, the sum is rounded to the residual's dtype before it is normalised, so the
    output is exactly the norm of the residual as stored.
    """
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    x_rows = X + rows[:, None] * stride_x
    o_rows = Out + rows[:, None] * stride_out
    r_rows = Res + rows[:, None] * stride_res
    if SINGLE_PASS:
        mask = row_ok[:, None] & (cols[None, :] < n_cols)
        h = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(r_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            s = (h + r).to(Res.dtype.element_ty)
            tl.store(r_rows + cols[None, :], s, mask=mask)
            h = s.to(tl.float32)
        if IS_RMS:
            hc = h
        else:
            mean = tl.sum(h, axis=1) / n_cols
            hc = tl.where(mask, h - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(hc * hc, axis=1) / n_cols + eps)
        w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = hc * rstd[:, None] * w[None, :]
        if HAS_BIAS:
            y += tl.load(B + cols, mask=cols < n_cols, other=0.0).to(tl.float32)[None, :]
        if QUANT:
            # Values as FP8_MAX·(h·w) / max|h·w|: rstd cancels (y / scale with scale = max|y| /
            # FP8_MAX), products of 16-bit inputs are exact, and ties round as in exact
            # arithmetic. NaN propagates as in torch: the GPU's max and min drop NaN operands,
            # so NaN is counted apart and the clamps propagate it.
            hw = hc * w[None, :]
            amax = tl.max(tl.abs(hw), axis=1)
            amax = tl.where(tl.sum((hw != hw).to(tl.int32), axis=1) > 0, float("nan"), amax)
            ratio = tl.math.div_rn(amax * rstd, FP8_MAX)
            scale = tl.maximum(ratio, MIN_SCALE, tl.PropagateNan.ALL)
            q = tl.where(
                (ratio >= MIN_SCALE)[:, None],
                tl.math.div_rn(hw * FP8_MAX, amax[:, None]),
                tl.math.div_rn(y, scale[:, None]),
            )
            q = tl.maximum(q, -FP8_MAX, tl.PropagateNan.ALL)
            q = tl.minimum(q, FP8_MAX, tl.PropagateNan.ALL)
            tl.store(o_rows + cols[None, :], q.to(Out.dtype.element_ty), mask=mask)
            tl.store(Scale + rows, scale, mask=row_ok)
        else:
            tl.store(o_rows + cols[None, :], y.to(Out.dtype.element_ty), mask=mask)
    else:
        # Pass 1: the residual sum, and Σh² (RMSNorm) or Σh (LayerNorm).
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < n_cols)
            h = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(r_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
                s = (h + r).to(Res.dtype.element_ty)
                tl.store(r_rows + c[None, :], s, mask=mask)
                h = s.to(tl.float32)
            if IS_RMS:
                acc += h * h
            else:
                acc += h
        h_rows = r_rows if HAS_RESIDUAL else x_rows
        if IS_RMS:
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            rstd = tl.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        else:
            mean = tl.sum(acc, axis=1) / n_cols
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c[None, :] < n_cols)
                h = tl.load(h_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
                hc = tl.where(mask, h - mean[:, None], 0.0)
                acc += hc * hc
            rstd = tl.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        scale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        ratio = scale
        amax_row = scale
        if QUANT:
            # As the one-pass path: values from h·w and its row maximum (RMSNorm only).
            amax = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c[None, :] < n_cols)
                h = tl.load(h_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=c < n_cols, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.abs(h * w[None, :]), tl.PropagateNan.ALL)
            nan = tl.sum((amax != amax).to(tl.int32), axis=1) > 0
            amax_row = tl.where(nan, float("nan"), tl.max(amax, axis=1))
            ratio = tl.math.div_rn(amax_row * rstd, FP8_MAX)
            scale = tl.maximum(ratio, MIN_SCALE, tl.PropagateNan.ALL)
            tl.store(Scale + rows, scale, mask=row_ok)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < n_cols)
            h = tl.load(h_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + c, mask=c < n_cols, other=0.0).to(tl.float32)
            y = (h - mean[:, None]) * rstd[:, None] * w[None, :]
            if HAS_BIAS:
                y += tl.load(B + c, mask=c < n_cols, other=0.0).to(tl.float32)[None, :]
            if QUANT:
                y = tl.where(
                    (ratio >= MIN_SCALE)[:, None],
                    tl.math.div_rn(h * w[None, :] * FP8_MAX, amax_row[:, None]),
                    tl.math.div_rn(y, scale[:, None]),
                )
                y = tl.maximum(y, -FP8_MAX, tl.PropagateNan.ALL)
                y = tl.minimum(y, FP8_MAX, tl.PropagateNan.ALL)
            tl.store(o_rows + c[None, :], y.to(Out.dtype.element_ty), mask=mask)


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
    _check.positive("eps", eps)
    if residual is not None:
        _check.tensor("residual", residual, dtypes=(x.dtype,), device=x.device)
        _check.same_shape("residual", residual, x.shape, "the shape of x")
    if out is not None:
        _check.tensor("out", out, dtypes=out_dtypes or (x.dtype,), device=x.device)
        _check.same_shape("out", out, x.shape, "the shape of x")


def launch(
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
) -> None:
    """Normalise validated, non-empty ``x`` into ``out`` with ``kern`` (the family kernel, or a
    planted-defect copy of it). With ``scale`` (float32, one per row), ``out`` is float8 and
    each row is quantized with its own scale."""
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
    kern[(cdiv(n_rows, cfg.block_m),)](
        out2,
        out2.stride(0),
        scale if quant else out2,
        x2,
        x2.stride(0),
        res2,
        res2.stride(0),
        weight.contiguous(),
        bias.contiguous() if bias is not None else weight,
        n_rows,
        n_cols,
        float(eps),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        IS_RMS=is_rms,
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None,
        SINGLE_PASS=n_cols <= cfg.block_n,
        QUANT=quant,
        FP8_MAX=float(torch.finfo(out.dtype).max) if quant else 1.0,
        MIN_SCALE=MIN_SCALE,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    write_back(out2, out)
    if residual is not None:
        write_back(res2, residual)


# --- inputs, cost, shapes and launch declarations ----------------------------------------------


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
    if pad and device.type != "meta":
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


def suffix(params: dict) -> str:
    """A label's note of a shape's options: " +residual" for flags, " e4m3fnuz" for names."""
    return "".join(
        f" +{k}" if v is True else f" {v}" if isinstance(v, str) else "" for k, v in params.items()
    )


def representative(options: tuple[dict, ...]) -> list[Shape]:
    """Hidden widths of the reference models at decode and prefill, once per option set."""

    return [
        Shape(
            f"{'/'.join(models)} {_shapes.phase(tokens)} {tokens}x{hidden}" + suffix(p),
            {"rows": tokens, "cols": hidden},
            p,
            batch_dim="rows",
        )
        for hidden, models in _shapes.by_width(lambda m: m.hidden).items()
        for tokens in _shapes.TOKENS
        for p in options
    ]


def edge(options: tuple[dict, ...]) -> list[Shape]:
    cases = [
        ("1 column", 3, 1, {}),
        ("prime width", 5, 1021, {}),
        ("one row", 1, 4096, {}),
        ("longer than one block", 3, MAX_SINGLE_PASS + 1000, {}),
        ("non-contiguous rows", 7, 257, {"row_pad": 13}),
        ("empty", 0, 128, {}),
        ("many short rows", 1000, 96, {}),
    ]
    return [
        Shape(
            f"{label} {n}x{c}" + suffix(p),
            {"rows": n, "cols": c},
            {**p, **extra},
            batch_dim="rows",
        )
        for label, n, c, extra in cases
        for p in options
    ]


_CONSTEXPRS = (
    "BLOCK_M",
    "BLOCK_N",
    "IS_RMS",
    "HAS_BIAS",
    "HAS_RESIDUAL",
    "SINGLE_PASS",
    "QUANT",
    "FP8_MAX",
    "MIN_SCALE",
)


def launches(
    kern,
    shape: Shape,
    dtype: torch.dtype,
    config: NormConfig | None,
    *,
    is_rms: bool,
    out_dtype: torch.dtype | None = None,
) -> list[Launch]:
    """The one launch a norm op makes for ``shape``; ``out_dtype`` float8 for QUANT."""
    n_rows, n_cols = shape.dims["rows"], shape.dims["cols"]
    if n_rows * n_cols == 0:
        return []
    cfg = config or NormConfig.default_for(n_rows, n_cols)
    t = TL[dtype]
    quant = out_dtype is not None
    row_stride = n_cols + shape.params.get("row_pad", 0)
    sig = {
        "Out": f"*{TL[out_dtype] if quant else t}",
        "stride_out": "i32",
        "Scale": "*fp32" if quant else f"*{t}",
        "X": f"*{t}",
        "stride_x": "i32",
        "Res": f"*{t}",
        "stride_res": "i32",
        "W": f"*{t}",
        "B": f"*{t}",
        "n_rows": "i32",
        "n_cols": "i32",
        "eps": "fp32",
        **dict.fromkeys(_CONSTEXPRS, "constexpr"),
    }
    ints = {
        "stride_out": n_cols,
        "stride_x": row_stride,
        "stride_res": row_stride,
        "n_rows": n_rows,
        "n_cols": n_cols,
    }
    div16, eq1 = specialised(ints, ("Out", "Scale", "X", "Res", "W", "B"))
    constexprs = {
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "IS_RMS": is_rms,
        "HAS_BIAS": bool(shape.params.get("bias")),
        "HAS_RESIDUAL": bool(shape.params.get("residual")),
        "SINGLE_PASS": n_cols <= cfg.block_n,
        "QUANT": quant,
        "FP8_MAX": float(torch.finfo(out_dtype).max) if quant else 1.0,
        "MIN_SCALE": MIN_SCALE,
    }
    grid = (cdiv(n_rows, cfg.block_m),)
    return [
        Launch(
            kern,
            sig,
            constexprs,
            cfg.num_warps,
            cfg.num_stages,
            grid,
            divisible_16=div16,
            equal_1=eq1,
            config=cfg,
        )
    ]
