"""Weight-only int4/int8 GEMMs through the interpreter, against the float64 reference computed
from the same quantized weights."""

import importlib

import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import W4A16_GEMM, W8A16_GEMM, Shape, w4a16_gemm, w4a16_ref
from kernelab.ops import packing as _packing
from kernelab.ops.matmul._weight_only import WQConfig, w4a16_triton, w8a16_triton
from tests.mutants import mutate

qg = importlib.import_module("kernelab.ops.matmul._weight_only")
kernels = importlib.import_module("kernelab.ops.matmul._kernels")

OPS = {"w4a16": W4A16_GEMM, "w8a16": W8A16_GEMM}
DTYPES = (torch.float16, torch.bfloat16)


def _clone(inputs):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _check(op, inputs, fn, dtype):
    (ref,), _ = op.run_reference(inputs)
    base = op.variants["torch"](**_clone(inputs))
    out = fn(**_clone(inputs))
    assert type(out) is torch.Tensor and out.dtype == dtype and out.shape == ref.shape
    tol, _ = op.contract.tolerance_for(dtype, error(base, ref).rel_l2)
    err = error(out, ref)
    assert torch.isfinite(out).all(), "non-finite output"
    assert err.rel_l2 <= tol, f"rel L2 {err.rel_l2:.3e} > tolerance {tol:.3e} at {err}"


def _cases(shape_set, pick=None):
    return [
        pytest.param(name, s, id=f"{name}-{s.label}")
        for name, op in OPS.items()
        for s in (pick(op.shapes(shape_set)) if pick else op.shapes(shape_set))
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "shape"), _cases("edge"))
def test_kernel_matches_reference_on_edge_shapes(name, shape, dtype):
    op = OPS[name]
    _check(op, op.inputs(shape, dtype, "cpu", seed=21), op.variants["kernelab"], dtype)


def _decode_and_prefill(shapes):
    return [shapes[0].reduced(1), shapes[2].reduced(8)]  # M = 1 (GEMV path) and M = 128


@pytest.mark.parametrize(("name", "shape"), _cases("representative", _decode_and_prefill))
def test_representative_shapes_at_interpreter_size(name, shape):
    op = OPS[name]
    inputs = op.inputs(shape, torch.bfloat16, "cpu", seed=6, dist="heavy")
    _check(op, inputs, op.variants["kernelab"], torch.bfloat16)


@pytest.mark.parametrize(
    "config",
    [
        WQConfig(16, 32, 32, 1, 4, 4, 2),  # GEMV-shaped: two K steps per group of 64, 4 slices
        WQConfig(32, 16, 64, 2, 1, 4, 2),  # tiled, grouped order
        WQConfig(16, 64, 32, 1, 3, 4, 2),  # uneven K slices
    ],
    ids=str,
)
@pytest.mark.parametrize("name", list(OPS))
def test_configs(name, config):
    op = OPS[name]
    shape = Shape("t", {"M": 21, "N": 40, "K": 320}, {"group_size": 64, "bias": True})
    if name == "w8a16":
        shape = Shape("t", shape.dims, {"bias": True})
    fn = w4a16_triton if name == "w4a16" else w8a16_triton
    inputs = op.inputs(shape, torch.float16, "cpu", seed=2)
    _check(op, inputs, lambda **kw: fn(**kw, config=config), torch.float16)


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
    w4 = W4A16_GEMM.cost(W4A16_GEMM.inputs(shape, torch.bfloat16, "meta"))
    w8 = W8A16_GEMM.cost(W8A16_GEMM.inputs(Shape("t", shape.dims), torch.bfloat16, "meta"))
    act = 2 * (2 * 256 + 2 * 64)  # x and out in bf16
    assert w4.bytes == act + 256 * 64 // 2 + 2 * 64 * 2 + 2 * 64  # codes, scales, zeros
    assert w8.bytes == act + 256 * 64 + 64 * 2
    assert w4.flops == w8.flops == 2 * 2 * 64 * 256


def test_default_configs_and_launches():
    gemv = WQConfig.default_for(1, 4096, 4096)
    assert gemv.path == "gemv" and gemv.split_k > 1
    assert WQConfig.default_for(2048, 4096, 4096).path == "tiled"
    shape = W4A16_GEMM.shapes("representative")[0]
    launches = W4A16_GEMM.launches(shape, torch.bfloat16)
    assert [x.name for x in launches] == ["_wq_gemm_kernel", "_splitk_reduce_kernel"]
    for launch in launches:
        assert set(launch.signature) == set(launch.kernel.arg_names)
    space = W4A16_GEMM.tuning_space(shape, torch.bfloat16)
    assert space and all(64 % c.block_k == 0 for c in space)


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"x": torch.randn(2, 128)}, TypeError, "x: expected dtype"),
        ({"group_size": 32}, ValueError, "group_size: expected one of"),
        ({"qweight": torch.zeros(32, 8, dtype=torch.uint8)}, ValueError, "qweight: expected 64"),
        ({"scales": torch.ones(1, 8).half()}, ValueError, "scales: expected shape (2, 8)"),
        ({"zeros": torch.zeros(2, 8)}, TypeError, "zeros: expected dtype"),
        ({"bias": torch.ones(9).half()}, ValueError, "bias: expected shape (8,)"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, exc, words):
    args = {
        "x": torch.randn(2, 128).half(),
        "qweight": torch.zeros(64, 8, dtype=torch.uint8),
        "scales": torch.ones(2, 8).half(),
        "zeros": torch.zeros(2, 8, dtype=torch.uint8),
        "group_size": 64,
        **kwargs,
    }
    with pytest.raises(exc) as info:
        w4a16_triton(**args)
    assert words in str(info.value)


def test_int4_block_k_must_divide_the_group():
    args = W4A16_GEMM.inputs(Shape("t", {"M": 2, "N": 8, "K": 128}, {"group_size": 64}),
                             torch.float16, "cpu")  # fmt: skip
    with pytest.raises(ValueError, match="block_k=128 must divide group_size=64"):
        w4a16_triton(**args, config=WQConfig(16, 32, 128))


def test_trivial_candidates_fail_the_contract():
    op = W4A16_GEMM
    shape = op.shapes("representative")[2].reduced(16)
    inputs = op.inputs(shape, torch.bfloat16, "cpu", seed=9)
    (ref,), _ = op.run_reference(inputs)
    # the same layer with the weight's zero points off by one code
    shifted = {**_clone(inputs), "zeros": (inputs["zeros"] + 1).clamp(max=15)}
    candidates = {
        "zeros": torch.zeros_like(ref).bfloat16(),
        "one row dropped": torch.cat([ref[:-1], torch.zeros_like(ref[-1:])]).bfloat16(),
        "zero points off by one": op.variants["torch"](**shifted),
    }
    caught = []
    for name, out in candidates.items():
        with pytest.raises(AssertionError, match="rel L2"):
            _check(op, inputs, lambda out=out, **kw: out, torch.bfloat16)
        caught.append(name)
    assert caught == list(candidates)


# --- planted defects ----------------------------------------------------------------------------

MUTANTS = {
    # the group's scale looked up by packed row (k/2) instead of k
    "group-scale-index": ("w4a16", "g = k0 // GROUP_SIZE", "g = (k0 // 2) // GROUP_SIZE"),
    # zero point added instead of subtracted
    "zero-point-sign": (
        "w4a16",
        "w_lo = ((q & 15) - z[None, :])",
        "w_lo = ((q & 15) + z[None, :])",
    ),
    # low and high nibbles swapped: k = 2i read from the high nibble
    "nibble-order": ("w4a16", "w_lo = ((q & 15) -", "w_lo = ((q >> 4) -"),
    # the int8 K loop skips the tail tile
    "int8-k-tail": (
        "w8a16",
        "for k0 in range(k_start, k_stop, BLOCK_K):\n            kk",
        "for k0 in range(k_start, k_stop - BLOCK_K, BLOCK_K):\n            kk",
    ),
    # the per-channel scale applied by row instead of by column
    "int8-scale-axis": ("w8a16", "tl.load(S + rn, mask=n_ok", "tl.load(S + rm, mask=m_ok"),
}


@pytest.mark.parametrize("mutant_name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, mutant_name):
    name, old, new = MUTANTS[mutant_name]
    mutant = mutate(qg._wq_gemm_kernel, old, new, tmp_path)
    mutant.fn.__globals__["_tile_coords"] = kernels._tile_coords
    monkeypatch.setattr(qg, "_wq_gemm_kernel", mutant)
    op = OPS[name]
    params = {"group_size": 64} if name == "w4a16" else {}
    inputs = op.inputs(Shape("t", {"M": 20, "N": 40, "K": 192}, params), torch.float16, "cpu", 3)
    fn = w4a16_triton if name == "w4a16" else w8a16_triton
    config = WQConfig(32, 32, 32, 2, 1, 4, 2)
    with pytest.raises(AssertionError, match=r"rel L2|non-finite"):
        _check(op, inputs, lambda **kw: fn(**kw, config=config), torch.float16)
