"""SwiGLU / GeGLU: the Triton kernel through the interpreter against the float64 reference."""

import importlib

import pytest
import torch

from kernelab.ops import Shape, get
from kernelab.ops.activation._common import (
    ActConfig,
    gelu_and_mul,
    gelu_and_mul_torch,
    gelu_and_mul_triton,
    silu_and_mul,
    silu_and_mul_torch,
    silu_and_mul_triton,
)
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check

act_module = importlib.import_module("kernelab.ops.activation._common")
SILU, GELU = get("silu_and_mul"), get("gelu_and_mul")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TRITON = {"silu_and_mul": silu_and_mul_triton, "gelu_and_mul": gelu_and_mul_triton}


def _cases(shape_set):
    # Edge shapes of both ops; the interpreter runs at most 64 rows of each.
    return [(op, s.reduced(64)) for op in (SILU, GELU) for s in op.shapes(shape_set)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("op", "shape"), _cases("edge"), ids=lambda v: getattr(v, "label", getattr(v, "name", v))
)
def test_kernel_matches_reference_on_edge_shapes(op, shape, dtype):
    check(op, op.inputs(shape, dtype, "cpu", seed=11), TRITON[op.name], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", [SILU, GELU], ids=lambda o: o.name)
def test_kernel_matches_reference_on_a_reduced_representative_shape(op, dtype):
    # The widest model shape (llama3-70b, 2 x 28672 per row), 2 rows, both GELU forms.
    for shape in [s for s in op.shapes("representative") if s.dims["d"] == 28672][:2]:
        check(op, op.inputs(shape.reduced(2), dtype, "cpu", seed=2), TRITON[op.name], dtype)


@pytest.mark.parametrize("dist", ["shifted", "heavy", "tiny", "huge"])
@pytest.mark.parametrize("op", [SILU, GELU], ids=lambda o: o.name)
def test_kernel_matches_reference_on_hard_distributions(op, dist):
    shape = Shape("t", {"rows": 3, "d": 300}, {"approximate": "tanh"} if op is GELU else {})
    inputs = op.inputs(shape, torch.bfloat16, "cpu", seed=4, dist=dist)
    check(op, inputs, TRITON[op.name], torch.bfloat16)


def test_activations_saturate_without_nan_at_extreme_gates():
    x = torch.tensor([[-1e4, -80.0, 80.0, 1e4, 2.0, 2.0, 2.0, 2.0]])
    for fn, ref in [
        (silu_and_mul_triton, silu_and_mul_torch),
        (lambda t: gelu_and_mul_triton(t, "tanh"), lambda t: gelu_and_mul_torch(t, "tanh")),
        (gelu_and_mul_triton, gelu_and_mul_torch),
    ]:
        torch.testing.assert_close(fn(x), ref(x), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("config", [ActConfig(1, 256, 1), ActConfig(4, 64, 2)], ids=str)
def test_tuning_configs_are_correct_across_column_blocks(config):
    inputs = SILU.inputs(Shape("t", {"rows": 5, "d": 300}), torch.float32, "cpu", seed=1)
    check(SILU, inputs, lambda **kw: silu_and_mul_triton(**kw, config=config), torch.float32)


def test_decode_default_fills_the_gpu_and_prefill_uses_full_tiles():
    decode = ActConfig.default_for(1, 14336)
    assert 14336 // decode.block_n >= 2 * 132 or decode.block_n * decode.block_m == 256
    prefill = ActConfig.default_for(4096, 14336)
    assert prefill.block_m * prefill.block_n == 2048 and prefill.num_warps == 8
    assert all(c.block_m * c.block_n >= 4 * 32 * c.num_warps for c in ActConfig.tuning_space(100))


def test_three_dimensional_input_out_argument_and_public_dispatch(interpret):
    x = torch.randn(2, 3, 40)
    out = torch.empty(2, 3, 20)
    assert silu_and_mul(x, out=out) is out
    torch.testing.assert_close(out, silu_and_mul_torch(x))
    torch.testing.assert_close(gelu_and_mul(x, "tanh"), gelu_and_mul_torch(x, "tanh"))


def test_public_op_dispatches_to_torch_on_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(act_module, "silu_and_mul_triton", lambda *a: calls.append("triton"))
    monkeypatch.delenv("KERNELAB_INTERPRET", raising=False)
    silu_and_mul(torch.randn(2, 8))
    assert calls == []
    monkeypatch.setenv("KERNELAB_INTERPRET", "1")
    silu_and_mul(torch.randn(2, 8))
    assert calls == ["triton"]


def test_non_contiguous_output_is_written_back():
    x = torch.randn(6, 32)
    out = torch.empty(16, 6).t()  # no unit column stride
    silu_and_mul_triton(x, out=out)
    torch.testing.assert_close(out, silu_and_mul_torch(x))


BAD = [
    ({"x": torch.randn(2, 8).int()}, TypeError, "x: expected dtype"),
    ({"x": torch.randn(2, 7)}, ValueError, "x: expected an even last dimension"),
    ({"x": 3.0}, TypeError, "x: expected a torch.Tensor"),
    ({"out": torch.empty(2, 8)}, ValueError, "out: expected shape (2, 4)"),
    ({"out": torch.empty(2, 4).half()}, TypeError, "out: expected dtype"),
]
BAD_GELU = [({"approximate": "fast"}, ValueError, "approximate: expected 'none' or 'tanh'")]


@pytest.mark.parametrize(
    ("fn", "kwargs", "exc", "words"),
    [
        (fn, *case)
        for fn in (silu_and_mul_triton, silu_and_mul_torch, gelu_and_mul_triton)
        for case in BAD + (BAD_GELU if fn is gelu_and_mul_triton else [])
    ]
    + [(gelu_and_mul_torch, *case) for case in BAD_GELU],
)
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**{"x": torch.randn(2, 8), **kwargs})
    assert words in str(info.value)


@pytest.mark.parametrize("op", [SILU, GELU], ids=lambda o: o.name)
def test_prefill_launch_compiles_to_wide_accesses_without_spills_for_sm90(op):
    shape = op.shapes("representative")[-1]  # the widest rows at prefill
    for launch in op.launches(shape, torch.bfloat16):
        assert_wide_and_unspilled(launch)


# --- planted defects ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "old", "new"),
    [
        # gate and up swapped: act(up) * gate
        (SILU, "x_up = x_gate + d", "x_up = x_gate\n    x_gate = x_gate + d"),
        # the erf form evaluated with the tanh form's formula
        (GELU, "elif ACT == 1:", "elif ACT >= 1:"),
        # the column mask off by one: the last output column is never written
        (SILU, "(cols < d)[None, :]", "(cols < d - 1)[None, :]"),
    ],
    ids=["gate-up-swap", "gelu-form-mixed", "mask-off-by-one"],
)
def test_planted_defects_are_caught(monkeypatch, tmp_path, op, old, new):
    mutant = mutate(act_module._act_and_mul_kernel, old, new, tmp_path)
    monkeypatch.setattr(act_module, "_act_and_mul_kernel", mutant)
    params = {"approximate": "none"} if op is GELU else {}
    inputs = op.inputs(Shape("t", {"rows": 3, "d": 301}, params), torch.float32, "cpu", seed=5)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        check(op, inputs, TRITON[op.name], torch.float32)
