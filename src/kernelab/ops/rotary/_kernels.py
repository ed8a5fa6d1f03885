"""The rotary family's kernel: rotary position embedding in place on query and key, in the
NeoX (halves) or GPT-J (interleaved pairs) layout, from a cos/sin cache (conventions in
``kernelab.ops.rotary.rope``).
"""

import triton.language as tl

from kernelab.core.runtime.triton import kernel


@kernel
def _rope_kernel(
    Q,
    stride_qt,
    stride_qh,
    K,
    stride_kt,
    stride_kh,
    Pos,
    stride_pos,
    Cache,
    stride_cache,
    n_pos,
    n_tokens,
    heads_q,
    heads_k,
    HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    """BLOCK_T tokens × BLOCK_H heads of query and of key per program, float32 arithmetic.

    Bytes: reads and writes the rotated part of each query and key head once; reads one cos/sin
    row per token per program (shared by all its heads) and one position per token.

    A position outside [0, n_pos) reads nothing: its cache row is masked (and its index
    clamped, so no address outside the cache is ever formed), cos = sin = 0, and the token's
    rotated dimensions are written as zeros.
    """
    pid_t = tl.program_id(0).to(tl.int64)
    pid_h = tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T).to(tl.int64)
    t_ok = t < n_tokens
    pos = tl.load(Pos + t * stride_pos, mask=t_ok, other=0).to(tl.int64)
    pos_ok = t_ok & (pos >= 0) & (pos < n_pos)
    pos = tl.where(pos_ok, pos, 0)
    r = tl.arange(0, BLOCK_R)
    cs_mask = pos_ok[:, None] & (r < HALF)[None, :]
    cs_rows = Cache + pos[:, None] * stride_cache + r[None, :]
    cos = tl.load(cs_rows, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    sin = tl.load(cs_rows + HALF, mask=cs_mask, other=0.0).to(tl.float32)[:, None, :]
    h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    for which in tl.static_range(2):
        if which == 0:
            base = Q + t[:, None, None] * stride_qt + h[None, :, None] * stride_qh
            h_ok = h < heads_q
        else:
            base = K + t[:, None, None] * stride_kt + h[None, :, None] * stride_kh
            h_ok = h < heads_k
        rows_ok = t_ok[:, None, None] & h_ok[None, :, None]
        if IS_NEOX:
            m = rows_ok & (r < HALF)[None, None, :]
            p1 = base + r[None, None, :]
            x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(p1 + HALF, mask=m, other=0.0).to(tl.float32)
            o1 = x1 * cos - x2 * sin
            o2 = x2 * cos + x1 * sin
            tl.store(p1, o1.to(Q.dtype.element_ty), mask=m)
            tl.store(p1 + HALF, o2.to(Q.dtype.element_ty), mask=m)
        else:
            # Load the pairs as one contiguous run (wide accesses), split them in registers.
            e = tl.arange(0, 2 * BLOCK_R)
            m = rows_ok & (e < 2 * HALF)[None, None, :]
            pe = base + e[None, None, :]
            x = tl.load(pe, mask=m, other=0.0).to(tl.float32)
            x1, x2 = tl.split(tl.reshape(x, [BLOCK_T, BLOCK_H, BLOCK_R, 2]))
            o1 = x1 * cos - x2 * sin
            o2 = x2 * cos + x1 * sin
            y = tl.reshape(tl.join(o1, o2), [BLOCK_T, BLOCK_H, 2 * BLOCK_R])
            tl.store(pe, y.to(Q.dtype.element_ty), mask=m)
