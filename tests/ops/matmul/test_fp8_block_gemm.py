"""Block-scaled FP8 GEMM through the interpreter against float64 on the dequantized inputs, the
block weight quantizer, and planted defects in the per-K-block scaling."""

import importlib

import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import FP8_BLOCK_GEMM, Shape, fp8_block_gemm, packing
from kernelab.ops.matmul.fp8_block_gemm import (
    Fp8BlockConfig,
    fp8_block_gemm_triton,
)
from tests.mutants import mutate
from tests.opcheck import check
from tests.opcheck import clone as _clone

module = importlib.import_module("kernelab.ops.matmul.fp8_block_gemm")
kernels = importlib.import_module("kernelab.ops.matmul._kernels")
#: Two K steps per 128-wide scale block, and tiles narrower than a scale block along N.
SMALL = Fp8BlockConfig(32, 32, 64, group_m=2, num_warps=4, num_stages=2)


def _check(inputs, fn):
    return check(FP8_BLOCK_GEMM, inputs, fn, torch.bfloat16)


@pytest.mark.parametrize("shape", FP8_BLOCK_GEMM.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    _check(FP8_BLOCK_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=13), fp8_block_gemm_triton)


@pytest.mark.parametrize("dist", ["normal", "heavy"])
def test_representative_shapes_at_interpreter_size(dist):
    shapes = FP8_BLOCK_GEMM.shapes("representative")
    for m in (1, 128):
        shape = next(s for s in shapes if s.dims["M"] == m).reduced(8)
        inputs = FP8_BLOCK_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=1, dist=dist)
        _check(inputs, fp8_block_gemm_triton)


def test_small_tiles_two_k_steps_per_scale_block():
    shape = Shape("t", {"M": 40, "N": 200, "K": 320}, {"ue8m0": True})
    inputs = FP8_BLOCK_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=2)
    _check(inputs, lambda **kw: fp8_block_gemm_triton(**kw, config=SMALL))


def test_public_op_through_the_interpreter_and_on_torch(interpret, monkeypatch):
    shape = Shape("t", {"M": 3, "N": 24, "K": 160}, {})
    inputs = FP8_BLOCK_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=4)
    interpreted = fp8_block_gemm(**_clone(inputs))
    monkeypatch.delenv("KERNELAB_INTERPRET")
    eager = fp8_block_gemm(**_clone(inputs))
    (ref,), _ = FP8_BLOCK_GEMM.run_reference(inputs)
    assert error(interpreted, ref).rel_l2 < 1e-2 and error(eager, ref).rel_l2 < 1e-2


def test_cost_counts_bytes_of_values_and_block_scales():
    shape = Shape("t", {"M": 4, "N": 200, "K": 300}, {})
    cost = FP8_BLOCK_GEMM.cost(FP8_BLOCK_GEMM.inputs(shape, torch.bfloat16, "meta"))
    # values one byte each, scale_a [4, 3] and scale_b [2, 3] in float32, bf16 output
    assert cost.bytes == 4 * 300 + 200 * 300 + 4 * (4 * 3 + 2 * 3) + 2 * 4 * 200
    assert cost.flops == 2 * 4 * 200 * 300


# --- the block weight quantizer ---------------------------------------------------------------


@pytest.mark.parametrize("ue8m0", [False, True], ids=["float32-scales", "ue8m0"])
def test_block_quantizer_round_trip_and_scales(ue8m0):
    w = torch.randn(200, 300) * torch.logspace(-2, 2, 200)[:, None]
    values, scales = packing.quantize_fp8_block(w, ue8m0=ue8m0)
    assert values.shape == (200, 300) and values.dtype == torch.float8_e4m3fn
    assert scales.shape == (2, 3) and scales.dtype == torch.float32
    deq = packing.dequantize_fp8_block(values, scales)
    blocks = torch.zeros(2, 3)
    for i in range(2):
        for j in range(3):
            blk = w[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)].double()
            blocks[i, j] = blk.abs().max()
            err = (deq[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)] - blk).abs()
            # half an e4m3 step: 2^-4 relative in the normal range, 2^-10 of the scale below
            assert (err <= 2.0**-4 * blk.abs() + 2.0**-10 * float(scales[i, j])).all()
    if ue8m0:
        assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # powers of two
        assert (scales * 448 >= blocks).all() and (scales * 224 < blocks).all()
    else:
        assert torch.allclose(scales * 448, blocks, rtol=1e-6)


def test_block_quantizer_rejects_bad_input():
    with pytest.raises(ValueError, match="w: expected 2 dimensions"):
        packing.quantize_fp8_block(torch.randn(4, 4, 4))
    with pytest.raises(TypeError, match="fp8_dtype"):
        packing.quantize_fp8_block(torch.randn(4, 4), fp8_dtype=torch.float16)


@pytest.mark.parametrize(
    ("change", "exc", "words"),
    [
        ({"a": torch.randn(2, 200)}, TypeError, "a: expected dtype"),
        ({"b": torch.randn(8, 100).to(torch.float8_e4m3fn)}, ValueError, "b: expected [N, K]"),
        ({"scale_a": torch.ones(2, 1)}, ValueError, "scale_a: expected shape"),
        ({"scale_b": torch.ones(2, 2)}, ValueError, "scale_b: expected shape"),
        ({"scale_b": torch.ones(1, 2, dtype=torch.float16)}, TypeError, "scale_b: expected dtype"),
        ({"out": torch.empty(2, 9, dtype=torch.bfloat16)}, ValueError, "out: expected shape"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(change, exc, words):
    f8 = torch.float8_e4m3fn
    args = {
        "a": torch.randn(2, 200).to(f8),
        "b": torch.randn(8, 200).to(f8),
        "scale_a": torch.ones(2, 2),
        "scale_b": torch.ones(1, 2),
        **change,
    }
    with pytest.raises(exc) as info:
        fp8_block_gemm_triton(**args)
    assert words in str(info.value)


def test_bad_config_is_refused():
    shape = Shape("t", {"M": 2, "N": 8, "K": 128}, {})
    inputs = FP8_BLOCK_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=1)
    with pytest.raises(ValueError, match="block_k must divide 128"):
        fp8_block_gemm_triton(**inputs, config=Fp8BlockConfig(16, 16, 96))


# --- planted defects ----------------------------------------------------------------------------

MUTANTS = {
    # the weight scale of the tile's column block, not of each column's 128-wide block
    "scale-b-per-wrong-block": (
        "sb_cols = SB + (rn // SCALE_BLOCK).to(tl.int64) * stride_sbn",
        "sb_cols = SB + (rn // BLOCK_N).to(tl.int64) * stride_sbn",
    ),
    # the first K block's scales used for every K block (scales applied once, as per-row fp8)
    "scales-of-first-k-block-only": ("kb = k0 // SCALE_BLOCK", "kb = 0"),
    # the first K block's activation scale skipped (taken as 1)
    "a-scale-of-a-k-block-skipped": (
        "sa = tl.load(sa_rows + kb * stride_sak, mask=m_ok, other=0.0)",
        "sa = tl.where(kb == 0, 1.0, tl.load(sa_rows + kb * stride_sak, mask=m_ok, other=0.0))",
    ),
    # the K scale block counted in BLOCK_K steps instead of 128-wide blocks (wrapped in range)
    "k-block-index-in-tile-steps": (
        "kb = k0 // SCALE_BLOCK",
        "kb = (k0 // BLOCK_K) % tl.cdiv(K, SCALE_BLOCK)",
    ),
    # row 0's activation scales used for every row
    "a-scale-of-row-zero": (
        "sa_rows = SA + rm.to(tl.int64) * stride_sam",
        "sa_rows = SA + (rm * 0).to(tl.int64) * stride_sam",
    ),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, name):
    old, new = MUTANTS[name]
    mutant = mutate(kernels._fp8_block_gemm_kernel, old, new, tmp_path)
    mutant.fn.__globals__["_tile_coords"] = kernels._tile_coords
    monkeypatch.setattr(module, "_fp8_block_gemm_kernel", mutant)
    shape = Shape("t", {"M": 24, "N": 160, "K": 300}, {})
    inputs = FP8_BLOCK_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=6)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        _check(inputs, lambda **kw: fp8_block_gemm_triton(**kw, config=SMALL))


@pytest.mark.slow
def test_default_configs_use_wgmma_on_fp8_operands_without_spills_on_sm90():
    from tests.opcheck import compile_launch

    reps = FP8_BLOCK_GEMM.shapes("representative")
    for m in (1, 2048):
        (launch,) = FP8_BLOCK_GEMM.launches(
            next(s for s in reps if s.dims["M"] == m), torch.bfloat16
        )
        ptx = compile_launch(launch).asm["ptx"]
        assert "wgmma.mma_async" in ptx and ".e4m3.e4m3" in ptx, f"M={m}: no fp8 wgmma"
        assert ".local" not in ptx, f"M={m}: local memory (spills)"
