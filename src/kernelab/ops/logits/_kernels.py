"""The logits family's kernel: softmax over rows of ``x · scale (+ mask)``, in one pass for rows
held in registers (SINGLE_PASS), else an online running max and sum then the normalised write
(see ``kernelab.ops.logits.softmax``).
"""

import triton.language as tl

from kernelab.core.runtime.triton import kernel


@kernel
def _softmax_kernel(
    Out,
    stride_out,
    X,
    stride_x,
    Mask,
    stride_mask,
    n_rows,
    n_cols,
    scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """BLOCK_M rows per program, float32 arithmetic.

    Bytes: SINGLE_PASS reads x (and the mask) once and writes out once; longer rows read x (and
    the mask) twice: once for the running max and sum, once for the write.
    """
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    x_rows = X + rows[:, None] * stride_x
    m_rows = Mask + rows[:, None] * stride_mask
    o_rows = Out + rows[:, None] * stride_out
    if SINGLE_PASS:
        inb = row_ok[:, None] & (cols[None, :] < n_cols)
        z = tl.load(x_rows + cols[None, :], mask=inb, other=0.0).to(tl.float32) * scale
        if HAS_MASK:
            z += tl.load(m_rows + cols[None, :], mask=inb, other=0.0).to(tl.float32)
        z = tl.where(inb, z, float("-inf"))
        m = tl.max(z, axis=1)
        e = tl.exp(z - m[:, None])
        s = tl.sum(e, axis=1)
        tl.store(o_rows + cols[None, :], (e / s[:, None]).to(Out.dtype.element_ty), mask=inb)
    else:
        # Per-lane running maximum and sum of exp(z - maximum); lanes that have only seen -inf
        # keep m = -inf and s = 0 (no exp(-inf - -inf) = NaN).
        m_i = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32)
        s_i = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            inb = row_ok[:, None] & (c[None, :] < n_cols)
            z = tl.load(x_rows + c[None, :], mask=inb, other=0.0).to(tl.float32) * scale
            if HAS_MASK:
                z += tl.load(m_rows + c[None, :], mask=inb, other=0.0).to(tl.float32)
            z = tl.where(inb, z, float("-inf"))
            # A NaN must stay in the running maximum (the GPU's max drops it by default), so
            # that its row comes out NaN as the reference's does.
            m_new = tl.maximum(m_i, z, propagate_nan=tl.PropagateNan.ALL)
            seen = m_new > float("-inf")
            alpha = tl.where(seen, tl.exp(m_i - m_new), 0.0)
            s_i = s_i * alpha + tl.where(seen, tl.exp(z - m_new), 0.0)
            m_i = m_new
        m = tl.max(m_i, axis=1)
        s = tl.sum(tl.where(m_i > float("-inf"), s_i * tl.exp(m_i - m[:, None]), 0.0), axis=1)
        row_nan = tl.sum((m_i != m_i).to(tl.int32), axis=1) > 0
        s = tl.where(row_nan, float("nan"), s)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            inb = row_ok[:, None] & (c[None, :] < n_cols)
            z = tl.load(x_rows + c[None, :], mask=inb, other=0.0).to(tl.float32) * scale
            if HAS_MASK:
                z += tl.load(m_rows + c[None, :], mask=inb, other=0.0).to(tl.float32)
            y = tl.exp(z - m[:, None]) / s[:, None]
            tl.store(o_rows + c[None, :], y.to(Out.dtype.element_ty), mask=inb)
