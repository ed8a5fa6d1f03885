"""The Pallas RMSNorm (norm/_pallas.py) through the TPU interpreter: right on a partial last
block, with and without the fused residual; planted defects fail verify with their class."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelab.core.runtime import pallas
from kernelab.core.runtime.pallas import RowBlocks
from kernelab.ops import RMSNORM, Shape
from tests.ops import pallas_checks as pc

pytestmark = pc.needs_jax

#: 20 rows in blocks of 16: two blocks, the last partial; 384 columns: three lanes of 128.
ROWS, COLS = 20, 384
SHAPES = [
    Shape(f"{ROWS}x{COLS}", {"rows": ROWS, "cols": COLS}, {"residual": False}, batch_dim="rows"),
    Shape(f"{ROWS}x{COLS} +residual", {"rows": ROWS, "cols": COLS}, {"residual": True}),
]
BLOCKS = RowBlocks(16)
VARIANT = RMSNORM.variants["pallas"]


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_verify_passes_on_a_partial_last_block_with_and_without_residual():
    report = pc.verify(RMSNORM, pc.configured(VARIANT, BLOCKS), SHAPES)
    assert pc.passed(report), pc.failures(report)
    assert len(report.cases) == 2


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_dropping_the_last_partial_block_leaves_rows_unwritten():
    def drop_last(call):
        return dataclasses.replace(call, grid=(ROWS // BLOCKS.block_rows,))

    report = pc.verify(RMSNORM, pc.planted(VARIANT, drop_last, config=BLOCKS), SHAPES[:1])
    # The dropped rows stay NaN (the interpreter's uninitialised memory).
    assert "NaN mismatch" in pc.classes(report), pc.failures(report)


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_a_block_index_off_by_one_is_an_interpreter_error():
    def off_by_one(call):
        return dataclasses.replace(
            call, in_specs=(pc.shifted(call.in_specs[0], 0), *call.in_specs[1:])
        )

    report = pc.verify(RMSNORM, pc.planted(VARIANT, off_by_one, config=BLOCKS), SHAPES[:1])
    assert "interpreter error" in pc.classes(report), pc.failures(report)


def test_launches_are_declared_per_shape_without_allocating():
    shape = RMSNORM.shapes("representative")[0]
    (call,) = pallas.launches(RMSNORM, shape, torch.bfloat16, target="tpu_v5e")
    assert all(t.device.type == "meta" for t in call.inputs)
    rows = shape.dims["rows"]
    assert call.grid == (pallas.cdiv(rows, call.config.block_rows),)
    assert call.semantics == ("parallel",)
    assert call.in_specs[0].shape == (call.config.block_rows, shape.dims["cols"])


@pytest.mark.parametrize("target", pallas.GENERATIONS)
def test_row_blocks_are_native_tiles_and_fit_vmem(target):
    for dtype in (torch.float32, torch.bfloat16):
        sub = pallas.sublanes(dtype)
        for n_rows, n_cols in ((1, 4096), (4096, 8192), (100000, 128)):
            cfg = RowBlocks.default_for(n_rows, n_cols * 4, dtype, target)
            assert cfg.block_rows == n_rows or cfg.block_rows % sub == 0
            assert cfg.block_rows * n_cols * 4 <= pallas.CHIPS[target].vmem_bytes // 64
        space = RowBlocks.tuning_space(4096, 4096 * 4, dtype, target)
        assert space and all(c.block_rows % sub == 0 for c in space)
