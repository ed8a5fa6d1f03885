"""The normalisation family's one kernel: RMSNorm, LayerNorm, and RMSNorm with per-token float8
quantization of its output, each with the optional fused residual add.

    residual ← x + residual                  (HAS_RESIDUAL; in place)
    h        = residual if given else x
    RMSNorm:   y = h / sqrt(mean(h²) + eps) · w
    LayerNorm: y = (h − mean(h)) / sqrt(var(h) + eps) · w (+ b)
    QUANT:     s = max(max|y| / FP8_MAX, MIN_SCALE) per row;  out = fp8(y / s), scale = s
"""

import triton.language as tl

from kernelab.core.runtime.triton import kernel


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
    variance about the mean, not E[h²] − mean², which cancels; the mean itself summed about
    the row's first value), once more for QUANT.
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
        else:  # about the row's first value h₀ first: exact, and a common offset is gone
            h0 = tl.sum(tl.where(cols[None, :] < 1, h, 0.0), axis=1)
            hs = tl.where(mask, h - h0[:, None], 0.0)
            hc = tl.where(mask, hs - (tl.sum(hs, axis=1) / n_cols)[:, None], 0.0)
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
        # Pass 1: the residual sum, and Σh² (RMSNorm) or Σ(h − h₀) (LayerNorm: shifted by the
        # row's first value, so a large common offset does not cost the sum its precision).
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        shift = tl.zeros([BLOCK_M], dtype=tl.float32)
        if not IS_RMS:
            first = row_ok[:, None] & (cols[None, :] < 1)
            h0 = tl.load(x_rows + cols[None, :], mask=first, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r0 = tl.load(r_rows + cols[None, :], mask=first, other=0.0).to(tl.float32)
                h0 = (h0 + r0).to(Res.dtype.element_ty).to(tl.float32)
            shift = tl.sum(h0, axis=1)  # h₀ of each row (the other lanes hold 0)
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
                acc += tl.where(mask, h - shift[:, None], 0.0)
        h_rows = r_rows if HAS_RESIDUAL else x_rows
        if IS_RMS:
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            rstd = tl.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        else:
            mean = tl.sum(acc, axis=1) / n_cols  # of h − h₀
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c[None, :] < n_cols)
                h = tl.load(h_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
                hc = tl.where(mask, (h - shift[:, None]) - mean[:, None], 0.0)
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
            y = ((h - shift[:, None]) - mean[:, None]) * rstd[:, None] * w[None, :]
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
