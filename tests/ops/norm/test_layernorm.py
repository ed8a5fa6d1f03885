"""LayerNorm: the norm family's kernel with IS_RMS off, against the float64 reference."""

import importlib

import pytest
import torch

from kernelab.ops import LAYERNORM, Shape, layernorm, layernorm_ref
from kernelab.ops.norm.layernorm import LayerNormConfig, layernorm_torch, layernorm_triton
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check

ln_module = importlib.import_module("kernelab.ops.norm.layernorm")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", LAYERNORM.shapes("edge"), ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = LAYERNORM.inputs(shape.reduced(64), dtype, "cpu", seed=7)
    check(LAYERNORM, inputs, layernorm_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_reference_on_a_reduced_representative_shape(dtype):
    shape = LAYERNORM.shapes("representative")[-1].reduced(2)  # 8192 wide, bias and residual
    check(LAYERNORM, LAYERNORM.inputs(shape, dtype, "cpu", seed=2), layernorm_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dist", ["shifted", "heavy", "tiny", "huge"])
def test_kernel_matches_reference_on_hard_distributions(dist, dtype):
    shape = Shape("t", {"rows": 3, "cols": 700}, {"bias": True, "residual": True})
    inputs = LAYERNORM.inputs(shape, dtype, "cpu", seed=3, dist=dist)
    check(LAYERNORM, inputs, layernorm_triton, dtype)


@pytest.mark.parametrize("config", [LayerNormConfig(1, 128, 1), LayerNormConfig(4, 64, 2)], ids=str)
def test_looped_path_is_correct_for_tuning_configs(config):
    shape = Shape("t", {"rows": 3, "cols": 300}, {"bias": True, "residual": True})
    inputs = LAYERNORM.inputs(shape, torch.float32, "cpu", seed=1, dist="shifted")
    check(LAYERNORM, inputs, lambda **kw: layernorm_triton(**kw, config=config), torch.float32)


def test_residual_is_updated_in_place_and_bias_is_optional():
    x, residual = torch.randn(4, 33), torch.randn(4, 33)
    weight, bias = torch.randn(33), torch.randn(33)
    expected = residual + x
    ptr = residual.data_ptr()
    out = layernorm_triton(x, weight, bias, residual=residual)
    assert residual.data_ptr() == ptr
    torch.testing.assert_close(residual, expected, rtol=0, atol=0)
    ref = layernorm_ref(expected.double(), weight.double(), bias.double())
    torch.testing.assert_close(out, ref.float())
    torch.testing.assert_close(layernorm_triton(x, weight), layernorm_torch(x, weight))


def test_public_op_dispatch_and_empty_input(interpret, monkeypatch):
    out = layernorm(torch.empty(0, 64, dtype=torch.float16), torch.ones(64, dtype=torch.float16))
    assert out.shape == (0, 64) and out.dtype == torch.float16
    calls = []
    monkeypatch.setattr(ln_module, "layernorm_triton", lambda *a: calls.append("triton"))
    layernorm(torch.randn(2, 8), torch.ones(8))
    monkeypatch.delenv("KERNELAB_INTERPRET")
    torch.testing.assert_close(
        layernorm(torch.ones(2, 8), torch.ones(8), torch.ones(8)), torch.ones(2, 8)
    )
    assert calls == ["triton"]


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"x": torch.randn(2, 8).int()}, TypeError, "x: expected dtype"),
        ({"weight": torch.ones(7)}, ValueError, "weight: expected shape (8,)"),
        ({"bias": torch.ones(9)}, ValueError, "bias: expected shape (8,)"),
        ({"bias": torch.ones(8).int()}, TypeError, "bias: expected dtype"),
        ({"residual": torch.randn(3, 8)}, ValueError, "residual: expected shape (2, 8)"),
        ({"out": torch.empty(2, 8).half()}, TypeError, "out: expected dtype"),
        ({"eps": -1.0}, ValueError, "eps: expected a finite positive float"),
        ({"eps": float("inf")}, ValueError, "eps: expected a finite positive float, got inf"),
        ({"eps": float("nan")}, ValueError, "eps: expected a finite positive float, got nan"),
        ({"eps": True}, TypeError, "eps: expected a float, got bool"),
    ],
)
@pytest.mark.parametrize("fn", [layernorm_triton, layernorm_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**{"x": torch.randn(2, 8), "weight": torch.ones(8), **kwargs})
    assert words in str(info.value)


def test_prefill_launch_compiles_to_wide_accesses_without_spills_for_sm90():
    shape = LAYERNORM.shapes("representative")[-1]  # 4096 x 8192 with bias and residual
    for launch in LAYERNORM.launches(shape, torch.bfloat16):
        assert_wide_and_unspilled(launch)


# --- planted defects ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "config"),
    [
        # the mean not subtracted (one-pass path): E[h²] used as the variance
        (
            "hc = tl.where(mask, hs - (tl.sum(hs, axis=1) / n_cols)[:, None], 0.0)",
            "hc = h",
            None,
        ),
        # the looped mean summed about zero and used as if about the first value
        ("acc += tl.where(mask, h - shift[:, None], 0.0)", "acc += h", LayerNormConfig(1, 128, 1)),
        # the bias subtracted instead of added (one-pass path)
        ("y += tl.load(B + cols", "y -= tl.load(B + cols", None),
        # the looped variance taken about zero instead of the mean
        ("acc += hc * hc", "acc += h * h", LayerNormConfig(1, 128, 1)),
    ],
    ids=[
        "mean-not-subtracted",
        "looped-mean-not-shifted",
        "bias-sign",
        "looped-variance-about-zero",
    ],
)
def test_planted_defects_are_caught(monkeypatch, tmp_path, old, new, config):
    mutant = mutate(ln_module._layernorm_kernel, old, new, tmp_path)
    monkeypatch.setattr(ln_module, "_layernorm_kernel", mutant)
    shape = Shape("t", {"rows": 3, "cols": 300}, {"bias": True, "residual": True})
    inputs = LAYERNORM.inputs(shape, torch.float32, "cpu", seed=5, dist="shifted")
    with pytest.raises(AssertionError, match="rel L2"):
        check(
            LAYERNORM,
            inputs,
            lambda **kw: layernorm_triton(**kw, config=config),
            torch.float32,
        )
