"""FP8 GEMM through the interpreter against float64 on the dequantized inputs."""

import importlib

import pytest
import torch

from kernelab.numerics import error
from kernelab.ops import Shape
from kernelab.ops.matmul.fp8_gemm import (
    FP8_GEMM,
    Fp8Config,
    fp8_gemm,
    fp8_gemm_torch,
    fp8_gemm_triton,
    fp8_supported,
    quantize_fp8,
)
from tests.mutants import mutate
from tests.opcheck import check
from tests.opcheck import clone as _clone

fp8_module = importlib.import_module("kernelab.ops.matmul.fp8_gemm")
kernels = importlib.import_module("kernelab.ops.matmul._kernels")
SMALL = Fp8Config(32, 32, 32, group_m=2, num_warps=4, num_stages=2)


def _check(inputs, fn):
    return check(FP8_GEMM, inputs, fn, torch.bfloat16)


@pytest.mark.parametrize("shape", FP8_GEMM.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape):
    _check(FP8_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=13), fp8_gemm_triton)


@pytest.mark.parametrize("dist", ["normal", "heavy", "huge"])
@pytest.mark.parametrize("m", [1, 128])
def test_representative_shapes_at_interpreter_size(m, dist):
    shape = next(s for s in FP8_GEMM.shapes("representative") if s.dims["M"] == m).reduced(8)
    _check(FP8_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=1, dist=dist), fp8_gemm_triton)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_small_config_and_scalings(scaling):
    shape = Shape("t", {"M": 40, "N": 72, "K": 96}, {"scaling": scaling, "bias": True})
    inputs = FP8_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=2)
    _check(inputs, lambda **kw: fp8_gemm_triton(**kw, config=SMALL))


def test_quantize_fp8_bounds_the_error_and_uses_the_full_range():
    x = torch.randn(6, 64) * torch.logspace(-3, 3, 6)[:, None]
    q, s = quantize_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (6,)
    assert torch.allclose(q.float().abs().amax(dim=1), torch.full((6,), 448.0))
    rel = (q.double() * s.double()[:, None] - x.double()).abs() / x.double().abs()
    assert rel[x.abs() > 1e-2 * x.abs().amax(1, keepdim=True)].max() <= 2**-4
    qt, st = quantize_fp8(x, per_row=False)
    assert st.shape == (1,) and float(qt.float().abs().max()) == 448.0


def test_device_support_guard():
    assert fp8_supported("cpu")
    assert fp8_supported("sm_90") and fp8_supported("sm_89") and fp8_supported("gfx942")
    assert not fp8_supported("sm_80")


def test_public_op_through_the_interpreter_and_on_torch(interpret, monkeypatch):
    shape = Shape("t", {"M": 3, "N": 24, "K": 32}, {"scaling": "row"})
    inputs = FP8_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=4)
    interpreted = fp8_gemm(**_clone(inputs))
    monkeypatch.delenv("KERNELAB_INTERPRET")
    eager = fp8_gemm(**_clone(inputs))
    (ref,), _ = FP8_GEMM.run_reference(inputs)
    assert error(interpreted, ref).rel_l2 < 1e-2 and error(eager, ref).rel_l2 < 1e-2


def test_cost_counts_one_byte_per_input_element():
    shape = Shape("t", {"M": 4, "N": 8, "K": 16}, {"scaling": "row"})
    cost = FP8_GEMM.cost(FP8_GEMM.inputs(shape, torch.bfloat16, "meta"))
    assert cost.bytes == 4 * 16 + 8 * 16 + 2 * 4 * 8 + 4 * (4 + 8)
    assert cost.flops == 2 * 4 * 8 * 16


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"a": torch.randn(2, 16)}, TypeError, "a: expected dtype"),
        ({"scale_a": torch.ones(3)}, ValueError, "scale_a: expected 1 or M = 2"),
        ({"scale_b": torch.ones(2, 1)}, ValueError, "scale_b: expected 1 dimensions"),
        ({"bias": torch.ones(8)}, TypeError, "bias: expected dtype"),
        ({"b_layout": "kn"}, ValueError, "b: expected K = 16"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, exc, words):
    f8 = torch.float8_e4m3fn
    args = {
        "a": torch.randn(2, 16).to(f8),
        "b": torch.randn(8, 16).to(f8),
        "scale_a": torch.ones(2),
        "scale_b": torch.ones(1),
        **kwargs,
    }
    with pytest.raises(exc) as info:
        fp8_gemm_triton(**args)
    assert words in str(info.value)


MUTANTS = {
    # the weight's per-column scales never applied
    "scale-b-dropped": (
        "acc = acc * sa[:, None] * sb[None, :]",
        "acc = acc * sa[:, None]",
    ),
    # row and column scales applied along the wrong axes
    "scales-transposed": (
        "acc = acc * sa[:, None] * sb[None, :]",
        "acc = acc * sa[None, :] * sb[:, None]",
    ),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_defects_are_caught(monkeypatch, tmp_path, name):
    old, new = MUTANTS[name]
    mutant = mutate(fp8_module._fp8_gemm_kernel, old, new, tmp_path)
    for helper in ("_tile_coords", "_gemm_tile"):
        mutant.fn.__globals__[helper] = getattr(kernels, helper)
    monkeypatch.setattr(fp8_module, "_fp8_gemm_kernel", mutant)
    shape = Shape("t", {"M": 32, "N": 32, "K": 64}, {"scaling": "row"})
    inputs = FP8_GEMM.inputs(shape, torch.bfloat16, "cpu", seed=6, dist="heavy")
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        _check(inputs, lambda **kw: fp8_gemm_triton(**kw, config=SMALL))


@pytest.mark.parametrize("fn", [fp8_gemm_triton, fp8_gemm_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
@pytest.mark.parametrize("name", ["scale_a", "scale_b"])
def test_a_scale_that_is_not_finite_and_positive_is_refused_when_checked(fn, bad, name):
    f8 = torch.float8_e4m3fn
    args = {
        "a": torch.randn(2, 16).to(f8),
        "b": torch.randn(8, 16).to(f8),
        "scale_a": torch.ones(2),
        "scale_b": torch.ones(8),
    }
    args[name][1] = bad
    refused = rf"{name}: expected finite positive scales, got .* at index 1$"
    with pytest.raises(ValueError, match=refused):
        fn(**args)
    assert fn(**args, check=False).shape == (2, 8)  # unchecked: no sync, no refusal
    with pytest.raises(TypeError, match="check: expected a bool"):
        fn(**{**args, name: torch.ones_like(args[name])}, check=1)
