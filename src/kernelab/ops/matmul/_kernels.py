"""The dense GEMM kernels (Triton only; launchers, heuristics and the op live in ``gemm``).

- ``_gemm_tile``: the K loop of one output tile, shared by every kernel below and by fp8_gemm.
- ``_gemm_kernel``: one tile per program in grouped order, optionally one K slice per program.
- ``_gemm_persistent_kernel``: one program per SM walking the tiles.
- ``_gemm_tma_kernel``: tiles fetched through TMA tensor descriptors (the Hopper path).
"""

from __future__ import annotations

import triton.language as tl

from kernelab.ops._runtime.triton import kernel
from kernelab.ops.matmul._common import _epilogue, _tile_coords


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
