"""The mixture-of-experts family's Triton kernels, and nothing else: launches, heuristics and
the ops live in ``_common`` and the op modules (``moe_topk``, ``moe_align``, ``fused_moe``,
``fused_moe_w4a16``).

Helper, called from the grouped GEMM:

- ``_expert_dot``: one K step of one expert's weight tile (bf16/fp16, int4 codes with
  group-wise scales and zero points in the layout of ``kernelab.ops.packing``, e4m3 with
  128 × 128 block scales and e4m3 activations with 1 × 128 group scales, or mxfp4: packed
  e2m1 with ue8m0 scales per 32 along K, decoded in registers by ``_e2m1_twice`` and
  ``_ue8m0_half``).

Kernels:

- ``_moe_topk_kernel``: router logits → the top-k experts of each token and their weights.
- ``_moe_align_kernel``: the (token, slot) pairs sorted by expert, each expert's run padded to
  the GEMM's BLOCK_M, and the expert of each block.
- ``_fused_moe_kernel``: the grouped GEMM over the aligned blocks (gate+up with the SiLU-gated
  product fused, or the down projection with the routing weight applied).
- ``_moe_sum_kernel``: the sum over each token's top-k outputs (and the shared expert's).
"""

from __future__ import annotations

import triton.language as tl

from kernelab.core.runtime.triton import kernel


@kernel
def _moe_topk_kernel(
    Weights,
    stride_wt,
    Ids,
    stride_it,
    Logits,
    stride_lt,
    stride_le,
    Bias,
    stride_b,
    T,
    E,
    group_size,
    scaling,
    TOPK: tl.constexpr,
    SIGMOID: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    N_GROUP: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """BLOCK_T tokens per program: for each, the TOPK experts and their weights.

    Without a bias or groups, the TOPK largest logits (ties: the lowest expert first; the scores
    are monotone in the logits, so selecting on the logits selects on the scores, exactly).
    Otherwise (DeepSeek-V3), the selection key is c = score + Bias[e] in float32 (score the
    softmax over all E experts or the sigmoid); with N_GROUP > 1 the experts form N_GROUP groups
    of ``group_size`` consecutive ones, each group's score is the sum of its two largest keys,
    the TOPK_GROUP best groups are kept (ties: the lowest group first) and the TOPK largest keys
    are chosen among their experts. The weights are the unbiased scores of the chosen experts,
    optionally divided by their sum, times ``scaling``.

    A NaN key ranks as -inf (ties: the lowest expert); the weights keep the scoring's NaN.

    Bytes: T·E logits and E float32 biases read, T·TOPK float32 weights and int32 ids written.
    """
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    re = tl.arange(0, BLOCK_E)
    t_ok = rt < T
    e_ok = re < E
    x = tl.load(
        Logits + rt[:, None].to(tl.int64) * stride_lt + re[None, :] * stride_le,
        mask=t_ok[:, None] & e_ok[None, :],
        other=float("-inf"),
    ).to(tl.float32)
    if SIGMOID:
        denom = tl.full([BLOCK_T], 1.0, tl.float32)
        row_max = tl.zeros([BLOCK_T], dtype=tl.float32)
    else:
        row_max = tl.where(t_ok, tl.max(x, axis=1), 0.0)
        denom = tl.sum(tl.where(e_ok[None, :], tl.exp(x - row_max[:, None]), 0.0), axis=1)
        denom = tl.where(t_ok, denom, 1.0)
    free = e_ok[None, :] & (rt[:, None] >= 0)
    if HAS_BIAS or N_GROUP > 1:
        if SIGMOID:
            s = tl.sigmoid(x)
        else:
            s = tl.exp(x - row_max[:, None]) / denom[:, None]
        c = s
        if HAS_BIAS:
            c = s + tl.load(Bias + re * stride_b, mask=e_ok, other=0.0).to(tl.float32)[None, :]
        c = tl.where(free & (c == c), c, float("-inf"))  # a NaN key ranks as -inf
        if N_GROUP > 1:
            ge = re // group_size  # >= N_GROUP past E
            rg = tl.arange(0, BLOCK_G)
            scores = tl.full([BLOCK_T, BLOCK_G], float("-inf"), tl.float32)
            for g in range(N_GROUP):
                in_g = (ge == g)[None, :] & free
                top1 = tl.max(tl.where(in_g, c, float("-inf")), axis=1)
                i1 = tl.min(tl.where(in_g & (c == top1[:, None]), re[None, :], BLOCK_E), axis=1)
                rest = in_g & (re[None, :] != i1[:, None])
                top2 = tl.max(tl.where(rest, c, float("-inf")), axis=1)
                scores = tl.where(rg[None, :] == g, (top1 + top2)[:, None], scores)
            keep = free & (re[None, :] < 0)
            # groups taken so far (and the padding past N_GROUP), as a mask: a taken group's
            # score set to -inf would still tie with groups scored -inf
            taken = (rg[None, :] >= N_GROUP) & (rt[:, None] >= 0)
            for _ in tl.static_range(TOPK_GROUP):
                best_g = tl.max(tl.where(taken, float("-inf"), scores), axis=1)
                open_best = ~taken & (scores == best_g[:, None])
                gi = tl.min(tl.where(open_best, rg[None, :], BLOCK_G), axis=1)
                taken = taken | (rg[None, :] == gi[:, None])
                keep = keep | (ge[None, :] == gi[:, None])
            free = free & keep
        key_all = c
    else:
        key_all = tl.where(x == x, x, float("-inf"))  # a NaN logit ranks as -inf
    total = tl.zeros([BLOCK_T], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        key = tl.where(free, key_all, float("-inf"))
        best = tl.max(key, axis=1)
        cand = free & (key == best[:, None])
        idx = tl.min(tl.where(cand, re[None, :], BLOCK_E), axis=1)
        idx = tl.minimum(idx, E - 1)
        free = free & (re[None, :] != idx[:, None])
        if HAS_BIAS or N_GROUP > 1:
            w = tl.sum(tl.where(re[None, :] == idx[:, None], s, 0.0), axis=1)
        elif SIGMOID:  # the chosen logit itself (a NaN one ranked as -inf, but weighs NaN)
            w = tl.sigmoid(tl.sum(tl.where(re[None, :] == idx[:, None], x, 0.0), axis=1))
        else:
            w = tl.exp(best - row_max) / denom
        total += w
        tl.store(Ids + rt.to(tl.int64) * stride_it + j, idx.to(Ids.dtype.element_ty), mask=t_ok)
        if not RENORMALIZE:
            w = w * scaling
        tl.store(Weights + rt.to(tl.int64) * stride_wt + j, w, mask=t_ok)
    if RENORMALIZE:
        # A second pass over the TOPK weights of this program's tokens (its own stores).
        total = tl.where(t_ok, total, 1.0)
        tl.debug_barrier()
        for j in tl.static_range(TOPK):
            ptr = Weights + rt.to(tl.int64) * stride_wt + j
            w = tl.load(ptr, mask=t_ok, other=1.0)
            tl.store(ptr, w / total * scaling, mask=t_ok)


@kernel
def _moe_align_kernel(
    SortedIds,
    ExpertIds,
    NumPostPadded,
    TopkIds,
    numel,
    E,
    padded_len,
    num_blocks,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One program. The flat (token, slot) index i = t·top_k + j of every pair, grouped by
    expert TopkIds[i] in expert order (in order of i within an expert), each expert's run
    padded with the sentinel ``numel`` to a multiple of BLOCK_SIZE: SortedIds [padded_len];
    ExpertIds [num_blocks] the expert of each block of BLOCK_SIZE entries (−1 past the end);
    NumPostPadded [1] the padded length in use. An id outside [0, E) is never placed.

    Bytes: the numel ids read twice; padded_len + num_blocks + 1 int32 written.
    """
    re = tl.arange(0, BLOCK_E)
    rc = tl.arange(0, CHUNK)
    counts = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, numel, CHUNK):
        ri = start + rc
        ids = tl.load(TopkIds + ri, mask=ri < numel, other=-1)
        hit = (ids[:, None] == re[None, :]) & (ids[:, None] < E) & (ri[:, None] < numel)
        counts += tl.sum(hit.to(tl.int32), axis=0)
    padded = tl.cdiv(counts, BLOCK_SIZE) * BLOCK_SIZE
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(NumPostPadded, total)
    block_ends = ends // BLOCK_SIZE
    for b0 in range(0, num_blocks, CHUNK):
        rb = b0 + rc
        expert = tl.sum((block_ends[None, :] <= rb[:, None]).to(tl.int32), axis=1)
        expert = tl.where(rb < total // BLOCK_SIZE, expert, -1)
        tl.store(ExpertIds + rb, expert, mask=rb < num_blocks)
    for p0 in range(0, padded_len, CHUNK):
        rp = p0 + rc
        tl.store(SortedIds + rp, tl.zeros([CHUNK], dtype=tl.int32) + numel, mask=rp < padded_len)
    tl.debug_barrier()  # the sentinel fill lands before the pairs overwrite it
    running = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, numel, CHUNK):
        ri = start + rc
        ids = tl.load(TopkIds + ri, mask=ri < numel, other=-1)
        hit = ((ids[:, None] == re[None, :]) & (ids[:, None] < E) & (ri[:, None] < numel)).to(
            tl.int32
        )
        rank = tl.cumsum(hit, axis=0) - hit
        pos = tl.sum(hit * (starts[None, :] + running[None, :] + rank), axis=1)
        placed = tl.sum(hit, axis=1) > 0
        tl.store(SortedIds + pos, ri, mask=placed)
        running += tl.sum(hit, axis=0)


@kernel
def _e2m1_twice(q):
    """Twice the value of the e2m1 codes ``q`` (int32, 0..15: bit 3 the sign, bits 1-2 the
    exponent e, bit 0 the mantissa m), as float32: an integer, 0, 1 (subnormal) or
    (2 + m) · 2^(e − 1); integer arithmetic and one conversion, exact."""
    mag = q & 7
    twice = tl.where(mag < 2, mag, (2 + (mag & 1)) << tl.maximum((mag >> 1) - 1, 0))
    return tl.where((q & 8) != 0, -twice, twice).to(tl.float32)


@kernel
def _ue8m0_half(s):
    """2^(s − 128), half the scale of the ue8m0 bytes ``s`` (int32), as float32 built from its
    bits (a subnormal for s < 2), NaN for 255: times ``_e2m1_twice``, the scaled value, exact
    (at most 4 significant bits) while it lies in float32's range."""
    half_bits = tl.where(s >= 2, (s - 1) << 23, (1 << 21) << tl.minimum(s, 1))
    return tl.where(s == 255, float("nan"), half_bits.to(tl.float32, bitcast=True))


@kernel
def _expert_dot(
    acc,
    a,
    B,
    stride_bn,
    stride_bk,
    S,
    stride_sk,
    stride_sn,
    Z,
    stride_zk,
    stride_zn,
    sa,
    rn,
    n_ok,
    k0,
    K,
    W4: tl.constexpr,
    FP8: tl.constexpr,
    MX4: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """acc + a · W[k0 : k0 + BLOCK_K, rn] for one expert. Dense: B is the expert's [N, K]
    weight (an nn.Linear's). W4: B is its uint8 codes [K/2, N] (k = 2i low nibble, 2i + 1
    high), S and Z its scales and zero points [K/G, N]; the K step lies in one group. FP8: B is
    its e4m3 [N, K] weight and S its float32 block scales [⌈N/G⌉, ⌈K/G⌉] (G = 128), ``a`` e4m3
    with ``sa`` its rows' scales of this K block: the e4m3 product summed on tensor cores in
    float32, then times sa[m] · S[n // G, k0 // G] (the K step lies in one block). MX4: B is
    its mxfp4 bytes [N, K/2] (k = 2i low nibble, 2i + 1 high) and S its ue8m0 scales
    [N, K/32] (uint8); the weights decoded to a's dtype with their 32-group's scale applied
    (exact for bfloat16) and multiplied on tensor cores (BLOCK_K a multiple of 32)."""
    if W4:
        kq = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        q = tl.load(
            B + kq[:, None].to(tl.int64) * stride_bk + rn[None, :] * stride_bn,
            mask=(kq[:, None] < K // 2) & n_ok[None, :],
            other=0,
        ).to(tl.int32)
        g = k0 // GROUP_SIZE
        s = tl.load(S + g * stride_sk + rn * stride_sn, mask=n_ok, other=0.0).to(tl.float32)
        z = tl.load(Z + g * stride_zk + rn * stride_zn, mask=n_ok, other=0).to(tl.int32)
        w_lo = ((q & 15) - z[None, :]).to(a.dtype)
        w_hi = ((q >> 4) - z[None, :]).to(a.dtype)
        a_even, a_odd = tl.split(tl.reshape(a, (a.shape[0], BLOCK_K // 2, 2)))
        acc += (tl.dot(a_even, w_lo) + tl.dot(a_odd, w_hi)) * s[None, :]
    elif MX4:
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)  # byte i holds k = 2i and 2i + 1
        q = tl.load(
            B + rn[None, :].to(tl.int64) * stride_bn + kb[:, None] * stride_bk,
            mask=(kb[:, None] < K // 2) & n_ok[None, :],
            other=0,
        ).to(tl.int32)
        # one scale per 32-group of k (16 bytes), made a factor once, spread over its bytes
        kg = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        s = tl.load(
            S + rn[None, :].to(tl.int64) * stride_sn + kg[:, None] * stride_sk,
            mask=(kg[:, None] < K // 32) & n_ok[None, :],
            other=127,
        ).to(tl.int32)
        half = _ue8m0_half(s)[:, None, :]
        f = tl.broadcast_to(half, (BLOCK_K // 32, 16, half.shape[2]))
        f = tl.reshape(f, (BLOCK_K // 2, half.shape[2]))
        w_even = (_e2m1_twice(q & 15) * f).to(a.dtype)
        w_odd = (_e2m1_twice(q >> 4) * f).to(a.dtype)
        a_even, a_odd = tl.split(tl.reshape(a, (a.shape[0], BLOCK_K // 2, 2)))
        acc = tl.dot(a_odd, w_odd, tl.dot(a_even, w_even, acc))
    elif FP8:
        rk = k0 + tl.arange(0, BLOCK_K)
        b = tl.load(
            B + rn[None, :].to(tl.int64) * stride_bn + rk[:, None] * stride_bk,
            mask=(rk[:, None] < K) & n_ok[None, :],
            other=0.0,
        )
        sb = tl.load(
            S + (rn // GROUP_SIZE) * stride_sn + (k0 // GROUP_SIZE) * stride_sk,
            mask=n_ok,
            other=0.0,
        )
        acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
    else:
        rk = k0 + tl.arange(0, BLOCK_K)
        b = tl.load(
            B + rn[None, :].to(tl.int64) * stride_bn + rk[:, None] * stride_bk,
            mask=(rk[:, None] < K) & n_ok[None, :],
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    return acc


@kernel
def _fused_moe_kernel(
    C,
    stride_cm,
    stride_cn,
    A,
    stride_am,
    stride_ak,
    SA,
    stride_sam,
    stride_sak,
    B,
    stride_be,
    stride_bn,
    stride_bk,
    S,
    stride_se,
    stride_sk,
    stride_sn,
    Z,
    stride_ze,
    stride_zk,
    stride_zn,
    TopkWeights,
    SortedIds,
    ExpertIds,
    NumPostPadded,
    N,
    K,
    numel,
    E,
    num_blocks,
    up_offset,
    A_ROW_DIV: tl.constexpr,
    ROUTED: tl.constexpr,
    GATE_UP: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    W4: tl.constexpr,
    FP8: tl.constexpr,
    MX4: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One BLOCK_M × BLOCK_N tile of one expert per program (m fastest: consecutive programs
    share the expert's weight tile). ROUTED: the block's rows are the pairs SortedIds[m-block]
    (the sentinel ``numel`` masks padding) of expert ExpertIds[m-block]; otherwise rows
    0..numel−1 of expert 0 (the shared expert). Row r reads A[r // A_ROW_DIV] and writes C[r].

    GATE_UP: C = silu(A·Wg) ⊙ (A·Wu), Wg the expert's first N output rows, Wu the N rows from
    ``up_offset`` (two accumulators, one rounding). MUL_WEIGHT: C = TopkWeights[r] · (A·W), in
    float32 before the rounding (vLLM's and transformers' place for the routing weight: after
    the down projection, before the sum over top-k).

    FP8: A is e4m3 with float32 scales SA [rows of A, ⌈K/G⌉] (one per row and G = 128
    columns), B e4m3 with block scales S (see ``_expert_dot``); BLOCK_K divides G. MX4: B
    mxfp4 with ue8m0 scales S per 32 along K, A in float16/bfloat16 (weight-only).

    Bytes: each expert hit reads its weight tiles once per m-block (from L2 across m-blocks),
    A rows re-read per n tile, C written once.
    """
    pid = tl.program_id(0).to(tl.int64)
    pid_m = pid % num_blocks
    pid_n = pid // num_blocks
    rm = tl.arange(0, BLOCK_M)
    if ROUTED:
        if pid_m * BLOCK_M >= tl.load(NumPostPadded):
            return
        expert = tl.load(ExpertIds + pid_m)
        if expert < 0:
            return
        if expert >= E:
            return
        rows = tl.load(SortedIds + pid_m * BLOCK_M + rm)
    else:
        expert = 0
        rows = pid_m * BLOCK_M + rm
    row_ok = (rows >= 0) & (rows < numel)
    rows = tl.where(row_ok, rows, 0).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    a_rows = A + (rows // A_ROW_DIV)[:, None] * stride_am
    sa_rows = SA + (rows // A_ROW_DIV) * stride_sam
    b = B + expert.to(tl.int64) * stride_be
    s = S + expert.to(tl.int64) * stride_se
    z = Z + expert.to(tl.int64) * stride_ze
    # In the int4 layout the up columns follow the gate columns (N is the fast axis there); in
    # the [2N, K] dense layout the up rows do. Either way the offset moves along stride_bn.
    ru = rn + up_offset
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            a_rows + rk[None, :] * stride_ak, mask=row_ok[:, None] & (rk[None, :] < K), other=0.0
        )
        if FP8:
            sa = tl.load(sa_rows + (k0 // GROUP_SIZE) * stride_sak, mask=row_ok, other=0.0)
        else:
            sa = tl.zeros([BLOCK_M], dtype=tl.float32)  # unused
        acc = _expert_dot(
            acc,
            a,
            b,
            stride_bn,
            stride_bk,
            s,
            stride_sk,
            stride_sn,
            z,
            stride_zk,
            stride_zn,
            sa,
            rn,
            n_ok,
            k0,
            K,
            W4,
            FP8,
            MX4,
            GROUP_SIZE,
            BLOCK_K,
        )
        if GATE_UP:
            acc_up = _expert_dot(
                acc_up,
                a,
                b,
                stride_bn,
                stride_bk,
                s,
                stride_sk,
                stride_sn,
                z,
                stride_zk,
                stride_zn,
                sa,
                ru,
                n_ok,
                k0,
                K,
                W4,
                FP8,
                MX4,
                GROUP_SIZE,
                BLOCK_K,
            )
    if GATE_UP:
        acc = acc * tl.sigmoid(acc) * acc_up
    if MUL_WEIGHT:
        acc = acc * tl.load(TopkWeights + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    c_ptrs = C + rows[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@kernel
def _moe_sum_kernel(
    Out,
    stride_ot,
    Parts,
    stride_pt,
    stride_pj,
    Shared,
    stride_st,
    TopkIds,
    stride_it,
    T,
    H,
    E,
    TOPK: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Out[t] = Σ_j Parts[t, j] (+ Shared[t]) in float32, one rounding; a slot whose expert id
    is outside [0, E) contributes nothing (its part was never computed).

    Bytes: T·TOPK·H parts (+ T·H shared) and T·TOPK ids read, T·H written.
    """
    rt = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    rh = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    t_ok = rt < T
    h_ok = rh < H
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(TopkIds + rt.to(tl.int64) * stride_it + j, mask=t_ok, other=-1)
        ok = t_ok & (e >= 0) & (e < E)
        acc += tl.load(
            Parts + rt.to(tl.int64)[:, None] * stride_pt + j * stride_pj + rh[None, :],
            mask=ok[:, None] & h_ok[None, :],
            other=0.0,
        ).to(tl.float32)
    mask = t_ok[:, None] & h_ok[None, :]
    if HAS_SHARED:
        acc += tl.load(
            Shared + rt.to(tl.int64)[:, None] * stride_st + rh[None, :], mask=mask, other=0.0
        ).to(tl.float32)
    tl.store(
        Out + rt.to(tl.int64)[:, None] * stride_ot + rh[None, :],
        acc.to(Out.dtype.element_ty),
        mask=mask,
    )
