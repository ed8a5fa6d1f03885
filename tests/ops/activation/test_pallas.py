"""The Pallas SwiGLU (activation/_pallas.py) through the TPU interpreter: column tiles when
d is on the 128-lane tiling, whole rows otherwise; planted defects fail verify."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelab.core.runtime import pallas
from kernelab.ops import SILU_AND_MUL, Shape
from tests.ops import pallas_checks as pc

pytestmark = pc.needs_jax

VARIANT = SILU_AND_MUL.variants["pallas"]
#: 20 rows in blocks of 16 (the last partial); d = 256 in two column tiles; d = 100 whole rows.
TILED = Shape("20x2x256", {"rows": 20, "d": 256}, {}, batch_dim="rows")
ROWS = Shape("20x2x100", {"rows": 20, "d": 100}, {}, batch_dim="rows")


def _cfg(shape):
    d = shape.dims["d"]
    from kernelab.ops.activation._pallas import ActBlocks

    return ActBlocks(16, 128 if d % 128 == 0 else None)


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_verify_passes_tiled_and_whole_rows():
    for shape in (TILED, ROWS):
        report = pc.verify(SILU_AND_MUL, pc.configured(VARIANT, _cfg(shape)), [shape])
        assert pc.passed(report), pc.failures(report)


@pytest.mark.slow  # the TPU interpreter compiles each shape (seconds)
def test_the_up_tile_off_by_one_column_tile_is_wrong_values():
    # The up tile read one tile to the left: in bounds, every value wrong.
    def off_by_one(call):
        return dataclasses.replace(
            call, in_specs=(call.in_specs[0], pc.shifted(call.in_specs[1], 1, -1))
        )

    fn = pc.planted(VARIANT, off_by_one, config=_cfg(TILED))
    report = pc.verify(SILU_AND_MUL, fn, [TILED])
    assert "wrong values" in pc.classes(report), pc.failures(report)


def test_the_default_tiles_are_on_the_lane_tiling():
    for shape in SILU_AND_MUL.shapes("representative")[:3]:
        (call,) = pallas.launches(SILU_AND_MUL, shape, torch.bfloat16, target="tpu_v6e")
        assert call.config.block_cols % 128 == 0
        assert call.grid[1] * call.config.block_cols == shape.dims["d"]
