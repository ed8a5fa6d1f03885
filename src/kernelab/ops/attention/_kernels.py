"""The attention family's kernels.

Paged KV cache (``kernelab.ops.attention._paged``): ``k_cache``/``v_cache`` are
``[num_blocks, block_size, heads_kv, head_dim]``; key ``j`` of sequence ``b`` lives in block
``block_tables[b, j // block_size]`` at offset ``j % block_size``; a slot is
``block × block_size + offset``. Offsets into a cache are computed in int64.

Sections: paged KV (``kv_cache_write``, ``merge_attention_states``, ``paged_attention``), then
ragged prefill.

Ragged prefill (``kernelab.ops.attention.attention_prefill``): for each sequence b, query
head h (KV head h // GROUP) and query row r, with the query's position aligned bottom-right,
pos = r + len_k(b) − len_q(b), and the keys j it may see (causal j ≤ pos, window
j ≥ pos − window, the block mask):

    s_j = scale · q_r · k_j                  (softcap: s_j = cap · tanh(s_j / cap))
    lse = log(Σ_j exp(s_j) + exp(sink_h))    (the sink term only with sinks)
    o_r = Σ_j exp(s_j − lse) · v_j           (zeros when no key is visible)
"""

import triton.language as tl

from kernelab.core.runtime.triton import kernel

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
    stride_slot,
    KScale,
    VScale,
    heads,
    n_slots,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """One token × BLOCK_H heads per program: k and v rows into the caches at the token's slot;
    a negative slot (padding) writes nothing, nor does one past the caches' n_slots (an
    unchecked slot_mapping never writes outside them). FP8: values =
    fp8(clamp(x / scale, ±FP8_MAX)), the division IEEE-rounded as eager PyTorch's.

    Bytes: reads the token's slot, its k and v heads (nothing for padding) and, with FP8, the
    two scales; writes the k and v heads once.
    """
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(Slots + t * stride_slot).to(tl.int64)
    # A padding token, or a slot past the caches, has no heads to write (a bound, not
    # `& (slot >= 0)`: Triton's interpreter mistypes a block mask and-ed with a scalar).
    heads_here = tl.where((slot >= 0) & (slot < n_slots), heads, 0)
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
    stride_bt_j,
    SeqLens,
    stride_sl,
    CuSeqlensQ,
    stride_cq,
    Sinks,
    stride_sink,
    KScale,
    VScale,
    batch,
    tokens,
    max_blocks,
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

    Unchecked metadata never takes a store (or a read of q, the lengths or the block table)
    outside its tensor: a sequence's query rows are clamped to [0, tokens), its length to
    [0, max_blocks · BLOCK_SIZE] keys of its own table row. Block-table entries are read as
    they are: one outside the cache reads outside it.

    Bytes: reads the block's queries once, the keys and values its rows may see once per KV
    head (for all GROUP heads), one block-table entry per key; writes each output row (and lse)
    once per split.
    """
    LOG2E: tl.constexpr = 1.4426950408889634
    LN2: tl.constexpr = 0.6931471805599453
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    # The causal mask of a score tile of 1024 or more: one compare a score, no `& k_ok` (a
    # query row sits at pos <= kv_len - 1, so kk <= pos keeps it inside its sequence; rows
    # past q_len, never stored, may see the zeros loaded past its end). On gfx942 each
    # compare of the tile is a 64-bit lane mask in scalar registers: two compares and an AND
    # spilled SGPRs at the 106 limit (the 64-row mixed tile, the fp8 decode's 64-key tile).
    # Smaller tiles keep both compares: the one-compare form spilled 8 bytes on sm_100 there.
    ONE_COMPARE: tl.constexpr = BLOCK_M * BLOCK_N >= 1024
    pid_q = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    # The sequence of this query block: the last b with cu_q[b] // BLOCK_Q + b <= pid_q.
    lo = 0
    hi = batch
    while lo < hi:
        mid = (lo + hi) // 2
        go = tl.load(CuSeqlensQ + mid * stride_cq) // BLOCK_Q + mid <= pid_q
        lo = tl.where(go, mid + 1, lo)
        hi = tl.where(go, hi, mid)
    # Offsets from 0 to tokens give seq >= 0 and first >= 0; the clamps (scalars, once a
    # program) keep unchecked ones inside the tensors.
    seq = tl.maximum(lo - 1, 0)
    q_start = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + seq * stride_cq), 0), tokens)
    q_end = tl.minimum(tl.maximum(tl.load(CuSeqlensQ + (seq + 1) * stride_cq), q_start), tokens)
    kv_len = tl.minimum(tl.maximum(tl.load(SeqLens + seq * stride_sl), 0), max_blocks * BLOCK_SIZE)
    first = (pid_q - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # this block's first query
    q_len = tl.where(first >= 0, q_end - q_start, 0)

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
        sink = tl.load(Sinks + head * stride_sink, mask=sink_ok, other=float("-inf"))
        m_i = sink.to(tl.float32) * LOG2E
        l_i = tl.where(m_i > float("-inf"), 1.0, 0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    table = BlockTables + seq.to(tl.int64) * stride_bt
    k_head = KCache + kvh.to(tl.int64) * stride_k_h
    v_head = VCache + kvh.to(tl.int64) * stride_v_h
    for t in range(t_begin, t_end):
        kk = t * BLOCK_N + tl.arange(0, BLOCK_N)
        k_ok = kk < kv_len
        page = tl.load(table + (kk // BLOCK_SIZE) * stride_bt_j, mask=k_ok, other=0).to(tl.int64)
        slot = kk % BLOCK_SIZE
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k_rows = k_head + page[:, None] * stride_k_b + slot[:, None] * stride_k_s
        k = tl.load(k_rows + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(Q.dtype.element_ty))) * qk_scale
        if HAS_SOFTCAP:
            # cap · tanh(s / cap), tanh(x) = 1 − 2 / (exp(2x) + 1): exact limits ±1
            s = softcap * (1.0 - 2.0 / (tl.exp2(s * (2.0 * LOG2E / softcap)) + 1.0))
        s = s * LOG2E
        visible = kk[None, :] <= pos[:, None]
        if not ONE_COMPARE:
            visible = visible & k_ok[None, :]
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
    stride_cq,
    CuK,
    stride_ck,
    Sinks,
    stride_sink,
    BlockMask,
    stride_mb,
    stride_mh,
    stride_mq,
    stride_mk,
    batch,
    total_q,
    total_k,
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

    Unchecked cumulative lengths never take a store, or a read of q, k or v, outside its tensor:
    a sequence's rows are clamped to [0, total_q) and its keys to [0, total_k) (scalars, once a
    program). A block mask too small for the lengths is read past its end.
    """
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    kv_head = head // GROUP
    # The sequence b whose slots hold pid: the largest b with ⌊cu_q[b] / BLOCK_M⌋ + b ≤ pid.
    lo = tl.zeros_like(pid)
    hi = lo + batch - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        found = tl.load(CuQ + mid * stride_cq) // BLOCK_M + mid <= pid
        lo = tl.where(found, mid, lo)
        hi = tl.where(found, hi, mid - 1)
    seq = lo.to(tl.int64)
    # Offsets from 0 to total_q give m0 >= 0 and rows inside q; the clamps hold unchecked ones.
    q_start = tl.minimum(tl.maximum(tl.load(CuQ + seq * stride_cq), 0), total_q)
    q_len = tl.minimum(tl.maximum(tl.load(CuQ + (seq + 1) * stride_cq), q_start), total_q) - q_start
    m0 = (pid - q_start // BLOCK_M - lo) * BLOCK_M
    if (m0 >= q_len) | (m0 < 0):
        return
    k_start = tl.minimum(tl.maximum(tl.load(CuK + seq * stride_ck), 0), total_k)
    k_len = tl.minimum(tl.maximum(tl.load(CuK + (seq + 1) * stride_ck), k_start), total_k) - k_start
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
        sink = tl.load(Sinks + head * stride_sink).to(tl.float32) * 1.4426950408889634
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
