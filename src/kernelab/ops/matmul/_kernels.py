"""The GEMM family's Triton kernels, and nothing else: launches, heuristics and the ops live in
the op modules (``gemm``, ``fp8_gemm``, the weight-only GEMMs) and ``_common``.

Helpers, called from the kernels below:

- ``_tile_coords``: grouped tile ordering (L2 reuse of the B tiles a group of row-tiles shares).
- ``_epilogue``: the fused activation(acc + bias) + residual, in float32.
- ``_gemm_tile``: the K loop of one output tile (dense GEMM and fp8 GEMM).

Kernels:

- ``_splitk_reduce_kernel``: the deterministic split-K reduction (sum of the slices in a fixed
  order, then the epilogue), shared by ``gemm`` and the weight-only GEMMs.
- ``_gemm_kernel``: one tile per program in grouped order, optionally one K slice per program.
- ``_gemm_persistent_kernel``: one program per SM walking the tiles.
- ``_gemm_tma_kernel``: tiles fetched through TMA tensor descriptors (the Hopper path).
- ``_fp8_gemm_kernel``: e4m3 inputs, per-tensor or per-row/per-column scales (``fp8_gemm``).
- ``_wq_gemm_kernel``: int4/int8 weight-only GEMM, constexpr BITS (``w4a16``, ``w8a16``).
- ``_fp8_block_gemm_kernel``: e4m3 with 1 × 128 activation and 128 × 128 weight block scales
  applied per K block inside the loop (``fp8_block_gemm``).
- ``_mx_gemm_kernel``: mxfp4 / mxfp8 weights through ``tl.dot_scaled``, bf16 activations or
  activations quantized to the weight's format in the kernel (``mx_gemm``); its helper
  ``_mx_quantize``.
- ``_nvfp4_gemm_kernel``: nvfp4 weights (e4m3 scales per 16 values, a per-tensor scale)
  through ``tl.dot_scaled``, bf16 activations or activations quantized to nvfp4 in the kernel
  (``nvfp4_gemm``); its helper ``_nvfp4_quantize``.
"""

from __future__ import annotations

import triton.language as tl

from kernelab.core.runtime.triton import kernel

# --- helpers ------------------------------------------------------------------------------------


@kernel
def _tile_coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row-tiles sweep the columns together, so the B tiles they
    share are still in L2 when the next row-tile of the group needs them."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    group = tile // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % size_m
    pid_n = (tile % width) // size_m
    return pid_m, pid_n


@kernel
def _epilogue(
    acc,
    rm,
    rn,
    M,
    N,
    Bias,
    Res,
    stride_rm,
    stride_rn,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """acc (float32) → activation(acc + bias) + residual, still in float32."""
    if HAS_BIAS:
        bias = tl.load(Bias + rn, mask=rn < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    if ACTIVATION == 1:
        acc = acc * tl.sigmoid(acc)
    elif ACTIVATION == 2:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    if HAS_RESIDUAL:
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        res_ptrs = Res + rm[:, None].to(tl.int64) * stride_rm + rn[None, :] * stride_rn
        acc = acc + tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)
    return acc


@kernel
def _gemm_tile(
    A,
    stride_am,
    stride_ak,
    B,
    stride_bk,
    stride_bn,
    M,
    N,
    k_start,
    k_stop,
    pid_m,
    pid_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Σ over k in [k_start, k_stop) of A[rm, k]·B[k, rn] for one tile, in float32."""
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_rows = A + rm[:, None].to(tl.int64) * stride_am
    b_cols = B + rn[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, k_stop, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            a_rows + kk[None, :] * stride_ak,
            mask=(rm[:, None] < M) & (kk[None, :] < k_stop),
            other=0.0,
        )
        b = tl.load(
            b_cols + kk[:, None] * stride_bk,
            mask=(kk[:, None] < k_stop) & (rn[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    return acc


# --- kernels ------------------------------------------------------------------------------------


@kernel
def _splitk_reduce_kernel(
    C,
    stride_cm,
    stride_cn,
    Part,
    stride_ps,
    stride_pm,
    Scale,
    Bias,
    Res,
    stride_rm,
    stride_rn,
    M,
    N,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """C = epilogue(sum over s of Part[s] (× per-column Scale)), summed in a fixed order.

    Bytes: reads SPLIT_K·M·N float32 partials (+ bias, residual), writes M·N outputs.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm[:, None].to(tl.int64) * stride_pm + rn[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(Part + s * stride_ps + offs, mask=mask, other=0.0)
    if HAS_SCALE:
        acc = acc * tl.load(Scale + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    acc = _epilogue(
        acc, rm, rn, M, N, Bias, Res, stride_rm, stride_rn, HAS_BIAS, ACTIVATION, HAS_RESIDUAL
    )
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask)


@kernel
def _gemm_kernel(
    C,
    stride_cs,
    stride_cm,
    stride_cn,
    A,
    stride_am,
    stride_ak,
    B,
    stride_bk,
    stride_bn,
    Bias,
    Res,
    stride_rm,
    stride_rn,
    M,
    N,
    K,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """One BLOCK_M×BLOCK_N tile of C per program (axis 0, grouped order), one K slice per
    program on axis 1. SPLIT_K == 1: C = epilogue(A·B) in C's dtype. SPLIT_K > 1: C is the
    float32 workspace [SPLIT_K, M, N] and slice s holds A[:, Ks]·B[Ks, :] (no epilogue).

    Bytes: each program reads BLOCK_M·K of A and K·BLOCK_N of B (re-reads hit L2 thanks to the
    grouped order), and writes its tile once.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = _tile_coords(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_start = pid_k * k_per_split
    k_stop = tl.minimum(K, k_start + k_per_split)
    acc = _gemm_tile(
        A,
        stride_am,
        stride_ak,
        B,
        stride_bk,
        stride_bn,
        M,
        N,
        k_start,
        k_stop,
        pid_m,
        pid_n,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT_K == 1:
        acc = _epilogue(
            acc, rm, rn, M, N, Bias, Res, stride_rm, stride_rn, HAS_BIAS, ACTIVATION, HAS_RESIDUAL
        )
    c_ptrs = C + pid_k * stride_cs + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@kernel
def _gemm_persistent_kernel(
    C,
    stride_cm,
    stride_cn,
    A,
    stride_am,
    stride_ak,
    B,
    stride_bk,
    stride_bn,
    Bias,
    Res,
    stride_rm,
    stride_rn,
    M,
    N,
    K,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """num_programs programs (one per SM) each walk tiles pid, pid + num_programs, ... in
    grouped order: no tail wave of half-empty SMs, and one launch's worth of set-up per SM.
    Bytes as ``_gemm_kernel``."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), num_tiles, num_programs):
        pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _gemm_tile(
            A,
            stride_am,
            stride_ak,
            B,
            stride_bk,
            stride_bn,
            M,
            N,
            0,
            K,
            pid_m,
            pid_n,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
        )
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue(
            acc, rm, rn, M, N, Bias, Res, stride_rm, stride_rn, HAS_BIAS, ACTIVATION, HAS_RESIDUAL
        )
        c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@kernel
def _gemm_tma_kernel(
    C,
    stride_cm,
    stride_cn,
    a_desc,
    b_desc,
    Bias,
    Res,
    stride_rm,
    stride_rn,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    B_IS_NK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """``_gemm_kernel`` (SPLIT_K = 1) with A and B tiles fetched by TMA: the copy engine
    writes shared memory directly, zero-filling out-of-bounds rows, and the compiler issues
    wgmma on sm_90. B is read through a [BLOCK_N, BLOCK_K] box of the [N, K] weight
    (B_IS_NK) or a [BLOCK_K, BLOCK_N] box of a [K, N] matrix. Bytes as ``_gemm_kernel``."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k0])
        if B_IS_NK:
            b = b_desc.load([off_n, k0]).T
        else:
            b = b_desc.load([k0, off_n])
        acc = tl.dot(a, b, acc)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    acc = _epilogue(
        acc, rm, rn, M, N, Bias, Res, stride_rm, stride_rn, HAS_BIAS, ACTIVATION, HAS_RESIDUAL
    )
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@kernel
def _fp8_gemm_kernel(
    C,
    stride_cm,
    stride_cn,
    A,
    stride_am,
    stride_ak,
    B,
    stride_bk,
    stride_bn,
    SA,
    SB,
    Bias,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ROW_SCALE_A: tl.constexpr,
    COL_SCALE_B: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """One output tile per program in grouped order; fp8 tiles multiplied on tensor cores
    into float32, then scaled by scale_a[row] · scale_b[col] and rounded to C's dtype.

    Bytes: M·K + K·N (one byte each), the scales, and 2·M·N for the bfloat16 output.
    """
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = _gemm_tile(
        A,
        stride_am,
        stride_ak,
        B,
        stride_bk,
        stride_bn,
        M,
        N,
        0,
        K,
        pid_m,
        pid_n,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
    )
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if ROW_SCALE_A:
        sa = tl.load(SA + rm, mask=rm < M, other=0.0)
    else:
        sa = tl.load(SA + rm * 0)
    if COL_SCALE_B:
        sb = tl.load(SB + rn, mask=rn < N, other=0.0)
    else:
        sb = tl.load(SB + rn * 0)
    acc = acc * sa[:, None] * sb[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(Bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


@kernel
def _wq_gemm_kernel(
    C,
    stride_cs,
    stride_cm,
    stride_cn,
    X,
    stride_xm,
    stride_xk,
    Q,
    stride_qk,
    stride_qn,
    S,
    stride_sk,
    Z,
    stride_zk,
    Bias,
    M,
    N,
    K,
    k_per_split,
    BITS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """One output tile and one K slice per program (axes 0 and 1).

    BITS == 4: Q is uint8 [K/2, N] (k = 2i low nibble, 2i + 1 high), S and Z are [K/G, N];
    each BLOCK_K step lies in one group (GROUP_SIZE % BLOCK_K == 0). BITS == 8: Q is int8
    [K, N], S is [N]. SPLIT_K == 1: C = x·W (+ bias) in C's dtype; SPLIT_K > 1: C is the
    float32 workspace [SPLIT_K, M, N] of unscaled-by-column partial sums (int8 scale and bias
    are applied by the reduction).

    Bytes: the weight at its packed width (K·N/2 or K·N) plus scales and zeros, read once per
    row-tile; x (M·K) re-read per column tile from L2; C written once.
    """
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    k_start = pid_k * k_per_split
    k_stop = tl.minimum(K, k_start + k_per_split)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = X + rm[:, None].to(tl.int64) * stride_xm
    q_cols = Q + rn[None, :].to(tl.int64) * stride_qn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if BITS == 4:
        rh = tl.arange(0, BLOCK_K // 2)
        for k0 in range(k_start, k_stop, BLOCK_K):
            kq = k0 // 2 + rh
            q = tl.load(
                q_cols + kq[:, None].to(tl.int64) * stride_qk,
                mask=(kq[:, None] < k_stop // 2) & n_ok[None, :],
                other=0,
            ).to(tl.int32)
            g = k0 // GROUP_SIZE
            s = tl.load(S + g * stride_sk + rn, mask=n_ok, other=0.0).to(tl.float32)
            z = tl.load(Z + g * stride_zk + rn, mask=n_ok, other=0).to(tl.int32)
            w_lo = ((q & 15) - z[None, :]).to(X.dtype.element_ty)
            w_hi = ((q >> 4) - z[None, :]).to(X.dtype.element_ty)
            kk = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(
                x_rows + kk[None, :] * stride_xk,
                mask=m_ok[:, None] & (kk[None, :] < k_stop),
                other=0.0,
            )
            x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_M, BLOCK_K // 2, 2)))
            part = tl.dot(x_even, w_lo) + tl.dot(x_odd, w_hi)
            acc += part * s[None, :]
    else:
        rk = tl.arange(0, BLOCK_K)
        for k0 in range(k_start, k_stop, BLOCK_K):
            kk = k0 + rk
            q = tl.load(
                q_cols + kk[:, None].to(tl.int64) * stride_qk,
                mask=(kk[:, None] < k_stop) & n_ok[None, :],
                other=0,
            )
            x = tl.load(
                x_rows + kk[None, :] * stride_xk,
                mask=m_ok[:, None] & (kk[None, :] < k_stop),
                other=0.0,
            )
            acc = tl.dot(x, q.to(X.dtype.element_ty), acc)
        if SPLIT_K == 1:
            acc = acc * tl.load(S + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(Bias + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    c_ptrs = C + pid_k * stride_cs + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@kernel
def _fp8_block_gemm_kernel(
    C,
    stride_cm,
    stride_cn,
    A,
    stride_am,
    stride_ak,
    B,
    stride_bk,
    stride_bn,
    SA,
    stride_sam,
    stride_sak,
    SB,
    stride_sbn,
    stride_sbk,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
):
    """One output tile per program in grouped order, block-scaled:

        C[m, n] = Σ_kb (Σ_{k in block kb} A[m, k]·B[k, n]) · SA[m, kb] · SB[n // SCALE_BLOCK, kb]

    Each BLOCK_K step lies in one scale block along K (SCALE_BLOCK % BLOCK_K == 0): its e4m3
    product is summed on tensor cores in float32, then scaled and added to the accumulator. K
    past the end (a last block shorter than SCALE_BLOCK) is masked to zero.

    Bytes: M·K + K·N (one byte each), the float32 scales M·⌈K/128⌉ + ⌈N/128⌉·⌈K/128⌉, and
    2·M·N for the bfloat16 output.
    """
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    a_rows = A + rm[:, None].to(tl.int64) * stride_am
    b_cols = B + rn[None, :].to(tl.int64) * stride_bn
    sa_rows = SA + rm.to(tl.int64) * stride_sam
    sb_cols = SB + (rn // SCALE_BLOCK).to(tl.int64) * stride_sbn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            a_rows + kk[None, :] * stride_ak, mask=m_ok[:, None] & (kk[None, :] < K), other=0.0
        )
        b = tl.load(
            b_cols + kk[:, None] * stride_bk, mask=(kk[:, None] < K) & n_ok[None, :], other=0.0
        )
        kb = k0 // SCALE_BLOCK
        sa = tl.load(sa_rows + kb * stride_sak, mask=m_ok, other=0.0)
        sb = tl.load(sb_cols + kb * stride_sbk, mask=n_ok, other=0.0)
        acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@kernel
def _mx_quantize(x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, FP4: tl.constexpr):
    """A [BLOCK_M, BLOCK_K] tile to an MX format (OCP rule): per 32 values the scale byte
    ⌊log2 max|x|⌋ + 127 − emax (at least 0; 255, NaN, for a block with NaN or Inf), values
    x / 2^(byte − 127) rounded to nearest even, saturating. Returns (values: FP4 packed uint8
    [BLOCK_M, BLOCK_K / 2], low nibble first, else e4m3 [BLOCK_M, BLOCK_K]; scale bytes uint8
    [BLOCK_M, BLOCK_K / 32])."""
    x3 = tl.reshape(x.to(tl.float32), (BLOCK_M, BLOCK_K // 32, 32))
    # ⌊log2 max|x|⌋ + 127 as the largest exponent field (an integer max: NaN and Inf, field
    # 255, are not dropped as a float max on the GPU would drop NaN)
    exponent = tl.max((x3.to(tl.int32, bitcast=True) >> 23) & 0xFF, axis=2)
    # a block holding NaN or Inf gets the NaN scale 0xFF (OCP MX): the block reads as NaN
    scale = tl.where(exponent == 255, 255, tl.maximum(exponent - (2 if FP4 else 8), 0))
    inverse = ((254 - tl.minimum(scale, 254)) << 23).to(tl.float32, bitcast=True)  # 2^(127−s)
    y = tl.reshape(x3 * inverse[:, :, None], (BLOCK_M, BLOCK_K))
    if FP4:
        ay = tl.abs(y)
        # e2m1 codes, ties to the even code: 0.25 → 0, 0.75 → 1.0, 1.25 → 1.0, 1.75 → 2.0,
        # 2.5 → 2.0, 3.5 → 4.0, 5 → 4.0; above 5 → 6 (saturating)
        code = (ay > 0.25).to(tl.int32) + (ay >= 0.75).to(tl.int32) + (ay > 1.25).to(tl.int32)
        code += (ay >= 1.75).to(tl.int32) + (ay > 2.5).to(tl.int32) + (ay >= 3.5).to(tl.int32)
        code += (ay > 5.0).to(tl.int32)
        code = code | ((y < 0).to(tl.int32) << 3)
        lo, hi = tl.split(tl.reshape(code, (BLOCK_M, BLOCK_K // 2, 2)))
        values = (lo | (hi << 4)).to(tl.uint8)
    else:
        values = tl.minimum(tl.maximum(y, -448.0), 448.0).to(tl.float8e4nv)
    return values, scale.to(tl.uint8)


@kernel
def _mx_gemm_kernel(
    C,
    stride_cm,
    stride_cn,
    A,
    stride_am,
    stride_ak,
    B,
    stride_bn,
    stride_bk,
    BS,
    stride_bsn,
    stride_bsk,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FP4: tl.constexpr,
    QUANTIZE_A: tl.constexpr,
):
    """One output tile per program in grouped order:

        C = A' · dequant(B)ᵀ,   dequant(B)[n, k] = value(B[n, k]) · 2^(BS[n, k / 32] − 127)

    with B mxfp4 (FP4: uint8 [N, K/2], two e2m1 per byte along K, low nibble first) or mxfp8
    (e4m3 [N, K]) and BS its ue8m0 scales [N, K/32]; A' = A (bfloat16, weight-only) or, with
    QUANTIZE_A, A quantized to B's format tile by tile (``_mx_quantize``). ``tl.dot_scaled``
    multiplies: block-scaled tensor-core MMA on sm_100, an upcast to bf16 and an ordinary MMA
    elsewhere. K is a multiple of 32; a last K tile past K is masked to zero.

    Bytes: the weight at its packed width (K·N/2 or K·N) plus K·N/32 scale bytes, A (2·M·K),
    and 2·M·N for the bfloat16 output.
    """
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    PACK: tl.constexpr = 2 if FP4 else 1
    rka = tl.arange(0, BLOCK_K)
    rkb = tl.arange(0, BLOCK_K // PACK)
    rks = tl.arange(0, BLOCK_K // 32)
    a_rows = A + rm[:, None].to(tl.int64) * stride_am
    b_rows = B + rn[:, None].to(tl.int64) * stride_bn
    s_rows = BS + rn[:, None].to(tl.int64) * stride_bsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ka = k0 + rka
        a = tl.load(
            a_rows + ka[None, :] * stride_ak, mask=m_ok[:, None] & (ka[None, :] < K), other=0.0
        )
        kb = k0 // PACK + rkb
        b_mask = n_ok[:, None] & (kb[None, :] < K // PACK)
        if FP4:
            b = tl.load(b_rows + kb[None, :] * stride_bk, mask=b_mask, other=0)
        else:
            b = tl.load(b_rows + kb[None, :] * stride_bk, mask=b_mask, other=0.0)
        ks = k0 // 32 + rks
        bs = tl.load(
            s_rows + ks[None, :] * stride_bsk,
            mask=n_ok[:, None] & (ks[None, :] < K // 32),
            other=127,
        )
        if QUANTIZE_A:
            aq, a_scale = _mx_quantize(a, BLOCK_M, BLOCK_K, FP4)
            if FP4:
                acc = tl.dot_scaled(aq, a_scale, "e2m1", b.T, bs, "e2m1", acc)
            else:
                acc = tl.dot_scaled(aq, a_scale, "e4m3", b.T, bs, "e4m3", acc)
        else:
            if FP4:
                acc = tl.dot_scaled(a, None, "bf16", b.T, bs, "e2m1", acc)
            else:
                acc = tl.dot_scaled(a, None, "bf16", b.T, bs, "e4m3", acc)
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@kernel
def _nvfp4_quantize(x, g, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """A [BLOCK_M, BLOCK_K] tile to nvfp4 relative to the per-tensor scale ``g`` (float32), by
    ``packing.quantize_nvfp4``'s rule in the same float32 operations: per 16 values the scale
    s = e4m3(min(max|x| / (g · 6), 448)) (NaN for a block holding NaN or Inf), values
    e2m1(x / (s · g)) rounded to nearest even, saturating, 0 where s · g is 0. Returns (values
    uint8 [BLOCK_M, BLOCK_K / 2], low nibble first; scales float8e4nv [BLOCK_M, BLOCK_K / 16])."""
    x3 = tl.reshape(x.to(tl.float32), (BLOCK_M, BLOCK_K // 16, 16))
    amax = tl.max(tl.abs(x3), axis=2)
    # NaN and Inf by their exponent field (an integer max: a float max on the GPU drops NaN)
    special = tl.max((x3.to(tl.int32, bitcast=True) >> 23) & 0xFF, axis=2) == 255
    t = tl.minimum(tl.div_rn(amax, g * 6.0), 448.0)
    scale = tl.where(special, float("nan"), t).to(tl.float8e4nv)
    sg = scale.to(tl.float32) * g
    sg3 = tl.broadcast_to(sg[:, :, None], (BLOCK_M, BLOCK_K // 16, 16))
    y = tl.where(sg3 > 0, tl.div_rn(x3, tl.where(sg3 > 0, sg3, 1.0)), 0.0)
    y = tl.reshape(y, (BLOCK_M, BLOCK_K))
    ay = tl.abs(y)
    # e2m1 codes, ties to the even code (as ``_mx_quantize``); above 5 → 6 (saturating)
    code = (ay > 0.25).to(tl.int32) + (ay >= 0.75).to(tl.int32) + (ay > 1.25).to(tl.int32)
    code += (ay >= 1.75).to(tl.int32) + (ay > 2.5).to(tl.int32) + (ay >= 3.5).to(tl.int32)
    code += (ay > 5.0).to(tl.int32)
    code = code | ((y < 0).to(tl.int32) << 3)
    lo, hi = tl.split(tl.reshape(code, (BLOCK_M, BLOCK_K // 2, 2)))
    return (lo | (hi << 4)).to(tl.uint8), scale


@kernel
def _nvfp4_gemm_kernel(
    C,
    stride_cm,
    stride_cn,
    A,
    stride_am,
    stride_ak,
    B,
    stride_bn,
    stride_bk,
    BS,
    stride_bsn,
    stride_bsk,
    BG,
    AG,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    QUANTIZE_A: tl.constexpr,
):
    """One output tile per program in grouped order:

        C = (A' · value(B)ᵀ) · BG [· AG],   value(B)[n, k] = e2m1(B[n, k]) · BS[n, k / 16]

    with B uint8 [N, K/2] (two e2m1 per byte along K, low nibble first), BS its e4m3 scales
    [N, K/16] and BG its per-tensor float32 scale; A' = A (bfloat16, weight-only) or, with
    QUANTIZE_A, A quantized to nvfp4 relative to its per-tensor scale AG tile by tile
    (``_nvfp4_quantize``), whose block-scaled values enter the MMA and AG the epilogue.
    ``tl.dot_scaled`` with 16-value e4m3 scales multiplies: the block-scaled tensor-core MMA
    (kind::mxf4nvf4, block16) on sm_100 with both operands nvfp4; elsewhere (and weight-only
    everywhere) the operands are scaled in bf16 (exactly) and multiplied by an ordinary MMA.
    K is a multiple of 16; a last K tile past K is masked to zero.

    Bytes: the weight K·N/2 plus K·N/16 scale bytes, A (2·M·K), and 2·M·N for the output.
    """
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    rka = tl.arange(0, BLOCK_K)
    rkb = tl.arange(0, BLOCK_K // 2)
    rks = tl.arange(0, BLOCK_K // 16)
    a_rows = A + rm[:, None].to(tl.int64) * stride_am
    b_rows = B + rn[:, None].to(tl.int64) * stride_bn
    s_rows = BS + rn[:, None].to(tl.int64) * stride_bsn
    if QUANTIZE_A:
        ga = tl.load(AG)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ka = k0 + rka
        a = tl.load(
            a_rows + ka[None, :] * stride_ak, mask=m_ok[:, None] & (ka[None, :] < K), other=0.0
        )
        kb = k0 // 2 + rkb
        b = tl.load(
            b_rows + kb[None, :] * stride_bk, mask=n_ok[:, None] & (kb[None, :] < K // 2), other=0
        )
        ks = k0 // 16 + rks
        bs = tl.load(
            s_rows + ks[None, :] * stride_bsk,
            mask=n_ok[:, None] & (ks[None, :] < K // 16),
            other=0.0,
        )
        if QUANTIZE_A:
            aq, a_scale = _nvfp4_quantize(a, ga, BLOCK_M, BLOCK_K)
            acc = tl.dot_scaled(aq, a_scale, "e2m1", b.T, bs, "e2m1", acc)
        else:
            acc = tl.dot_scaled(a, None, "bf16", b.T, bs, "e2m1", acc)
    g = tl.load(BG)
    if QUANTIZE_A:
        g = g * ga
    c_ptrs = C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, (acc * g).to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
