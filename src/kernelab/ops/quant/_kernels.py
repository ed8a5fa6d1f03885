"""The quantization family's kernel: float8 quantization of activations with dynamic per-token,
per-token-group or per-tensor scales, or a given one (``MODE``; conventions in
``kernelab.ops.quant.fp8_quant``).

    scale  = max(max|x| / FP8_MAX, MIN_SCALE)     over a row (per token), a group of columns of
                                                  a row (per group) or the whole tensor
    scale  = 2^ceil(log2(scale))                  with UE8M0 (power-of-two scales)
    values = fp8(clamp(x / scale, −FP8_MAX, FP8_MAX))    rounded to nearest even
"""

import triton.language as tl

from kernelab.core.runtime.triton import kernel

#: The kernel's MODE: per-token scales; the global max|x| (first launch of per-tensor);
#: quantize with the scale derived from that max (second launch); quantize with a given scale;
#: one scale per BLOCK_N columns of each row (per token group).
PER_TOKEN, AMAX, PER_TENSOR, STATIC, PER_GROUP = 0, 1, 2, 3, 4


@kernel
def _pow2_ceil(scale):
    """The smallest power of two ≥ a positive float32 (exact, on its bits: a carry into the
    exponent unless the mantissa is zero); NaN stays NaN and +inf stays +inf."""
    bits = scale.to(tl.int32, bitcast=True)
    up = ((bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
    return tl.where(scale != scale, scale, up)


@kernel
def _fp8_quant_kernel(
    Out,
    stride_out,
    Scale,
    stride_scale,
    X,
    stride_x,
    Amax,
    n_rows,
    n_cols,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MODE: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    UE8M0: tl.constexpr,
):
    """A tile of BLOCK_M rows × BLOCK_N columns (PER_TOKEN: whole rows; PER_GROUP: BLOCK_N /
    GROUP_SIZE whole groups of each row, a group's scale at Scale[row · stride_scale + group]),
    float32 arithmetic.

    Bytes: PER_TOKEN reads x once and writes values and one scale per row (rows longer than
    BLOCK_N are read twice); PER_GROUP reads x once and writes values and one scale per group;
    per tensor, AMAX reads x and PER_TENSOR reads it again and writes the values (the second
    read is the price of a scale that depends on the whole tensor).
    """
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    x_rows = X + rows[:, None] * stride_x
    o_rows = Out + rows[:, None] * stride_out
    # NaN propagates as in torch (a NaN makes the max, the scale and the values NaN): the GPU's
    # max and min drop NaN operands, so NaN is counted apart and clamps propagate it.
    if MODE == 0:
        if SINGLE_PASS:
            mask = row_ok[:, None] & (cols[None, :] < n_cols)
            x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            nan = tl.sum((x != x).to(tl.int32), axis=1) > 0
            amax = tl.where(nan, float("nan"), tl.max(tl.abs(x), axis=1))
            scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX), MIN_SCALE, tl.PropagateNan.ALL)
            q = tl.math.div_rn(x, scale[:, None])
            q = tl.maximum(q, -FP8_MAX, tl.PropagateNan.ALL)
            q = tl.minimum(q, FP8_MAX, tl.PropagateNan.ALL)
            tl.store(o_rows + cols[None, :], q.to(Out.dtype.element_ty), mask=mask)
        else:
            amax = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c[None, :] < n_cols)
                x = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.abs(x), tl.PropagateNan.ALL)
            nan = tl.sum((amax != amax).to(tl.int32), axis=1) > 0
            amax_row = tl.where(nan, float("nan"), tl.max(amax, axis=1))
            scale = tl.maximum(tl.math.div_rn(amax_row, FP8_MAX), MIN_SCALE, tl.PropagateNan.ALL)
            for start in range(0, n_cols, BLOCK_N):
                c = start + cols
                mask = row_ok[:, None] & (c[None, :] < n_cols)
                x = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
                q = tl.math.div_rn(x, scale[:, None])
                q = tl.maximum(q, -FP8_MAX, tl.PropagateNan.ALL)
                q = tl.minimum(q, FP8_MAX, tl.PropagateNan.ALL)
                tl.store(o_rows + c[None, :], q.to(Out.dtype.element_ty), mask=mask)
        tl.store(Scale + rows, scale, mask=row_ok)
    elif MODE == 4:
        G: tl.constexpr = BLOCK_N // GROUP_SIZE
        c = pid_n * BLOCK_N + cols
        mask = row_ok[:, None] & (c[None, :] < n_cols)
        x = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
        x3 = tl.reshape(x, (BLOCK_M, G, GROUP_SIZE))
        nan = tl.sum((x3 != x3).to(tl.int32), axis=2) > 0
        group_max = tl.max(tl.abs(x3), axis=2)
        amax = tl.where(nan, float("nan"), group_max)
        scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX), MIN_SCALE, tl.PropagateNan.ALL)
        if UE8M0:
            scale = _pow2_ceil(scale)
        q = tl.reshape(tl.math.div_rn(x3, scale[:, :, None]), (BLOCK_M, BLOCK_N))
        q = tl.maximum(q, -FP8_MAX, tl.PropagateNan.ALL)
        q = tl.minimum(q, FP8_MAX, tl.PropagateNan.ALL)
        tl.store(o_rows + c[None, :], q.to(Out.dtype.element_ty), mask=mask)
        g = pid_n * G + tl.arange(0, G)
        s_mask = row_ok[:, None] & (g[None, :] < tl.cdiv(n_cols, GROUP_SIZE))
        tl.store(Scale + rows[:, None] * stride_scale + g[None, :], scale, mask=s_mask)
    else:
        c = pid_n * BLOCK_N + cols
        mask = row_ok[:, None] & (c[None, :] < n_cols)
        x = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
        if MODE == 1:
            # max|x| as the bits of a non-negative float32 (ordered as integers, NaN above
            # +inf), so that an integer atomic max keeps NaN on every device.
            nan = tl.sum(tl.sum((x != x).to(tl.int32), axis=1), axis=0) > 0
            tile = tl.where(nan, float("nan"), tl.max(tl.max(tl.abs(x), axis=1), axis=0))
            tl.atomic_max(Amax, tile.to(tl.int32, bitcast=True))
        else:
            if MODE == 2:
                amax = tl.load(Amax).to(tl.float32, bitcast=True)
                scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX), MIN_SCALE, tl.PropagateNan.ALL)
                if (pid_m == 0) & (pid_n == 0):
                    tl.store(Scale, scale)
            else:
                scale = tl.load(Scale)
            q = tl.math.div_rn(x, scale)
            q = tl.maximum(q, -FP8_MAX, tl.PropagateNan.ALL)
            q = tl.minimum(q, FP8_MAX, tl.PropagateNan.ALL)
            tl.store(o_rows + c[None, :], q.to(Out.dtype.element_ty), mask=mask)
