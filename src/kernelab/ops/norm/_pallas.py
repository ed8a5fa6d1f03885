"""Pallas (TPU) kernels of the norm family and their declared launches.

Imported only when a Pallas variant runs or is described (the kernels trace with jax, which
is imported by the runtime on first use, never at ``import kernelab``).
"""

from __future__ import annotations

import torch

from kernelab.core.runtime import pallas as _pl
from kernelab.core.runtime.launch import rows
from kernelab.core.runtime.pallas import Block, Out, PallasCall, PallasPlan, RowBlocks


def _rmsnorm_kernel(x_ref, w_ref, o_ref, *, eps):
    """One block of rows: out = x · rsqrt(mean(x²) + eps) · w, in float32, rounded once.
    Reads the block and the weight, writes the block."""
    import jax

    x = x_ref[...].astype("float32")
    ms = (x * x).mean(axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(ms + eps) * w_ref[...].astype("float32")
    o_ref[...] = y.astype(o_ref.dtype)


def _rmsnorm_residual_kernel(x_ref, r_ref, w_ref, o_ref, h_ref, *, eps):
    """The fused form: h = x + residual (rounded to the residual's dtype, as it is stored),
    written back; out = rmsnorm(h). Reads x, residual and weight, writes out and h."""
    import jax

    h = (x_ref[...].astype("float32") + r_ref[...].astype("float32")).astype(h_ref.dtype)
    h_ref[...] = h
    hf = h.astype("float32")
    ms = (hf * hf).mean(axis=-1, keepdims=True)
    y = hf * jax.lax.rsqrt(ms + eps) * w_ref[...].astype("float32")
    o_ref[...] = y.astype(o_ref.dtype)


def rmsnorm_plan(x, weight, eps=1e-6, residual=None, out=None, config=None, target=None):
    """The launch of the Pallas RMSNorm for these (validated) arguments: a 1-D grid over
    blocks of whole rows (``RowBlocks``), "parallel" (rows are independent); the last block
    may be partial (Pallas masks its writes). ``residual`` in place and ``out`` are filled by
    the plan's ``finish``."""
    result = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    if x.numel() == 0:
        return PallasPlan(result=result)
    x2 = rows(x)
    n_rows, n_cols = x2.shape
    cfg = config or RowBlocks.default_for(n_rows, n_cols * 4, x.dtype, target)
    bm = cfg.block_rows
    block = Block((bm, n_cols), lambda i: (i, 0))
    w2 = weight.reshape(1, n_cols)
    w_block = Block((1, n_cols), lambda i: (0, 0))
    shape = (n_rows, n_cols)
    common = dict(
        grid=(_pl.cdiv(n_rows, bm),),
        semantics=("parallel",),
        params={"eps": float(eps)},
        config=cfg,
    )
    if residual is None:
        call = PallasCall(
            _rmsnorm_kernel,
            inputs=(x2, w2),
            in_specs=(block, w_block),
            outputs=(Out(shape, result.dtype, block),),
            **common,
        )
    else:
        call = PallasCall(
            _rmsnorm_residual_kernel,
            inputs=(x2, rows(residual), w2),
            in_specs=(block, block, w_block),
            outputs=(Out(shape, result.dtype, block), Out(shape, residual.dtype, block)),
            **common,
        )

    def finish(outs):
        got = outs[0]
        result.copy_(got[0].view(result.shape))
        if residual is not None:
            residual.copy_(got[1].view(residual.shape))
        return result

    return PallasPlan((call,), finish)
