"""Pallas (TPU) kernels of the gated activations and their declared launches.

Imported only when a Pallas variant runs or is described (jax on first use).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core.runtime import pallas as _pl
from kernelab.core.runtime.launch import rows
from kernelab.core.runtime.pallas import Block, Out, PallasCall, PallasPlan, RowBlocks


def _silu(g):
    import jax

    return g * jax.nn.sigmoid(g)


def _silu_and_mul_kernel(g_ref, u_ref, o_ref):
    """One (rows × columns) tile: out = silu(gate) · up in float32, rounded once. The gate
    and up tiles are blocks of the same array, ``d`` columns apart; reads two tiles, writes
    one."""
    g = g_ref[...].astype("float32")
    o_ref[...] = (_silu(g) * u_ref[...].astype("float32")).astype(o_ref.dtype)


def _silu_and_mul_rows_kernel(x_ref, o_ref, *, d):
    """Whole rows (``d`` off the 128-lane tiling): the halves are sliced inside the block."""
    x = x_ref[...].astype("float32")
    o_ref[...] = (_silu(x[:, :d]) * x[:, d:]).astype(o_ref.dtype)


@dataclass(frozen=True)
class ActBlocks:
    """``block_rows`` rows × ``block_cols`` output columns per step (``block_cols`` None:
    whole rows, used when ``d`` is off the 128-lane tiling). The default takes the widest of
    2048/1024/512/256/128 columns dividing ``d`` and as many rows as ``RowBlocks`` gives a
    row of that width: a choice, not a measurement (no TPU here)."""

    block_rows: int
    block_cols: int | None

    @classmethod
    def default_for(cls, n_rows: int, d: int, dtype: torch.dtype, target=None) -> ActBlocks:
        cols = next((c for c in (2048, 1024, 512, 256, 128) if d % c == 0), None)
        width = cols if cols is not None else 2 * d
        return cls(RowBlocks.default_for(n_rows, 3 * width * 4, dtype, target).block_rows, cols)

    @classmethod
    def tuning_space(cls, n_rows: int, d: int, dtype: torch.dtype, target=None) -> list:
        sub = _pl.sublanes(dtype)
        cols = [c for c in (128, 256, 512, 1024, 2048) if d % c == 0] or [None]
        return [
            cls(r, c)
            for r in (8, 16, 32, 64, 128, 256, 512)
            for c in cols
            if r % sub == 0
            and r * (c or 2 * d) * 12 <= _pl.CHIPS[_pl.generation(target)].vmem_bytes // 8
        ] or [cls.default_for(n_rows, d, dtype, target)]


def silu_and_mul_plan(x, out=None, config=None, target=None) -> PallasPlan:
    """The launch for these (validated) arguments: a 2-D "parallel" grid over row blocks and
    column tiles (the gate and up tiles read from the same array), or a 1-D grid over whole
    rows when ``d`` is not a multiple of 128; partial last row blocks are masked by Pallas."""
    d = x.shape[-1] // 2
    result = out
    if result is None:
        result = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    if result.numel() == 0:
        return PallasPlan(result=result)
    x2 = rows(x)
    n_rows = x2.shape[0]
    cfg = config or ActBlocks.default_for(n_rows, d, x.dtype, target)
    bm, bd = cfg.block_rows, cfg.block_cols
    if bd is not None and d % bd:
        raise ValueError(f"config: block_cols {bd} must divide d = {d}")
    if bd is not None:
        tiles = d // bd
        call = PallasCall(
            _silu_and_mul_kernel,
            grid=(_pl.cdiv(n_rows, bm), tiles),
            inputs=(x2, x2),
            in_specs=(
                Block((bm, bd), lambda i, j: (i, j)),
                Block((bm, bd), lambda i, j: (i, j + tiles)),
            ),
            outputs=(Out((n_rows, d), result.dtype, Block((bm, bd), lambda i, j: (i, j))),),
            semantics=("parallel", "parallel"),
            config=cfg,
        )
    else:
        call = PallasCall(
            _silu_and_mul_rows_kernel,
            grid=(_pl.cdiv(n_rows, bm),),
            inputs=(x2,),
            in_specs=(Block((bm, 2 * d), lambda i: (i, 0)),),
            outputs=(Out((n_rows, d), result.dtype, Block((bm, d), lambda i: (i, 0))),),
            semantics=("parallel",),
            params={"d": d},
            config=cfg,
        )

    def finish(outs):
        result.copy_(outs[0][0].view(result.shape))
        return result

    return PallasPlan((call,), finish)
