"""Float8 quantization (per token, per tensor, static): the Triton kernel through the
interpreter against the float64 reference, round trips, and the float8 cast itself (RMSNorm +
per-token quantization: tests/ops/norm/test_rmsnorm_fp8_quant.py)."""

import importlib

import pytest
import torch

from kernelab.numerics import special_mismatch
from kernelab.ops import FP8_QUANT, Shape, fp8_quant
from kernelab.ops.quant.fp8_quant import (
    AMAX,
    FP8_DTYPES,
    MIN_SCALE,
    PER_GROUP,
    PER_TOKEN,
    Fp8QuantConfig,
    fp8_quant_torch,
    fp8_quant_triton,
)
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check

fp8_module = importlib.import_module("kernelab.ops.quant.fp8_quant")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", FP8_QUANT.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = FP8_QUANT.inputs(shape.reduced(32), dtype, "cpu", seed=7)
    check(FP8_QUANT, inputs, fp8_quant_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_reference_on_reduced_representative_shapes(dtype):
    for shape in FP8_QUANT.shapes("representative")[-2:]:  # 4096 x 18944, per token / tensor
        check(
            FP8_QUANT, FP8_QUANT.inputs(shape.reduced(2), dtype, "cpu", 2), fp8_quant_triton, dtype
        )


@pytest.mark.parametrize("per_token", [True, False], ids=["per-token", "per-tensor"])
@pytest.mark.parametrize("dist", ["normal", "heavy", "tiny", "huge"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_within_the_format_resolution_and_scales_are_finite(dtype, dist, per_token):
    """x ≈ values · scale to half a float8 step: 2^-4 relative in e4m3's normal range, half the
    smallest subnormal step (2^-10 of the scale) below it; scales are finite and positive."""
    shape = Shape("t", {"rows": 6, "cols": 300}, {"per_token": per_token})
    x = FP8_QUANT.inputs(shape, dtype, "cpu", seed=1, dist=dist)["x"]
    config = Fp8QuantConfig(2, 128, 1) if not per_token else None
    values, scales = fp8_quant_triton(x, per_token=per_token, config=config)
    assert values.dtype == E4M3 and scales.dtype == torch.float32
    assert scales.shape == ((6, 1) if per_token else (1,))
    assert torch.isfinite(scales).all() and (scales > 0).all()
    xd, sd = x.double(), scales.double()
    deq = values.double() * sd
    bound = 2.0**-4 * xd.abs() + 2.0**-10 * sd + 1e-6 * xd.abs()
    assert ((deq - xd).abs() <= bound).all()
    # The scale is tight: the largest magnitude of each row (or of the tensor) maps to ±448.
    amax = values.double().abs().amax(dim=-1, keepdim=per_token)
    assert (amax.reshape(-1) == 448).all() if per_token else amax.max() == 448


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=str)
def test_all_zero_rows_get_a_finite_nonzero_scale(fp8_dtype):
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    x[1] = 0
    values, scales = fp8_quant_triton(x, per_token=True, fp8_dtype=fp8_dtype)
    assert scales[1].item() == MIN_SCALE and (values[1].float() == 0).all()
    assert torch.isfinite(1 / scales).all()
    values, scales = fp8_quant_triton(torch.zeros(3, 5), fp8_dtype=fp8_dtype)
    assert scales.item() == MIN_SCALE and (values.float() == 0).all()
    assert fp8_quant_triton(torch.empty(0, 8))[1].item() == MIN_SCALE


# --- the float8 cast under the interpreter ------------------------------------------------------
#
# Triton's interpreter narrows float32 to float8 by bit manipulation and loses the carry when
# rounding overflows the mantissa (triton 3.9: 125.6 became 64 instead of 128). kernelab's
# @kernel makes interpreted narrowing round to nearest even and saturate, as the GPU's
# cvt.rn.satfinite.e4m3x2.f32 does (the instruction the sm_90 PTX of these kernels contains).
# The two tests below check both halves separately, so that neither can hide the other: the
# arithmetic up to the cast is exactly eager torch's, and the cast is exactly torch's cast.

HARD = [125.6, 127.9, 239.9, 247.0, 447.0, 449.0, 1e6, 0.0029296875, 0.0009765625, 1e-9, 0.0]


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=str)
def test_the_float8_cast_inside_the_kernel_is_torchs_cast(fp8_dtype):
    """Carries into the exponent, ties, subnormals and saturation, cast by the kernel itself
    (static scale 1, so the value reaching the cast is the input) and by torch."""
    x = torch.tensor([HARD + [-v for v in HARD]], dtype=torch.float32)
    fmax = torch.finfo(fp8_dtype).max
    values, _ = fp8_quant_triton(x, fp8_dtype=fp8_dtype, scale=torch.ones(1))
    expected = x.clamp(-fmax, fmax).to(fp8_dtype)
    assert torch.equal(values.view(torch.uint8), expected.view(torch.uint8))
    assert values[0, 0].float().item() == 128.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_arithmetic_up_to_the_cast_is_eager_torchs_to_the_bit(dtype):
    """The kernel run with a float32 output buffer stores what it would cast: identical bits to
    eager torch's float32 x / scale (IEEE division, same clamp), and identical scales."""
    x = FP8_QUANT.inputs(Shape("t", {"rows": 5, "cols": 1021}), dtype, "cpu", seed=4)["x"]
    pre = torch.empty(5, 1021, dtype=torch.float32)
    scales = torch.empty(5, dtype=torch.float32)
    fp8_module._fp8_quant_kernel[(5, 1)](
        pre, 1021, scales, 0, x, x.stride(0), scales, 5, 1021,
        BLOCK_M=1, BLOCK_N=1024, MODE=PER_TOKEN, SINGLE_PASS=True, FP8_MAX=448.0,
        MIN_SCALE=MIN_SCALE, GROUP_SIZE=1, UE8M0=False,
    )  # fmt: skip
    xf = x.float()
    eager_scale = (xf.abs().amax(-1, keepdim=True) / 448.0).clamp_min(MIN_SCALE)
    assert torch.equal(scales, eager_scale.reshape(-1))
    assert torch.equal(pre, (xf / eager_scale).clamp(-448.0, 448.0))
    # ... and with the cast, the kernel equals eager torch bit for bit.
    v, s = fp8_quant_triton(x, per_token=True)
    ev, es = fp8_quant_torch(x, per_token=True)
    assert torch.equal(v.view(torch.uint8), ev.view(torch.uint8)) and torch.equal(s, es)


@pytest.mark.parametrize(
    "config", [None, Fp8QuantConfig(2, 128, 1)], ids=["one-pass", "looped-or-tiled"]
)
@pytest.mark.parametrize("per_token", [True, False], ids=["per-token", "per-tensor"])
def test_nan_and_inf_propagate_as_in_eager_torch(per_token, config):
    """A NaN makes its row's (or the tensor's) max, scale and values NaN, as torch's amax does;
    an infinity gives an infinite scale. The GPU's max/min drop NaN, so the kernels count NaN
    apart and clamp with NaN propagation; this pins the semantics on every device."""
    x = torch.randn(4, 300)
    x[1, 7], x[2, 11], x[2, 200] = float("nan"), float("inf"), -5.0
    values, scales = fp8_quant_triton(x, per_token=per_token, config=config)
    eager_values, eager_scales = fp8_quant_torch(x, per_token=per_token)
    assert not special_mismatch(values, eager_values).any()
    assert not special_mismatch(scales, eager_scales).any()


# --- API ----------------------------------------------------------------------------------------


def test_public_op_dispatches(interpret, monkeypatch):
    x = torch.randn(2, 3, 32)
    v, _ = fp8_quant(x, per_token=True)
    assert torch.equal(v.view(torch.uint8), fp8_quant_torch(x, True)[0].view(torch.uint8))
    calls = []
    monkeypatch.setattr(fp8_module, "fp8_quant_triton", lambda *a: calls.append(1))
    monkeypatch.delenv("KERNELAB_INTERPRET")
    fp8_quant(x)
    assert calls == []


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"x": torch.randn(2, 8).int()}, TypeError, "x: expected dtype"),
        ({"fp8_dtype": torch.float16}, TypeError, "fp8_dtype: expected one of"),
        ({"per_token": 1}, TypeError, "per_token: expected a bool"),
        ({"scale": torch.ones(2)}, ValueError, "scale: expected one element"),
        ({"scale": torch.ones(1).half()}, TypeError, "scale: expected dtype"),
        ({"scale": torch.zeros(1)}, ValueError, "scale: expected a finite positive float"),
        ({"scale": -torch.ones(1)}, ValueError, "scale: expected a finite positive float"),
        ({"scale": torch.full((1,), float("inf"))}, ValueError, "scale: expected a finite"),
        ({"scale": torch.full((1,), float("nan"))}, ValueError, "got nan"),
        ({"per_token": None}, TypeError, "per_token: expected a bool, got NoneType"),
        ({"scale": torch.ones(1), "per_token": True}, ValueError, "scale: a given (static)"),
    ],
)
@pytest.mark.parametrize("fn", [fp8_quant_triton, fp8_quant_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**{"x": torch.randn(2, 8), **kwargs})
    assert words in str(info.value)


def test_launches_compile_to_wide_accesses_without_spills_for_sm90():
    """Including the float8 stores: 16 values per thread, one 128-bit store, after a
    cvt.rn.satfinite conversion (round to nearest even, saturating)."""
    launches = [
        launch
        for shape in FP8_QUANT.shapes("representative")[-2:]  # per token, per tensor (2)
        for launch in FP8_QUANT.launches(shape, torch.bfloat16)
    ]
    assert len(launches) == 3  # per tensor: the max, then the quantization
    for launch in launches:
        writes = launch.constexprs.get("MODE") != AMAX  # the max-only launch writes no values
        ptx = assert_wide_and_unspilled(launch, stores=writes)
        assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == writes


# --- planted defects ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "per_token", "config"),
    [
        # a scale computed from the wrong row: the largest row of the tile, not the row itself
        (
            "tl.max(tl.abs(x), axis=1))",
            "tl.max(tl.max(tl.abs(x), axis=1), axis=0) + tl.zeros([BLOCK_M], dtype=tl.float32))",
            True,
            Fp8QuantConfig(4, 1024, 4),
        ),
        # per tensor: each tile scaled by its own maximum instead of the tensor's
        (
            "amax = tl.load(Amax).to(tl.float32, bitcast=True)",
            "amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)",
            False,
            Fp8QuantConfig(1, 512, 1),
        ),
        # the looped per-token path takes max(x), not max|x|: negative peaks get clipped
        (
            "amax = tl.maximum(amax, tl.abs(x), tl.PropagateNan.ALL)",
            "amax = tl.maximum(amax, x, tl.PropagateNan.ALL)",
            True,
            Fp8QuantConfig(1, 128, 1),
        ),
    ],
    ids=["scale-from-wrong-row", "per-tile-not-per-tensor", "looped-max-not-abs"],
)
def test_planted_defects_in_quantization_are_caught(
    monkeypatch, tmp_path, old, new, per_token, config
):
    mutant = mutate(fp8_module._fp8_quant_kernel, old, new, tmp_path)
    monkeypatch.setattr(fp8_module, "_fp8_quant_kernel", mutant)
    shape = Shape("t", {"rows": 8, "cols": 1000}, {"per_token": per_token})
    inputs = FP8_QUANT.inputs(shape, torch.float32, "cpu", seed=5)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        check(FP8_QUANT, inputs, lambda **kw: fp8_quant_triton(**kw, config=config), torch.float32)


# --- per token group (block-scaled GEMM activations) ---------------------------------------------

quant_kernels = importlib.import_module("kernelab.ops.quant._kernels")


@pytest.mark.parametrize("ue8m0", [False, True], ids=["float32-scales", "ue8m0"])
@pytest.mark.parametrize("dist", ["normal", "heavy", "tiny"])
def test_group_quantization_is_eager_torchs_to_the_bit(dist, ue8m0):
    shape = Shape("t", {"rows": 9, "cols": 400}, {"group_size": 128, "ue8m0": ue8m0})
    inputs = FP8_QUANT.inputs(shape, torch.bfloat16, "cpu", seed=3, dist=dist)
    values, scales = fp8_quant_triton(**inputs)
    ev, es = fp8_quant_torch(**inputs)
    assert scales.shape == (9, 4) and values.shape == (9, 400)
    assert torch.equal(values.view(torch.uint8), ev.view(torch.uint8)) and torch.equal(scales, es)
    tv, ts = fp8_quant_triton(**inputs, config=Fp8QuantConfig(4, 256, 1))  # 2 groups, 2 tiles
    assert torch.equal(tv.view(torch.uint8), ev.view(torch.uint8)) and torch.equal(ts, es)
    x = inputs["x"].double()
    for g in range(4):
        cols = slice(128 * g, 128 * (g + 1))
        amax = x[:, cols].abs().amax(dim=1)
        if ue8m0:
            assert torch.equal(scales[:, g], torch.exp2(torch.log2(scales[:, g]).round()))
            assert (scales[:, g].double() * 448 >= amax).all()
            assert (scales[:, g].double() * 224 < amax).all()
        else:
            assert torch.allclose(scales[:, g].double() * 448, amax, rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"group_size": 100}, "group_size: expected None or one of"),
        # equal to 64 and 128, but not ints: refused naming the argument, not by torch's reshape
        ({"group_size": 64.0}, "group_size: expected an int, got float 64.0"),
        ({"group_size": 128.0}, "group_size: expected an int, got float 128.0"),
        ({"group_size": True}, "group_size: expected an int, got bool"),
        ({"group_size": 128, "per_token": True}, "group_size: per-token-group"),
        ({"ue8m0": True}, "ue8m0: power-of-two scales"),
    ],
)
def test_group_arguments_are_checked(kwargs, words):
    exc = TypeError if "expected an int" in words else ValueError
    with pytest.raises(exc, match=words):
        fp8_quant_triton(torch.randn(2, 256), **kwargs)


GROUP_MUTANTS = {
    # power-of-two scales rounded down: the group's largest values saturate
    "ue8m0-rounded-down": ("((bits + 0x7FFFFF) & 0x7F800000)", "(bits & 0x7F800000)"),
    # scales of a tile's groups written to the slots of the tile index, not the group index
    "group-scale-to-wrong-slot": (
        "g = pid_n * G + tl.arange(0, G)",
        "g = pid_n + tl.arange(0, G)",
    ),
    # the scale of a group taken over the row tile's largest row
    "group-scale-over-rows": (
        "group_max = tl.max(tl.abs(x3), axis=2)",
        "group_max = tl.max(tl.max(tl.abs(x3), axis=2), axis=0)[None, :]"
        " + tl.zeros([BLOCK_M, G], tl.float32)",
    ),
}


@pytest.mark.parametrize("name", list(GROUP_MUTANTS))
def test_planted_defects_in_group_quantization_are_caught(monkeypatch, tmp_path, name):
    old, new = GROUP_MUTANTS[name]
    source = quant_kernels._pow2_ceil if name.startswith("ue8m0") else fp8_module._fp8_quant_kernel
    mutant = mutate(source, old, new, tmp_path)
    if name.startswith("ue8m0"):
        monkeypatch.setitem(fp8_module._fp8_quant_kernel.fn.__globals__, "_pow2_ceil", mutant)
    else:
        mutant.fn.__globals__["_pow2_ceil"] = quant_kernels._pow2_ceil
        monkeypatch.setattr(fp8_module, "_fp8_quant_kernel", mutant)
    shape = Shape("t", {"rows": 8, "cols": 384}, {"group_size": 128, "ue8m0": True})
    inputs = FP8_QUANT.inputs(shape, torch.float32, "cpu", seed=5)
    config = Fp8QuantConfig(4, 256, 1)  # two groups of four rows per tile, two tiles per row
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        check(FP8_QUANT, inputs, lambda **kw: fp8_quant_triton(**kw, config=config), torch.float32)


def test_group_launch_compiles_to_wide_accesses_without_spills_for_sm90():
    shape = next(s for s in FP8_QUANT.shapes("representative") if s.params.get("ue8m0"))
    (launch,) = FP8_QUANT.launches(shape, torch.bfloat16)
    assert launch.constexprs["MODE"] == PER_GROUP and launch.constexprs["GROUP_SIZE"] == 128
    assert "cvt.rn.satfinite.e4m3x2.f32" in assert_wide_and_unspilled(launch)
