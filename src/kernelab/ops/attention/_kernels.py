"""The attention family's kernels.

Paged KV cache (``kernelab.ops.attention._paged``): ``k_cache``/``v_cache`` are
``[num_blocks, block_size, heads_kv, head_dim]``; key ``j`` of sequence ``b`` lives in block
``block_tables[b, j // block_size]`` at offset ``j % block_size``; a slot is
``block × block_size + offset``. Offsets into a cache are computed in int64.

Sections: paged KV (``kv_cache_write``, ``merge_attention_states``, ``paged_attention``), then
ragged prefill.
"""

import triton.language as tl

from kernelab.ops._runtime.triton import kernel

# --- paged KV: kv_cache_write, merge_attention_states, paged_attention ------------------------


@kernel
def _kv_cache_write_kernel(
    KCache,
    stride_kc_b,
    stride_kc_s,
    stride_kc_h,
    VCache,
    stride_vc_b,
    stride_vc_s,
    stride_vc_h,
    K,
    stride_k_t,
    stride_k_h,
    V,
    stride_v_t,
    stride_v_h,
    Slots,
    KScale,
    VScale,
    heads,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """One token × BLOCK_H heads per program: k and v rows into the caches at the token's slot;
    a negative slot (padding) writes nothing. FP8: values = fp8(clamp(x / scale, ±FP8_MAX)),
    the division IEEE-rounded as eager PyTorch's.

    Bytes: reads the token's slot, its k and v heads (nothing for padding) and, with FP8, the
    two scales; writes the k and v heads once.
    """
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(Slots + t).to(tl.int64)
    # A padding token has no heads to write (a bound, not `& (slot >= 0)`: Triton's
    # interpreter mistypes a block mask and-ed with a scalar).
    heads_here = tl.where(slot >= 0, heads, 0)
    mask = (h < heads_here)[:, None] & (d < HEAD_DIM)[None, :]
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    hd = h.to(tl.int64)[:, None]
    k = tl.load(K + t * stride_k_t + hd * stride_k_h + d[None, :], mask=mask, other=0.0)
    v = tl.load(V + t * stride_v_t + hd * stride_v_h + d[None, :], mask=mask, other=0.0)
    if FP8:
        k = tl.math.div_rn(k.to(tl.float32), tl.load(KScale))
        v = tl.math.div_rn(v.to(tl.float32), tl.load(VScale))
        k = tl.minimum(tl.maximum(k, -FP8_MAX, tl.PropagateNan.ALL), FP8_MAX, tl.PropagateNan.ALL)
        v = tl.minimum(tl.maximum(v, -FP8_MAX, tl.PropagateNan.ALL), FP8_MAX, tl.PropagateNan.ALL)
    k_dst = KCache + block * stride_kc_b + offset * stride_kc_s + hd * stride_kc_h + d[None, :]
    v_dst = VCache + block * stride_vc_b + offset * stride_vc_s + hd * stride_vc_h + d[None, :]
    tl.store(k_dst, k.to(KCache.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(VCache.dtype.element_ty), mask=mask)


@kernel
def _merge_attention_states_kernel(
    Out,
    stride_o_t,
    stride_o_h,
    OutLse,
    stride_ol_t,
    stride_ol_h,
    States,
    stride_s_s,
    stride_s_t,
    stride_s_h,
    Lse,
    stride_l_s,
    stride_l_t,
    stride_l_h,
    n_states,
    heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    """One token × BLOCK_H heads per program, float32 arithmetic:

        m = max_s lse_s;   w_s = exp(lse_s − m);   out = Σ w_s·o_s / Σ w_s;   lse = m + log Σ w_s

    A part whose lse is −inf has weight 0 and contributes nothing, whatever its values; when
    every part's is, out = 0 and lse = −inf. NaN in an lse propagates.

    Bytes: reads the S log-sum-exps twice (max, then weights) and each state once; writes out
    and its lse once.
    """
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    h_ok = h < heads
    hd = h.to(tl.int64)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for s in range(n_states):
        lse = tl.load(Lse + s * stride_l_s + t * stride_l_t + hd * stride_l_h, mask=h_ok)
        m = tl.maximum(m, lse.to(tl.float32), tl.PropagateNan.ALL)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    mask = h_ok[:, None] & (d < HEAD_DIM)[None, :]
    for s in range(n_states):
        lse = tl.load(Lse + s * stride_l_s + t * stride_l_t + hd * stride_l_h, mask=h_ok)
        w = tl.exp(lse.to(tl.float32) - m_safe)
        rows = States + s * stride_s_s + t * stride_s_t + hd[:, None] * stride_s_h
        x = tl.load(rows + d[None, :], mask=mask & (w > 0)[:, None], other=0.0)
        acc += w[:, None] * x.to(tl.float32)
        total += w
    some = total > 0
    safe = tl.where(some, total, 1.0)
    out = tl.where(some[:, None], acc / safe[:, None], 0.0)
    out = tl.where((total != total)[:, None], float("nan"), out)
    o_rows = Out + t * stride_o_t + hd[:, None] * stride_o_h
    tl.store(o_rows + d[None, :], out.to(Out.dtype.element_ty), mask=mask)
    if WRITE_LSE:
        lse_out = tl.where(some, m + tl.log(safe), float("-inf"))
        lse_out = tl.where(total != total, float("nan"), lse_out)
        tl.store(OutLse + t * stride_ol_t + hd * stride_ol_h, lse_out, mask=h_ok)
