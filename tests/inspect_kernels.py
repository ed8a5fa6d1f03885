"""Small Triton kernels that kernelab inspect is tested on (compiled, never run)."""

import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Contiguous copy: vectorises only when pointers and n are known 16-divisible."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def strided_kernel(x_ptr, out_ptr, stride, BLOCK: tl.constexpr):
    """Reads every ``stride``-th element: no alignment makes these loads wider."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs * stride))


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


@triton.jit
def dot_ieee_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """fp32 dot in full IEEE precision: no tensor-core instruction can do it."""
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b, input_precision="ieee"))


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """A pipelined K loop: its shared memory grows with num_stages and the tiles."""
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


@triton.jit
def row_scale_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    """Keeps a whole row live across its reduction: with one warp and a wide row every thread
    holds BLOCK / 32 values, and past about 255 registers they spill."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, x / tl.sum(x * x, 0))


#: An autotuned wrapper: inspect looks through it to the JIT function.
tuned_copy_kernel = triton.autotune(configs=[triton.Config({}, num_warps=4)], key=["n"])(
    copy_kernel
)


@triton.jit
def broken_kernel(x_ptr, BLOCK: tl.constexpr):
    """Does not compile: a name that is not defined."""
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, undefined_name)  # noqa: F821
