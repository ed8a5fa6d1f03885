"""Small declared Pallas calls for the TPU inspect tests: honest ones (no finding on any TPU
target) and planted defects, each of which one rule must catch. Meta tensors only: nothing
is allocated and nothing runs; the calls are only lowered."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl

from kernelab.core.runtime.pallas import Block, Out, PallasCall, Scratch

MIB = 2**20


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def _scale_rows(x_ref, w_ref, o_ref):
    """o = x · rsqrt(mean(x²)) · w per row, with a sign() that only lowers for a named chip."""
    x = x_ref[...].astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    o_ref[...] = (jnp.sign(x) * jnp.abs(x) * r * w_ref[...]).astype(o_ref.dtype)


def rows(
    n=1024,
    d=4096,
    block_rows=256,
    dtype=torch.bfloat16,
    semantics=("parallel", "parallel"),
    vmem_limit_bytes=None,
    block_cols=None,
) -> PallasCall:
    """Row-wise norm-like call: blocks of ``block_rows`` × ``block_cols`` (default: ``d``)."""
    bc = d if block_cols is None else block_cols
    return PallasCall(
        kernel=_scale_rows,
        grid=(n // block_rows, d // bc),
        inputs=(_meta((n, d), dtype), _meta((1, d), torch.float32)),
        in_specs=(
            Block((block_rows, bc), lambda i, j: (i, j)),
            Block((1, bc), lambda i, j: (0, j)),
        ),
        outputs=(Out((n, d), dtype, Block((block_rows, bc), lambda i, j: (i, j))),),
        semantics=tuple(semantics),
        vmem_limit_bytes=vmem_limit_bytes,
    )


def _matmul(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(m=1024, n=1024, k=2048, bm=512, bn=512, bk=1024, dtype=torch.bfloat16) -> PallasCall:
    """Tiled matmul, f32 VMEM accumulator, K loop as the last ("arbitrary") axis."""
    return PallasCall(
        kernel=_matmul,
        grid=(m // bm, n // bn, k // bk),
        inputs=(_meta((m, k), dtype), _meta((k, n), dtype)),
        in_specs=(
            Block((bm, bk), lambda i, j, kk: (i, kk)),
            Block((bk, bn), lambda i, j, kk: (kk, j)),
        ),
        outputs=(Out((m, n), dtype, Block((bm, bn), lambda i, j, kk: (i, j))),),
        scratch=(Scratch("vmem", (bm, bn), torch.float32),),
        semantics=("parallel", "parallel", "arbitrary"),
    )


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copy(shape, block, dtype=torch.float32, semantics=("parallel",)) -> PallasCall:
    """A blocked copy over the first axis: the simplest call with a chosen block."""
    return PallasCall(
        kernel=_copy,
        grid=(shape[0] // block[0],),
        inputs=(_meta(shape, dtype),),
        in_specs=(Block(block, lambda i: (i, 0)),),
        outputs=(Out(shape, dtype, Block(block, lambda i: (i, 0))),),
        semantics=semantics,
    )


def _sort_rows(x_ref, o_ref):
    o_ref[...] = jnp.sort(x_ref[...], axis=-1)


def sort_rows() -> PallasCall:
    """Uses a primitive Mosaic has no lowering for (sort)."""
    return PallasCall(
        kernel=_sort_rows,
        grid=(8,),
        inputs=(_meta((2048, 1024), torch.float32),),
        in_specs=(Block((256, 1024), lambda i: (i, 0)),),
        outputs=(Out((2048, 1024), torch.float32, Block((256, 1024), lambda i: (i, 0))),),
        semantics=("parallel",),
    )
