"""Pallas (TPU) GEMM kernels of the matmul family and their declared launches.

Tiled A·B with a float32 accumulator in VMEM scratch: grid (M tiles, N tiles, K steps), the K
loop last and "arbitrary" (the accumulator is carried across it), zeroed at the first K step,
the epilogue (bias, activation, residual) applied and the tile written at the last one. A K
that is not a whole number of steps has its last step's tail masked to zero in both operands
(the block past the array holds garbage: NaN in the interpreter); partial M and N tiles need
no mask (their extra rows and columns are never written back).

Imported only when a Pallas variant runs or is described (jax on first use).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core.runtime import pallas as _pl
from kernelab.core.runtime.pallas import Block, Out, PallasCall, PallasPlan, Scratch

# --- the kernels -------------------------------------------------------------------------------


def _k_tile(a, b, k, *, k_size, bk, nk):
    """The K step's operands, their columns past K zeroed (only on a partial last step)."""
    import jax
    import jax.numpy as jnp

    if k_size % bk:
        cols = k * bk + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        a = jnp.where(cols < k_size, a, jnp.zeros_like(a))
        rows_b = (1, bk) if nk else (bk, 1)
        idx = k * bk + jax.lax.broadcasted_iota(jnp.int32, rows_b, 1 if nk else 0)
        b = jnp.where(idx < k_size, b, jnp.zeros_like(b))
    return a, b


def _dot(a, b, nk):
    """a [bm, bk] · b ([bk, bn], or [bn, bk] when ``nk``), accumulated in float32."""
    import jax
    import jax.numpy as jnp

    dims = (((1,), (1,)), ((), ())) if nk else (((1,), (0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _epilogue(acc, bias, res, activation):
    import jax

    if bias is not None:
        acc = acc + bias.astype("float32")
    if activation == "silu":
        acc = acc * jax.nn.sigmoid(acc)
    elif activation == "gelu":
        acc = jax.nn.gelu(acc, approximate=False)
    if res is not None:
        acc = acc + res.astype("float32")
    return acc


def _gemm_kernel(*refs, k_size, bk, nk, has_bias, has_res, activation):
    """One (bm × bn) output tile, one K step per grid point along the last axis:
    acc (+)= A[i, k] · B[k, j]; at the last step out = epilogue(acc). Reads each A and B tile
    once per output tile; writes the tile once."""
    from jax.experimental import pallas as pl

    a_ref, b_ref, *rest = refs
    bias_ref = rest.pop(0) if has_bias else None
    res_ref = rest.pop(0) if has_res else None
    o_ref, acc_ref = rest
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = _zeros(acc_ref)

    a, b = _k_tile(a_ref[...], b_ref[...], k, k_size=k_size, bk=bk, nk=nk)
    acc_ref[...] += _dot(a, b, nk)

    @pl.when(k == pl.num_programs(2) - 1)
    def _write():
        bias = bias_ref[...] if has_bias else None
        res = res_ref[...] if has_res else None
        o_ref[...] = _epilogue(acc_ref[...], bias, res, activation).astype(o_ref.dtype)


def _w8a16_kernel(*refs, k_size, bk, has_bias):
    """W8A16: acc (+)= x[i, k] · q[k, j] with the int8 tile converted to x's dtype (exact:
    int8 values are bf16/fp16 integers); at the last step out = acc · scales[j] (+ bias), the
    column scale applied once to the float32 sum. Reads int8 weight tiles (half the bytes of
    bf16), writes each output tile once."""
    from jax.experimental import pallas as pl

    x_ref, q_ref, s_ref, *rest = refs
    bias_ref = rest.pop(0) if has_bias else None
    o_ref, acc_ref = rest
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = _zeros(acc_ref)

    x = x_ref[...]
    a, b = _k_tile(x, q_ref[...].astype(x.dtype), k, k_size=k_size, bk=bk, nk=False)
    acc_ref[...] += _dot(a, b, False)

    @pl.when(k == pl.num_programs(2) - 1)
    def _write():
        acc = acc_ref[...] * s_ref[...].astype("float32")
        if has_bias:
            acc = acc + bias_ref[...].astype("float32")
        o_ref[...] = acc.astype(o_ref.dtype)


def _zeros(ref):
    import jax.numpy as jnp

    return jnp.zeros(ref.shape, ref.dtype)


# --- launch heuristics as data ------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulTiles:
    """(block_m, block_n, block_k) of the tiled Pallas GEMM.

    Defaults: tiles a multiple of the MXU width (128 on v5e, 256 on v6e and TPU7x, from jax's
    chip table in ``core/runtime/pallas.CHIPS``): 512 × 512 × 512 on v6e/TPU7x, 256 × 256 × 512 on
    v5e, about 4 MiB of VMEM with double buffering. A dimension smaller than its tile is taken
    whole (Mosaic accepts a block equal to the array dimension). A choice from the MXU
    geometry, not a measurement (no TPU here); ``tuning_space`` lists the alternatives.
    """

    block_m: int
    block_n: int
    block_k: int

    @classmethod
    def default_for(cls, m: int, n: int, k: int, dtype=torch.bfloat16, target=None):
        mxu = _pl.CHIPS[_pl.generation(target)].mxu
        tile = 2 * mxu
        return cls(_fit(m, tile), _fit(n, tile), _fit(k, 512))

    @classmethod
    def tuning_space(cls, m: int, n: int, k: int, dtype=torch.bfloat16, target=None):
        chip = _pl.CHIPS[_pl.generation(target)]
        sizes = (128, 256, 512, 1024)
        space = {
            cls(_fit(m, bm), _fit(n, bn), _fit(k, bk))
            for bm in sizes
            for bn in sizes
            for bk in sizes
        }

        def keep(c: MatmulTiles) -> bool:
            el = torch.empty((), dtype=dtype).element_size()
            vmem = 2 * el * (c.block_m * c.block_k + c.block_k * c.block_n)
            vmem += (4 + 2 * el) * c.block_m * c.block_n
            return vmem <= chip.vmem_bytes // 4

        return sorted(c for c in space if keep(c)) or [cls.default_for(m, n, k, dtype, target)]

    def __lt__(self, other):
        return (self.block_m, self.block_n, self.block_k) < (
            other.block_m,
            other.block_n,
            other.block_k,
        )


def _fit(size: int, tile: int) -> int:
    """``tile``, or the whole dimension when it is not larger than the tile."""
    return max(size, 1) if size <= tile else tile


# --- the plan -----------------------------------------------------------------------------------


def gemm_plan(
    a,
    b,
    bias=None,
    residual=None,
    activation="none",
    b_layout="kn",
    out=None,
    config=None,
    target=None,
) -> PallasPlan:
    """The launch of ``_gemm_kernel`` for these (validated) arguments: grid (M/bm, N/bn,
    K/bk), ("parallel", "parallel", "arbitrary"), a float32 (bm, bn) accumulator in VMEM.
    B is read in its own layout ([K, N], or [N, K] contracted on its second dimension)."""
    m, k = a.shape
    nk = b_layout == "nk"
    n = b.shape[0] if nk else b.shape[1]
    result = out if out is not None else torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return PallasPlan(result=result)
    if k == 0:
        raise ValueError("a: K = 0 is not supported by the Pallas GEMM")
    cfg = config or MatmulTiles.default_for(m, n, k, a.dtype, target)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    grid = (_pl.cdiv(m, bm), _pl.cdiv(n, bn), _pl.cdiv(k, bk))
    b_block = (
        Block((bn, bk), lambda i, j, s: (j, s)) if nk else Block((bk, bn), lambda i, j, s: (s, j))
    )
    inputs = [a, b]
    specs = [Block((bm, bk), lambda i, j, s: (i, s)), b_block]
    if bias is not None:
        inputs.append(bias.reshape(1, n))
        specs.append(Block((1, bn), lambda i, j, s: (0, j)))
    if residual is not None:
        inputs.append(residual)
        specs.append(Block((bm, bn), lambda i, j, s: (i, j)))
    call = PallasCall(
        _gemm_kernel,
        grid=grid,
        inputs=tuple(inputs),
        in_specs=tuple(specs),
        outputs=(Out((m, n), result.dtype, Block((bm, bn), lambda i, j, s: (i, j))),),
        scratch=(Scratch("vmem", (bm, bn), torch.float32),),
        semantics=("parallel", "parallel", "arbitrary"),
        params=dict(
            k_size=k,
            bk=bk,
            nk=nk,
            has_bias=bias is not None,
            has_res=residual is not None,
            activation=activation,
        ),
        config=cfg,
    )

    def finish(outs):
        return result.copy_(outs[0][0])

    return PallasPlan((call,), finish)


def w8a16_plan(x, qweight, scales, bias=None, out=None, config=None, target=None) -> PallasPlan:
    """The launch of ``_w8a16_kernel`` for these (validated) arguments: the GEMM's grid and
    accumulator over x [M, K] and the int8 weight in the op's layout, [K, N], with the
    per-column scales and bias as (1, bn) blocks. K steps are a multiple of 32 (int8's
    sublane tiling) or all of K."""
    m, k = x.shape
    n = qweight.shape[1]
    result = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return PallasPlan(result=result)
    if k == 0:
        raise ValueError("x: K = 0 is not supported by the Pallas W8A16 GEMM")
    cfg = config or MatmulTiles.default_for(m, n, k, x.dtype, target)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if bk != k and bk % 32:
        raise ValueError(f"config: block_k {bk} must be a multiple of 32 (int8 tiles) or K")
    inputs = [x, qweight, scales.reshape(1, n)]
    specs = [
        Block((bm, bk), lambda i, j, s: (i, s)),
        Block((bk, bn), lambda i, j, s: (s, j)),
        Block((1, bn), lambda i, j, s: (0, j)),
    ]
    if bias is not None:
        inputs.append(bias.reshape(1, n))
        specs.append(Block((1, bn), lambda i, j, s: (0, j)))
    call = PallasCall(
        _w8a16_kernel,
        grid=(_pl.cdiv(m, bm), _pl.cdiv(n, bn), _pl.cdiv(k, bk)),
        inputs=tuple(inputs),
        in_specs=tuple(specs),
        outputs=(Out((m, n), result.dtype, Block((bm, bn), lambda i, j, s: (i, j))),),
        scratch=(Scratch("vmem", (bm, bn), torch.float32),),
        semantics=("parallel", "parallel", "arbitrary"),
        params=dict(k_size=k, bk=bk, has_bias=bias is not None),
        config=cfg,
    )

    def finish(outs):
        return result.copy_(outs[0][0])

    return PallasPlan((call,), finish)
