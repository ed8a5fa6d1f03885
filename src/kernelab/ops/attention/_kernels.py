"""The attention family's kernels, one section per op group.

Ragged prefill (``kernelab.ops.attention.attention_prefill``): for each sequence b, query
head h (KV head h // GROUP) and query row r, with the query's position aligned bottom-right,
pos = r + len_k(b) − len_q(b), and the keys j it may see (causal j ≤ pos, window
j ≥ pos − window, the block mask):

    s_j = scale · q_r · k_j                  (softcap: s_j = cap · tanh(s_j / cap))
    lse = log(Σ_j exp(s_j) + exp(sink_h))    (the sink term only with sinks)
    o_r = Σ_j exp(s_j − lse) · v_j           (zeros when no key is visible)
"""

import triton.language as tl

from kernelab.ops._runtime.triton import kernel

# --- ragged prefill ------------------------------------------------------------------------------


@kernel
def _prefill_load(ptrs, rows_ok, d_ok, ROW_MASK: tl.constexpr, EVEN_D: tl.constexpr):
    """A [rows, BLOCK_D] tile, masked along rows (ROW_MASK) and along the padded head dim."""
    if ROW_MASK:
        if EVEN_D:
            return tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
        return tl.load(ptrs, mask=rows_ok[:, None] & d_ok[None, :], other=0.0)
    if EVEN_D:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=d_ok[None, :], other=0.0)


@kernel
def _prefill_tile(
    acc,
    l_i,
    m_i,
    q,
    k_tile,
    v_tile,
    stride_kt,
    stride_vt,
    start_n,
    lo_r,
    hi_r,
    k_len,
    qk_scale,
    softcap,
    d_ok,
    MASKED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One key tile [start_n, start_n + BLOCK_N) of the online softmax, scores in log2 units.

    MASKED tiles hold the sequence's last keys, the diagonal or the window's left edge: a key
    outside its row's visible interval [lo_r, hi_r) gets −inf."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_ok = offs_n < k_len
    rows = offs_n.to(tl.int64)
    k = _prefill_load(
        k_tile + rows[:, None] * stride_kt + offs_d[None, :], k_ok, d_ok, MASKED, EVEN_D
    )
    s = tl.dot(q, tl.trans(k))
    if HAS_SOFTCAP:
        # cap · tanh(x) with tanh(x) = 2 / (1 + e^(−2x)) − 1: exact limits ±cap at ±inf.
        t = s * qk_scale
        s = (2.0 / (1.0 + tl.exp2(t * -2.8853900817779268)) - 1.0) * softcap
    else:
        s = s * qk_scale
    if MASKED:
        allowed = (offs_n[None, :] >= lo_r[:, None]) & (offs_n[None, :] < hi_r[:, None])
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row with nothing visible so far keeps m = −inf; subtract 0 there, never −inf − −inf.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = _prefill_load(
        v_tile + rows[:, None] * stride_vt + offs_d[None, :], k_ok, d_ok, MASKED, EVEN_D
    )
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@kernel
def _attention_prefill_kernel(
    Out,
    stride_ot,
    stride_oh,
    Lse,
    stride_lt,
    stride_lh,
    Q,
    stride_qt,
    stride_qh,
    K,
    stride_kt,
    stride_kh,
    V,
    stride_vt,
    stride_vh,
    CuQ,
    CuK,
    Sinks,
    BlockMask,
    stride_mb,
    stride_mh,
    stride_mq,
    stride_mk,
    batch,
    sm_scale,
    softcap,
    window,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_BLOCK: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_BLOCK_MASK: tl.constexpr,
    RETURN_LSE: tl.constexpr,
):
    """One program per (BLOCK_M query rows of one sequence, query head); float32 accumulation.

    Grid axis 0 has ⌊total_q / BLOCK_M⌋ + batch slots: sequence b owns slots from
    ⌊cu_q[b] / BLOCK_M⌋ + b on (a binary search over cu_q finds it), one more than its blocks
    at most, and a slot past its rows exits at once. Slots run in reverse: the last sequence
    first, each sequence's last query block first (under causal masking it sees the most keys),
    so the longest programs do not start last.

    Key tiles wholly above the diagonal, left of the window or masked out by the block mask are
    never loaded, so FLOPs track the visible scores; tiles entirely visible to every row skip
    the mask arithmetic. Bytes: q read once and o (and lse) written once per program; each key
    tile read once per program that needs it (from L2 for the other query blocks and the
    GROUP query heads of a KV head).
    """
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    kv_head = head // GROUP
    # The sequence b whose slots hold pid: the largest b with ⌊cu_q[b] / BLOCK_M⌋ + b ≤ pid.
    lo = tl.zeros_like(pid)
    hi = lo + batch - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = tl.load(CuQ + mid) // BLOCK_M + mid <= pid
        lo = tl.where(found, mid, lo)
        hi = tl.where(found, hi, mid - 1)
    seq = lo.to(tl.int64)
    q_start = tl.load(CuQ + seq)
    q_len = tl.load(CuQ + seq + 1) - q_start
    m0 = (pid - q_start // BLOCK_M - lo) * BLOCK_M
    if m0 >= q_len:
        return
    k_start = tl.load(CuK + seq)
    k_len = tl.load(CuK + seq + 1) - k_start
    off = k_len - q_len  # bottom-right alignment: row r sits at key position r + off

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    q_rows = (q_start + offs_m).to(tl.int64)
    q = _prefill_load(
        Q + q_rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
        row_ok,
        d_ok,
        True,
        EVEN_D,
    )
    # Each row's visible keys before the block mask: [lo_r, hi_r).
    pos = offs_m + off
    if IS_CAUSAL:
        hi_r = tl.minimum(pos + 1, k_len)
    else:
        hi_r = tl.zeros([BLOCK_M], dtype=tl.int32) + k_len
    if HAS_WINDOW:
        lo_r = tl.maximum(pos - window, 0)
    else:
        lo_r = tl.zeros([BLOCK_M], dtype=tl.int32)
    k_tile = K + k_start.to(tl.int64) * stride_kt + kv_head * stride_kh
    v_tile = V + k_start.to(tl.int64) * stride_vt + kv_head * stride_vh

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if HAS_SINKS:
        # The sink is one more logit in the denominator: start from m = sink, l = e^0 = 1.
        sink = tl.load(Sinks + head).to(tl.float32) * 1.4426950408889634
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + sink
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    else:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + float("-inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_SOFTCAP:
        qk_scale = sm_scale / softcap
        cap = softcap * 1.4426950408889634
    else:
        qk_scale = sm_scale * 1.4426950408889634
        cap = softcap

    # Key range of the block's rows [m0, last]: visible keys [lo_k, hi_k); tiles in
    # [full_lo, full_hi) are visible to every row. Divisions only of non-negative values (the
    # GPU truncates, the interpreter floors).
    last = tl.minimum(m0 + BLOCK_M, q_len) - 1
    if IS_CAUSAL:
        hi_k = tl.maximum(tl.minimum(last + off + 1, k_len), 0)
        full_hi = tl.maximum(tl.minimum(m0 + off + 1, k_len), 0) // BLOCK_N * BLOCK_N
    else:
        hi_k = k_len
        full_hi = k_len // BLOCK_N * BLOCK_N
    lo_k = 0
    full_lo = 0
    if HAS_WINDOW:
        lo_k = tl.maximum(m0 + off - window, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(last + off - window, 0), BLOCK_N) * BLOCK_N
    full_hi = tl.maximum(full_hi, full_lo)
    edge_hi = tl.minimum(full_lo, hi_k)
    tail_lo = tl.maximum(full_hi, full_lo)

    if HAS_BLOCK_MASK:
        # A row sees a key only through a kept tile: marked per tile below.
        seen = tl.zeros([BLOCK_M], dtype=tl.int1)
        mask_row = BlockMask + seq * stride_mb + head * stride_mh + (m0 // MASK_BLOCK) * stride_mq
    else:
        seen = lo_r < hi_r
        mask_row = BlockMask
    # The window's left edge (masked), the tiles every row sees (unmasked, pipelined), the
    # diagonal and the last keys (masked); the masked loops run one or two tiles: not pipelined.
    for start_n in tl.range(lo_k, edge_hi, BLOCK_N, num_stages=1):
        keep = True
        if HAS_BLOCK_MASK:
            keep = tl.load(mask_row + (start_n // MASK_BLOCK) * stride_mk) != 0
        if keep:
            acc, l_i, m_i = _prefill_tile(
                acc, l_i, m_i, q, k_tile, v_tile, stride_kt, stride_vt, start_n, lo_r, hi_r,
                k_len, qk_scale, cap, d_ok, True, HAS_SOFTCAP, EVEN_D, BLOCK_N, BLOCK_D,
            )  # fmt: skip
            if HAS_BLOCK_MASK:
                seen = seen | (tl.maximum(lo_r, start_n) < tl.minimum(hi_r, start_n + BLOCK_N))
    for start_n in range(full_lo, full_hi, BLOCK_N):
        keep = True
        if HAS_BLOCK_MASK:
            keep = tl.load(mask_row + (start_n // MASK_BLOCK) * stride_mk) != 0
        if keep:
            acc, l_i, m_i = _prefill_tile(
                acc, l_i, m_i, q, k_tile, v_tile, stride_kt, stride_vt, start_n, lo_r, hi_r,
                k_len, qk_scale, cap, d_ok, False, HAS_SOFTCAP, EVEN_D, BLOCK_N, BLOCK_D,
            )  # fmt: skip
            if HAS_BLOCK_MASK:
                seen = seen | (tl.maximum(lo_r, start_n) < tl.minimum(hi_r, start_n + BLOCK_N))
    for start_n in tl.range(tail_lo, hi_k, BLOCK_N, num_stages=1):
        keep = True
        if HAS_BLOCK_MASK:
            keep = tl.load(mask_row + (start_n // MASK_BLOCK) * stride_mk) != 0
        if keep:
            acc, l_i, m_i = _prefill_tile(
                acc, l_i, m_i, q, k_tile, v_tile, stride_kt, stride_vt, start_n, lo_r, hi_r,
                k_len, qk_scale, cap, d_ok, True, HAS_SOFTCAP, EVEN_D, BLOCK_N, BLOCK_D,
            )  # fmt: skip
            if HAS_BLOCK_MASK:
                seen = seen | (tl.maximum(lo_r, start_n) < tl.minimum(hi_r, start_n + BLOCK_N))

    # A row that saw keys whose scores were all −inf has l = 0: 0/0 = NaN, as softmax gives. A
    # row that saw none gets zeros (whatever NaN a masked key's v spread into acc).
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    o = tl.where(seen[:, None], o, 0.0)
    o_ptrs = Out + q_rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    if EVEN_D:
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if RETURN_LSE:
        lse = (m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i))) * 0.6931471805599453
        lse = tl.where(l_i == 0.0, float("-inf"), lse)
        lse = tl.where(m_i == float("inf"), m_i, lse)  # +inf, not inf − inf, as logsumexp
        tl.store(Lse + q_rows * stride_lt + head * stride_lh, lse, mask=row_ok)
