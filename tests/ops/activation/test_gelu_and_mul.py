"""GeGLU (erf and tanh forms): the Triton kernel through the interpreter against the float64
reference (what the family shares: tests/ops/activation/test_silu_and_mul.py)."""

import importlib

import pytest
import torch

from kernelab.ops import Shape, get
from kernelab.ops.activation.gelu_and_mul import (
    gelu_and_mul,
    gelu_and_mul_torch,
    gelu_and_mul_triton,
)
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check
from tests.ops.activation.test_silu_and_mul import BAD

gelu_module = importlib.import_module("kernelab.ops.activation.gelu_and_mul")
GELU = get("gelu_and_mul")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: The edge shapes; the interpreter runs at most 64 rows of each.
EDGE = [s.reduced(64) for s in GELU.shapes("edge")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", EDGE, ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    check(GELU, GELU.inputs(shape, dtype, "cpu", seed=11), gelu_and_mul_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_reference_on_a_reduced_representative_shape(dtype):
    # The widest model shape (llama3-70b, 2 x 28672 per row), 2 rows, both GELU forms.
    for shape in [s for s in GELU.shapes("representative") if s.dims["d"] == 28672][:2]:
        check(GELU, GELU.inputs(shape.reduced(2), dtype, "cpu", seed=2), gelu_and_mul_triton, dtype)


@pytest.mark.parametrize("dist", ["shifted", "heavy", "tiny", "huge"])
def test_kernel_matches_reference_on_hard_distributions(dist):
    shape = Shape("t", {"rows": 3, "d": 300}, {"approximate": "tanh"})
    inputs = GELU.inputs(shape, torch.bfloat16, "cpu", seed=4, dist=dist)
    check(GELU, inputs, gelu_and_mul_triton, torch.bfloat16)


def test_activations_saturate_without_nan_at_extreme_gates():
    x = torch.tensor([[-1e4, -80.0, 80.0, 1e4, 2.0, 2.0, 2.0, 2.0]])
    for fn, ref in [
        (lambda t: gelu_and_mul_triton(t, "tanh"), lambda t: gelu_and_mul_torch(t, "tanh")),
        (gelu_and_mul_triton, gelu_and_mul_torch),
    ]:
        torch.testing.assert_close(fn(x), ref(x), rtol=1e-6, atol=1e-30)


def test_three_dimensional_input_and_public_dispatch(interpret):
    x = torch.randn(2, 3, 40)
    torch.testing.assert_close(gelu_and_mul(x, "tanh"), gelu_and_mul_torch(x, "tanh"))


BAD_GELU = [({"approximate": "fast"}, ValueError, "approximate: expected 'none' or 'tanh'")]


@pytest.mark.parametrize(
    ("fn", "kwargs", "exc", "words"),
    [(gelu_and_mul_triton, *case) for case in BAD + BAD_GELU]
    + [(gelu_and_mul_torch, *case) for case in BAD_GELU],
)
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**{"x": torch.randn(2, 8), **kwargs})
    assert words in str(info.value)


def test_prefill_launch_compiles_to_wide_accesses_without_spills_for_sm90():
    shape = GELU.shapes("representative")[-1]  # the widest rows at prefill
    for launch in GELU.launches(shape, torch.bfloat16):
        assert_wide_and_unspilled(launch)


# --- planted defects ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # the erf form evaluated with the tanh form's formula
        ("elif ACT == 1:", "elif ACT >= 1:"),
    ],
    ids=["gelu-form-mixed"],
)
def test_planted_defects_are_caught(monkeypatch, tmp_path, old, new):
    mutant = mutate(gelu_module._act_and_mul_kernel, old, new, tmp_path)
    monkeypatch.setattr(gelu_module, "_act_and_mul_kernel", mutant)
    shape = Shape("t", {"rows": 3, "d": 301}, {"approximate": "none"})
    inputs = GELU.inputs(shape, torch.float32, "cpu", seed=5)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        check(GELU, inputs, gelu_and_mul_triton, torch.float32)
