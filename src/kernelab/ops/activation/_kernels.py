"""The gated-activation family's kernel: act(gate) · up over rows of ``[gate | up]``, the
activation chosen by the ``ACT`` constexpr (SiLU, or GELU in its tanh or erf form).
"""

import triton.language as tl

from kernelab.core.runtime.triton import kernel

#: The activations, as the kernel's ACT constexpr.
SILU, GELU_TANH, GELU_ERF = 0, 1, 2


@kernel
def _act_and_mul_kernel(
    Out,
    stride_out,
    X,
    stride_x,
    n_rows,
    d,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ACT: tl.constexpr,
):
    """A tile of BLOCK_M rows × BLOCK_N output columns: act(gate) · up in float32.

    Bytes: reads each gate and up element once, writes each output element once (3·d per row).
    """
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < d)[None, :]
    x_gate = X + rows[:, None] * stride_x + cols[None, :]
    x_up = x_gate + d
    g = tl.load(x_gate, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_up, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        a = g / (1.0 + tl.exp(-g))
    elif ACT == 1:
        # tanh(z) = 1 - 2 / (1 + e^{2z}): exact limits ±1 when e^{2z} overflows or vanishes.
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * z)))
    else:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    out = Out + rows[:, None] * stride_out + cols[None, :]
    tl.store(out, (a * u).to(Out.dtype.element_ty), mask=mask)
