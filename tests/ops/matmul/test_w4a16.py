"""W4A16 GEMM (int4 weights) through the interpreter, against the float64 reference computed
from the same quantized weights."""

import importlib

import numpy as np
import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import W4A16_GEMM, Shape, w4a16_gemm, w4a16_ref
from kernelab.ops import packing as _packing
from kernelab.ops.matmul._weight_only import WQConfig
from kernelab.ops.matmul.w4a16 import w4a16_torch, w4a16_triton
from tests.mutants import mutate
from tests.opcheck import check as _check
from tests.opcheck import clone as _clone
from tests.ops.matmul.weight_only_checks import decode_and_prefill

w4 = importlib.import_module("kernelab.ops.matmul.w4a16")
kernels = importlib.import_module("kernelab.ops.matmul._kernels")

OP = W4A16_GEMM
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
        WQConfig(16, 32, 32, 1, 4, 4, 2),  # GEMV-shaped: two K steps per group of 64, 4 slices
        WQConfig(32, 16, 64, 2, 1, 4, 2),  # tiled, grouped order
        WQConfig(16, 64, 32, 1, 3, 4, 2),  # uneven K slices
    ],
    ids=str,
)
def test_configs(config):
    shape = Shape("t", {"M": 21, "N": 40, "K": 320}, {"group_size": 64, "bias": True})
    inputs = OP.inputs(shape, torch.float16, "cpu", seed=2)
    _check(OP, inputs, lambda **kw: w4a16_triton(**kw, config=config), torch.float16)


def test_awq_checkpoint_runs_through_the_kernel(interpret):
    g = torch.Generator().manual_seed(0)
    k, n, group = 128, 24, 64
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.uint8)
    zeros = torch.randint(0, 16, (k // group, n), generator=g, dtype=torch.uint8)
    scales = (torch.rand(k // group, n, generator=g) * 0.02 + 0.01).half()
    w = _packing.from_awq(*_packing.pack_awq(q, zeros), scales, group)
    x = torch.randn(3, k, generator=g).half()
    out = w4a16_gemm(x, w.qweight, w.scales, w.zeros, group)
    expected = x.double() @ ((q.double() - zeros.double().repeat_interleave(group, 0))
                             * scales.double().repeat_interleave(group, 0))  # fmt: skip
    assert error(out, expected).rel_l2 < 2e-3
    ref = w4a16_ref(x.double(), w.qweight, w.scales.double(), w.zeros, group)
    assert error(ref, expected).rel_l2 < 1e-12


def test_cost_counts_the_weight_at_its_packed_width():
    shape = Shape("t", {"M": 2, "N": 64, "K": 256}, {"group_size": 128})
    w4 = OP.cost(OP.inputs(shape, torch.bfloat16, "meta"))
    act = 2 * (2 * 256 + 2 * 64)  # x and out in bf16
    assert w4.bytes == act + 256 * 64 // 2 + 2 * 64 * 2 + 2 * 64  # codes, scales, zeros
    assert w4.flops == 2 * 2 * 64 * 256


def test_default_configs_and_launches():
    gemv = WQConfig.default_for(1, 4096, 4096)
    assert gemv.path == "gemv" and gemv.split_k > 1
    assert WQConfig.default_for(2048, 4096, 4096).path == "tiled"
    shape = OP.shapes("representative")[0]
    launches = OP.launches(shape, torch.bfloat16)
    assert [x.name for x in launches] == ["_wq_gemm_kernel", "_splitk_reduce_kernel"]
    for launch in launches:
        assert set(launch.signature) == set(launch.kernel.arg_names)
    space = OP.tuning_space(shape, torch.bfloat16)
    assert space and all(64 % c.block_k == 0 for c in space)


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"x": torch.randn(2, 128)}, TypeError, "x: expected dtype"),
        ({"group_size": 32}, ValueError, "group_size: expected one of"),
        # equal to 64 but not an int: refused before it reaches shapes and address arithmetic
        ({"group_size": 64.0}, TypeError, "group_size: expected an int, got float 64.0"),
        ({"group_size": True}, TypeError, "group_size: expected an int, got bool"),
        ({"group_size": "64"}, TypeError, "group_size: expected an int, got str"),
        ({"group_size": torch.tensor(64)}, TypeError, "group_size: expected an int, got Tensor"),
        ({"qweight": torch.zeros(32, 8, dtype=torch.uint8)}, ValueError, "qweight: expected 64"),
        ({"scales": torch.ones(1, 8).half()}, ValueError, "scales: expected shape (2, 8)"),
        ({"zeros": torch.zeros(2, 8)}, TypeError, "zeros: expected dtype"),
        ({"bias": torch.ones(9).half()}, ValueError, "bias: expected shape (8,)"),
    ],
)
@pytest.mark.parametrize("fn", [w4a16_triton, w4a16_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    args = {
        "x": torch.randn(2, 128).half(),
        "qweight": torch.zeros(64, 8, dtype=torch.uint8),
        "scales": torch.ones(2, 8).half(),
        "zeros": torch.zeros(2, 8, dtype=torch.uint8),
        "group_size": 64,
        **kwargs,
    }
    with pytest.raises(exc) as info:
        fn(**args)
    assert words in str(info.value)


@pytest.mark.parametrize("zero", [16, 200, 255])
@pytest.mark.parametrize("fn", [w4a16_triton, w4a16_torch], ids=["triton", "torch"])
def test_zero_points_outside_int4_are_refused(fn, zero):
    # past 15 the two paths disagree (int32 codes in the kernel, 16-bit floats in torch)
    zeros = torch.zeros(2, 8, dtype=torch.uint8)
    zeros[1, 5] = zero
    args = {"x": torch.randn(2, 128).half(), "qweight": torch.zeros(64, 8, dtype=torch.uint8),
            "scales": torch.ones(2, 8).half(), "zeros": zeros, "group_size": 64}  # fmt: skip
    with pytest.raises(
        ValueError, match=rf"zeros: expected int4 zero points in \[0, 15\], got a {zero}"
    ):
        fn(**args)
    fn(**args, check=False)  # unchecked: a weight known good (quantize_int4's) costs no sync
    with pytest.raises(TypeError, match="check: expected a bool"):
        fn(**{**args, "zeros": torch.zeros(2, 8, dtype=torch.uint8)}, check=1)


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("fn", [w4a16_triton, w4a16_torch], ids=["triton", "torch"])
def test_k_zero_is_an_empty_sum(fn, bias):
    empty = torch.zeros(0, 8, dtype=torch.uint8)
    b = torch.randn(8).half() if bias else None
    out = fn(torch.randn(3, 0).half(), empty, torch.ones(0, 8).half(), empty, 64, b)
    assert torch.equal(out, torch.zeros(3, 8).half() if b is None else b.expand(3, 8))


def test_a_numpy_integer_group_size_is_an_int():
    w = _packing.quantize_int4(torch.randn(128, 8), np.int64(64), dtype=torch.float16)
    x = torch.randn(2, 128).half()
    got = w4a16_triton(x, w.qweight, w.scales, w.zeros, np.int64(64))
    assert torch.equal(got, w4a16_triton(x, w.qweight, w.scales, w.zeros, 64))


def test_int4_block_k_must_divide_the_group():
    args = OP.inputs(Shape("t", {"M": 2, "N": 8, "K": 128}, {"group_size": 64}),
                     torch.float16, "cpu")  # fmt: skip
    with pytest.raises(ValueError, match="block_k=128 must divide group_size=64"):
        w4a16_triton(**args, config=WQConfig(16, 32, 128))


def test_trivial_candidates_fail_the_contract():
    shape = OP.shapes("representative")[2].reduced(16)
    inputs = OP.inputs(shape, torch.bfloat16, "cpu", seed=9)
    (ref,), _ = OP.run_reference(inputs)
    # the same layer with the weight's zero points off by one code
    shifted = {**_clone(inputs), "zeros": (inputs["zeros"] + 1).clamp(max=15)}
    candidates = {
        "zeros": torch.zeros_like(ref).bfloat16(),
        "one row dropped": torch.cat([ref[:-1], torch.zeros_like(ref[-1:])]).bfloat16(),
        "zero points off by one": OP.variants["torch"](**shifted),
    }
    caught = []
    for name, out in candidates.items():
        with pytest.raises(AssertionError, match="rel L2"):
            _check(OP, inputs, lambda got=out, **kw: got, torch.bfloat16)
        caught.append(name)
    assert caught == list(candidates)


# --- planted defects ----------------------------------------------------------------------------

MUTANTS = {
    # the group's scale looked up by packed row (k/2) instead of k
    "group-scale-index": ("g = k0 // GROUP_SIZE", "g = (k0 // 2) // GROUP_SIZE"),
    # zero point added instead of subtracted
    "zero-point-sign": ("w_lo = ((q & 15) - z[None, :])", "w_lo = ((q & 15) + z[None, :])"),
    # low and high nibbles swapped: k = 2i read from the high nibble
    "nibble-order": ("w_lo = ((q & 15) -", "w_lo = ((q >> 4) -"),
}


@pytest.mark.parametrize("mutant_name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, mutant_name):
    old, new = MUTANTS[mutant_name]
    mutant = mutate(w4._wq_gemm_kernel, old, new, tmp_path)
    mutant.fn.__globals__["_tile_coords"] = kernels._tile_coords
    monkeypatch.setattr(w4, "_wq_gemm_kernel", mutant)
    shape = Shape("t", {"M": 20, "N": 40, "K": 192}, {"group_size": 64})
    inputs = OP.inputs(shape, torch.float16, "cpu", 3)
    config = WQConfig(32, 32, 32, 2, 1, 4, 2)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        _check(OP, inputs, lambda **kw: w4a16_triton(**kw, config=config), torch.float16)
