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


@kernel
def _paged_attention_kernel(
    O,
    stride_o_s,
    stride_o_t,
    stride_o_h,
    L,
    stride_l_s,
    stride_l_t,
    stride_l_h,
    Q,
    stride_q_t,
    stride_q_h,
    KCache,
    stride_k_b,
    stride_k_s,
    stride_k_h,
    VCache,
    stride_v_b,
    stride_v_s,
    stride_v_h,
    BlockTables,
    stride_bt,
    SeqLens,
    CuSeqlensQ,
    Sinks,
    KScale,
    VScale,
    batch,
    scale,
    softcap,
    window,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    FP8: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    """Queries of one sequence against its paged keys; one program per (query block, KV head,
    split). Conventions in ``kernelab.ops.attention.paged_attention``.

    GQA packing: a program holds BLOCK_Q queries × the GROUP query heads of its KV head, so
    the scores are one tl.dot of M = BLOCK_Q·GROUP_PAD rows against a tile of BLOCK_N keys
    (M ≥ 16 at decode: tensor cores), and each key and value tile is read once for the group.
    Query i of a sequence with q_len queries and kv_len keys sits at position
    kv_len − q_len + i (causal, aligned bottom-right) and sees keys j ≤ its position and, with a
    window W, position − j < W. Keys are gathered through the block table: key j in block
    table[b, j // BLOCK_SIZE] at offset j % BLOCK_SIZE, offsets in int64.

    Online softmax in float32 and base 2; a sink (per query head) is a key of value 0 with
    the learned logit, counted once (split 0). NUM_SPLITS > 1 (flash-decoding): split s takes
    its share of the program's key tiles and writes its normalised output and log-sum-exp to
    the float32 workspace O/L[s], which the merge kernel reduces; empty shares write 0 and −inf.
    Rows without a visible key (and no sink) are 0 with lse −inf. fp8 caches: values are exact
    in the query's 16-bit type; k_scale folds into the score scale, v_scale into the output.

    Bytes: reads the block's queries once, the keys and values its rows may see once per KV
    head (for all GROUP heads), one block-table entry per key; writes each output row (and lse)
    once per split.
    """
    LOG2E: tl.constexpr = 1.4426950408889634
    LN2: tl.constexpr = 0.6931471805599453
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    pid_q = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    # The sequence of this query block: the last b with cu_q[b] // BLOCK_Q + b <= pid_q.
    lo = 0
    hi = batch
    while lo < hi:
        mid = (lo + hi) // 2
        go = tl.load(CuSeqlensQ + mid) // BLOCK_Q + mid <= pid_q
        lo = tl.where(go, mid + 1, lo)
        hi = tl.where(go, hi, mid)
    seq = lo - 1
    q_start = tl.load(CuSeqlensQ + seq)
    q_len = tl.load(CuSeqlensQ + seq + 1) - q_start
    kv_len = tl.load(SeqLens + seq)
    first = (pid_q - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # this block's first query

    r = tl.arange(0, BLOCK_M)
    qi = first + r // GROUP_PAD
    g = r % GROUP_PAD
    row_ok = (qi < q_len) & (g < GROUP)
    token = (q_start + qi).to(tl.int64)
    head = (kvh * GROUP + g).to(tl.int64)
    pos = kv_len - q_len + qi
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    # Keys any row of the block sees, in whole tiles, and this split's share of them.
    last = tl.minimum(first + BLOCK_Q, q_len) - 1
    k_hi = tl.maximum(tl.minimum(kv_len - q_len + last + 1, kv_len), 0)
    k_lo = 0
    if HAS_WINDOW:
        k_lo = tl.maximum(kv_len - q_len + first - window + 1, 0)
    k_hi = tl.where(first < q_len, k_hi, 0)
    t_lo = k_lo // BLOCK_N
    n_tiles = tl.maximum(tl.cdiv(k_hi, BLOCK_N) - t_lo, 0)
    per_split = tl.cdiv(n_tiles, NUM_SPLITS)
    t_begin = t_lo + split * per_split
    t_end = tl.minimum(t_begin + per_split, t_lo + n_tiles)

    q_rows = Q + token[:, None] * stride_q_t + head[:, None] * stride_q_h
    q = tl.load(q_rows + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    qk_scale = scale
    if FP8:
        qk_scale = scale * tl.load(KScale)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:
        # split 0 only (a bound, not `& (split == 0)`: see _kv_cache_write_kernel)
        sink_ok = row_ok & (r < tl.where(split == 0, BLOCK_M, 0))
        sink = tl.load(Sinks + head, mask=sink_ok, other=float("-inf"))
        m_i = sink.to(tl.float32) * LOG2E
        l_i = tl.where(m_i > float("-inf"), 1.0, 0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    table = BlockTables + seq.to(tl.int64) * stride_bt
    k_head = KCache + kvh.to(tl.int64) * stride_k_h
    v_head = VCache + kvh.to(tl.int64) * stride_v_h
    for t in range(t_begin, t_end):
        kk = t * BLOCK_N + tl.arange(0, BLOCK_N)
        k_ok = kk < kv_len
        page = tl.load(table + kk // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot = kk % BLOCK_SIZE
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k_rows = k_head + page[:, None] * stride_k_b + slot[:, None] * stride_k_s
        k = tl.load(k_rows + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(Q.dtype.element_ty))) * qk_scale
        if HAS_SOFTCAP:
            # cap · tanh(s / cap), tanh(x) = 1 − 2 / (exp(2x) + 1): exact limits ±1
            s = softcap * (1.0 - 2.0 / (tl.exp2(s * (2.0 * LOG2E / softcap)) + 1.0))
        s = s * LOG2E
        visible = (kk[None, :] <= pos[:, None]) & k_ok[None, :]
        if HAS_WINDOW:
            visible = visible & (pos[:, None] - kk[None, :] < window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v_rows = v_head + page[:, None] * stride_v_b + slot[:, None] * stride_v_s
        v = tl.load(v_rows + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(Q.dtype.element_ty), v.to(Q.dtype.element_ty))
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if FP8:
        out = out * tl.load(VScale)
    out = tl.where(empty[:, None], 0.0, out)
    o_rows = O + split * stride_o_s + token[:, None] * stride_o_t + head[:, None] * stride_o_h
    tl.store(o_rows + d[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if WRITE_LSE:
        lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
        tl.store(L + split * stride_l_s + token * stride_l_t + head * stride_l_h, lse, mask=row_ok)
