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
