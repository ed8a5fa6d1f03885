"""RMSNorm + per-token float8 quantization (the norm family's kernel with QUANT on): the Triton
kernel through the interpreter against the float64 reference, the values before the cast, NaN
propagation, the in-place residual, and a planted defect."""

import importlib

import pytest
import torch

from kernelab.core.runtime.fp8 import FP8_DTYPES, MIN_SCALE
from kernelab.numerics import special_mismatch
from kernelab.ops import RMSNORM_FP8_QUANT, Shape, rmsnorm_fp8_quant
from kernelab.ops.norm import _common as _norm
from kernelab.ops.norm._kernels import _norm_kernel
from kernelab.ops.norm.rmsnorm_fp8_quant import rmsnorm_fp8_quant_torch, rmsnorm_fp8_quant_triton
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check, clone

fused_module = importlib.import_module("kernelab.ops.norm.rmsnorm_fp8_quant")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", RMSNORM_FP8_QUANT.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = RMSNORM_FP8_QUANT.inputs(shape.reduced(32), dtype, "cpu", seed=7)
    check(RMSNORM_FP8_QUANT, inputs, rmsnorm_fp8_quant_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_reference_on_a_reduced_representative_shape(dtype):
    shape = RMSNORM_FP8_QUANT.shapes("representative")[-1].reduced(2)  # 8192 wide, residual
    inputs = RMSNORM_FP8_QUANT.inputs(shape, dtype, "cpu", seed=2)
    check(RMSNORM_FP8_QUANT, inputs, rmsnorm_fp8_quant_triton, dtype)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=str)
def test_all_zero_rows_get_a_finite_nonzero_scale(fp8_dtype):
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    x[1] = 0
    v, s = rmsnorm_fp8_quant_triton(x, torch.ones(64, dtype=torch.bfloat16), fp8_dtype=fp8_dtype)
    assert s[1].item() == MIN_SCALE and (v[1].float() == 0).all()


def test_the_fused_kernels_values_before_the_cast_are_the_float32_norm_over_the_scale():
    x, w = torch.randn(3, 700), torch.randn(700)
    pre = torch.empty(3, 700)
    scales = torch.empty(3, 1)
    # The float8 maximum reaches the kernel as a constexpr; float32 output keeps what it casts.
    _norm_kernel[(3,)](
        pre, 700, scales, x, 700, x, 700, w, w, 3, 700, 1e-6,
        BLOCK_M=1, BLOCK_N=1024, IS_RMS=True, HAS_BIAS=False, HAS_RESIDUAL=False,
        SINGLE_PASS=True, QUANT=True, FP8_MAX=448.0, MIN_SCALE=MIN_SCALE,
    )  # fmt: skip
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    es = (y.abs().amax(-1, keepdim=True) / 448.0).clamp_min(MIN_SCALE)
    torch.testing.assert_close(scales, es, rtol=1e-6, atol=0)
    torch.testing.assert_close(pre, (y / es).clamp(-448, 448), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("looped", [False, True], ids=["one-pass", "looped"])
def test_nan_and_inf_propagate_as_in_eager_torch(looped):
    """A NaN makes its row's max, scale and values NaN, as torch's amax does; an infinity gives
    an infinite scale (the quantization's semantics, see tests/ops/quant/test_fp8_quant.py)."""
    x = torch.randn(4, 300)
    x[1, 7], x[2, 11], x[2, 200] = float("nan"), float("inf"), -5.0
    w = torch.randn(300)
    ncfg = _norm.NormConfig(1, 128, 1) if looped else None
    v, s = rmsnorm_fp8_quant_triton(x, w, config=ncfg)
    ev, es = rmsnorm_fp8_quant_torch(x, w)
    assert not special_mismatch(v, ev).any() and not special_mismatch(s, es).any()
    assert torch.isnan(s[1]).all() and torch.isfinite(s[[0, 3]]).all()


# --- API ----------------------------------------------------------------------------------------


def test_public_op_updates_the_residual_in_place(interpret):
    x, r, w = torch.randn(2, 3, 32), torch.randn(2, 3, 32), torch.randn(32)
    r_eager = r.clone()
    v, s = rmsnorm_fp8_quant(x, w, residual=r)
    _, es = rmsnorm_fp8_quant_torch(x, w, residual=r_eager)
    assert v.shape == x.shape and s.shape == (2, 3, 1)
    torch.testing.assert_close(r, r_eager, rtol=0, atol=0)
    torch.testing.assert_close(s, es)


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"weight": torch.ones(7)}, ValueError, "weight: expected shape (8,)"),
        ({"residual": torch.randn(2, 8).half()}, TypeError, "residual: expected dtype"),
        ({"fp8_dtype": torch.float8_e5m2}, TypeError, "fp8_dtype: expected one of"),
        ({"eps": 0}, ValueError, "eps: expected a finite positive float"),
        ({"eps": float("inf")}, ValueError, "eps: expected a finite positive float, got inf"),
        ({"eps": float("nan")}, ValueError, "eps: expected a finite positive float, got nan"),
        ({"eps": True}, TypeError, "eps: expected a float, got bool"),
    ],
)
@pytest.mark.parametrize(
    "fn", [rmsnorm_fp8_quant_triton, rmsnorm_fp8_quant_torch], ids=["triton", "torch"]
)
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**{"x": torch.randn(2, 8), "weight": torch.ones(8), **kwargs})
    assert words in str(info.value)


def test_launch_compiles_to_wide_accesses_without_spills_for_sm90():
    """Including the float8 stores: one 128-bit store after a cvt.rn.satfinite conversion
    (round to nearest even, saturating)."""
    launches = RMSNORM_FP8_QUANT.launches(
        RMSNORM_FP8_QUANT.shapes("representative")[-1], torch.bfloat16
    )
    assert len(launches) == 1
    for launch in launches:
        ptx = assert_wide_and_unspilled(launch, stores=True)
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx


# --- planted defects ----------------------------------------------------------------------------


def test_planted_defect_in_the_fused_kernel_is_caught(monkeypatch, tmp_path):
    # the row maximum taken before the weight is applied
    mutant = mutate(
        fused_module._rmsnorm_quant_kernel,
        "amax = tl.max(tl.abs(hw), axis=1)",
        "amax = tl.max(tl.abs(hc), axis=1)",
        tmp_path,
    )
    monkeypatch.setattr(fused_module, "_rmsnorm_quant_kernel", mutant)
    shape = Shape("t", {"rows": 4, "cols": 1000}, {"residual": True})
    inputs = RMSNORM_FP8_QUANT.inputs(shape, torch.float32, "cpu", seed=5)
    with pytest.raises(AssertionError, match="rel L2"):
        check(RMSNORM_FP8_QUANT, clone(inputs), rmsnorm_fp8_quant_triton, torch.float32)
