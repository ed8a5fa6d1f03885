"""W8A16 GEMM (int8 weights, per-column scales) through the interpreter, against the float64
reference computed from the same quantized weights."""

import importlib

import pytest
import torch

from kernelab.ops import W8A16_GEMM, Shape
from kernelab.ops.matmul._weight_only import WQConfig
from kernelab.ops.matmul.w8a16 import w8a16_torch, w8a16_triton
from tests.mutants import mutate
from tests.opcheck import check as _check
from tests.ops.matmul.weight_only_checks import decode_and_prefill

w8 = importlib.import_module("kernelab.ops.matmul.w8a16")
kernels = importlib.import_module("kernelab.ops.matmul._kernels")

OP = W8A16_GEMM
DTYPES = (torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", OP.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    _check(OP, OP.inputs(shape, dtype, "cpu", seed=21), OP.variants["kernelab"], dtype)


@pytest.mark.parametrize(
    "shape", decode_and_prefill(OP.shapes("representative")), ids=lambda s: s.label
)
def test_representative_shapes_at_interpreter_size(shape):
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=6, dist="heavy")
    _check(OP, inputs, OP.variants["kernelab"], torch.bfloat16)


@pytest.mark.parametrize(
    "config",
    [
        WQConfig(16, 32, 32, 1, 4, 4, 2),  # GEMV-shaped: 4 K slices
        WQConfig(32, 16, 64, 2, 1, 4, 2),  # tiled, grouped order
        WQConfig(16, 64, 32, 1, 3, 4, 2),  # uneven K slices
    ],
    ids=str,
)
def test_configs(config):
    shape = Shape("t", {"M": 21, "N": 40, "K": 320}, {"bias": True})
    inputs = OP.inputs(shape, torch.float16, "cpu", seed=2)
    _check(OP, inputs, lambda **kw: w8a16_triton(**kw, config=config), torch.float16)


def test_cost_counts_the_weight_at_its_packed_width():
    w8 = OP.cost(OP.inputs(Shape("t", {"M": 2, "N": 64, "K": 256}), torch.bfloat16, "meta"))
    act = 2 * (2 * 256 + 2 * 64)  # x and out in bf16
    assert w8.bytes == act + 256 * 64 + 64 * 2
    assert w8.flops == 2 * 2 * 64 * 256


# --- planted defects ----------------------------------------------------------------------------

MUTANTS = {
    # the int8 K loop skips the tail tile
    "int8-k-tail": (
        "for k0 in range(k_start, k_stop, BLOCK_K):\n            kk",
        "for k0 in range(k_start, k_stop - BLOCK_K, BLOCK_K):\n            kk",
    ),
    # the per-channel scale applied by row instead of by column
    "int8-scale-axis": ("tl.load(S + rn, mask=n_ok", "tl.load(S + rm, mask=m_ok"),
}


@pytest.mark.parametrize("mutant_name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, mutant_name):
    old, new = MUTANTS[mutant_name]
    mutant = mutate(w8._wq_gemm_kernel, old, new, tmp_path)
    mutant.fn.__globals__["_tile_coords"] = kernels._tile_coords
    monkeypatch.setattr(w8, "_wq_gemm_kernel", mutant)
    inputs = OP.inputs(Shape("t", {"M": 20, "N": 40, "K": 192}, {}), torch.float16, "cpu", 3)
    config = WQConfig(32, 32, 32, 2, 1, 4, 2)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        _check(OP, inputs, lambda **kw: w8a16_triton(**kw, config=config), torch.float16)


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("fn", [w8a16_triton, w8a16_torch], ids=["triton", "torch"])
def test_k_zero_is_an_empty_sum(fn, bias):
    b = torch.randn(8).half() if bias else None
    out = fn(torch.randn(3, 0).half(), torch.zeros(0, 8, dtype=torch.int8), torch.ones(8).half(), b)
    assert torch.equal(out, torch.zeros(3, 8).half() if b is None else b.expand(3, 8))
