"""The Pallas GEMMs (matmul/_pallas.py) through the TPU interpreter: K masked on a partial last
step, B in both layouts, the whole epilogue, int8 weights with column scales; an accumulator
never zeroed fails verify."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelab.core.runtime import pallas
from kernelab.ops import GEMM, W8A16_GEMM, Shape
from kernelab.ops.matmul import _pallas as mp
from kernelab.ops.matmul._pallas import MatmulTiles
from tests.ops import pallas_checks as pc

pytestmark = pc.needs_jax

VARIANT = GEMM.variants["pallas"]
#: 20 × 200 × 300 in 16 × 128 × 128 tiles: partial M and N tiles, K in 3 steps, the last partial.
TILES = MatmulTiles(16, 128, 128)
FULL = Shape(
    "20x200x300 nk bias silu residual",
    {"M": 20, "N": 200, "K": 300},
    {"bias": True, "activation": "silu", "residual": True, "layout": "nk"},
    batch_dim="M",
)
PLAIN = Shape("20x200x300", {"M": 20, "N": 200, "K": 300}, {}, batch_dim="M")


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_verify_passes_with_a_masked_k_tail_and_the_whole_epilogue():
    report = pc.verify(GEMM, pc.configured(VARIANT, TILES), [FULL])
    assert pc.passed(report), pc.failures(report)


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_w8a16_verify_passes_with_a_masked_k_tail_and_bias():
    shape = Shape("20x200x300 bias", {"M": 20, "N": 200, "K": 300}, {"bias": True}, batch_dim="M")
    variant = W8A16_GEMM.variants["pallas"]
    report = pc.verify(W8A16_GEMM, pc.configured(variant, TILES), [shape])
    assert pc.passed(report), pc.failures(report)
    (call,) = pallas.launches(W8A16_GEMM, shape, torch.bfloat16)
    assert call.inputs[1].dtype == torch.int8  # the weight crosses as int8, never dequantized


def _never_zeroed_kernel(a_ref, b_ref, o_ref, acc_ref, *, k_size, bk, nk, **_):
    """The GEMM kernel without its k == 0 initialisation (a planted defect)."""
    from jax.experimental import pallas as pl

    k = pl.program_id(2)
    a, b = mp._k_tile(a_ref[...], b_ref[...], k, k_size=k_size, bk=bk, nk=nk)
    acc_ref[...] += mp._dot(a, b, nk)

    @pl.when(k == pl.num_programs(2) - 1)
    def _write():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_an_accumulator_never_zeroed_is_caught_as_nan():
    # The interpreter fills scratch with NaN: the sum of a never-zeroed accumulator is NaN.
    def never_zeroed(call):
        return dataclasses.replace(call, kernel=_never_zeroed_kernel)

    report = pc.verify(GEMM, pc.planted(VARIANT, never_zeroed, config=TILES), [PLAIN])
    assert "NaN mismatch" in pc.classes(report), pc.failures(report)


@pytest.mark.parametrize("target", pallas.GENERATIONS)
def test_default_tiles_are_mxu_multiples_or_whole_dimensions(target):
    mxu = pallas.CHIPS[target].mxu
    for m, n, k in ((1, 4096, 4096), (8192, 28672, 8192), (16, 100, 17)):
        cfg = MatmulTiles.default_for(m, n, k, torch.bfloat16, target)
        for size, tile in ((m, cfg.block_m), (n, cfg.block_n)):
            assert tile == size or tile % mxu == 0
        assert cfg.block_k == k or cfg.block_k % 128 == 0
    space = MatmulTiles.tuning_space(2048, 4096, 4096, torch.bfloat16, target)
    assert cfg in MatmulTiles.tuning_space(16, 100, 17, torch.bfloat16, target)
    assert len(space) > 8


def test_launch_grid_puts_the_k_loop_last_and_arbitrary():
    shape = GEMM.shapes("representative")[0]
    (call,) = pallas.launches(GEMM, shape, torch.bfloat16, target="tpu_v5e")
    assert call.semantics == ("parallel", "parallel", "arbitrary")
    k = shape.dims["K"]
    assert call.grid[2] == pallas.cdiv(k, call.config.block_k)
    assert call.scratch[0].dtype == torch.float32
