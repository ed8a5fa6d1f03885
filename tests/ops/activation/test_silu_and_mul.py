"""SwiGLU: the Triton kernel through the interpreter against the float64 reference, and what
the gated-activation family shares (launch heuristic, argument checks, write-back)."""

import importlib

import pytest
import torch

from kernelab.ops import Shape, get
from kernelab.ops.activation._common import ActConfig
from kernelab.ops.activation.silu_and_mul import (
    silu_and_mul,
    silu_and_mul_torch,
    silu_and_mul_triton,
)
from tests.mutants import mutate
from tests.opcheck import assert_wide_and_unspilled, check

silu_module = importlib.import_module("kernelab.ops.activation.silu_and_mul")
SILU = get("silu_and_mul")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: The edge shapes; the interpreter runs at most 64 rows of each.
EDGE = [s.reduced(64) for s in SILU.shapes("edge")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", EDGE, ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    check(SILU, SILU.inputs(shape, dtype, "cpu", seed=11), silu_and_mul_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_reference_on_a_reduced_representative_shape(dtype):
    # The widest model shape (llama3-70b, 2 x 28672 per row), 2 rows.
    for shape in [s for s in SILU.shapes("representative") if s.dims["d"] == 28672][:2]:
        check(SILU, SILU.inputs(shape.reduced(2), dtype, "cpu", seed=2), silu_and_mul_triton, dtype)


@pytest.mark.parametrize("dist", ["shifted", "heavy", "tiny", "huge"])
def test_kernel_matches_reference_on_hard_distributions(dist):
    shape = Shape("t", {"rows": 3, "d": 300})
    inputs = SILU.inputs(shape, torch.bfloat16, "cpu", seed=4, dist=dist)
    check(SILU, inputs, silu_and_mul_triton, torch.bfloat16)


def test_activation_saturates_without_nan_at_extreme_gates():
    x = torch.tensor([[-1e4, -80.0, 80.0, 1e4, 2.0, 2.0, 2.0, 2.0]])
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_torch(x), rtol=1e-6, atol=1e-30)


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


def test_three_dimensional_input_and_out_argument(interpret):
    x = torch.randn(2, 3, 40)
    out = torch.empty(2, 3, 20)
    assert silu_and_mul(x, out=out) is out
    torch.testing.assert_close(out, silu_and_mul_torch(x))


def test_public_op_dispatches_to_torch_on_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(silu_module, "silu_and_mul_triton", lambda *a: calls.append("triton"))
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


#: Bad arguments of every gated activation (tests/ops/activation/test_gelu_and_mul.py too).
BAD = [
    ({"x": torch.randn(2, 8).int()}, TypeError, "x: expected dtype"),
    ({"x": torch.randn(2, 7)}, ValueError, "x: expected an even last dimension"),
    ({"x": 3.0}, TypeError, "x: expected a torch.Tensor"),
    ({"out": torch.empty(2, 8)}, ValueError, "out: expected shape (2, 4)"),
    ({"out": torch.empty(2, 4).half()}, TypeError, "out: expected dtype"),
]


@pytest.mark.parametrize(
    ("fn", "kwargs", "exc", "words"),
    [(fn, *case) for fn in (silu_and_mul_triton, silu_and_mul_torch) for case in BAD],
)
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    with pytest.raises(exc) as info:
        fn(**{"x": torch.randn(2, 8), **kwargs})
    assert words in str(info.value)


def test_prefill_launch_compiles_to_wide_accesses_without_spills_for_sm90():
    shape = SILU.shapes("representative")[-1]  # the widest rows at prefill
    for launch in SILU.launches(shape, torch.bfloat16):
        assert_wide_and_unspilled(launch)


# --- planted defects ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # gate and up swapped: act(up) * gate
        ("x_up = x_gate + d", "x_up = x_gate\n    x_gate = x_gate + d"),
        # the column mask off by one: the last output column is never written
        ("(cols < d)[None, :]", "(cols < d - 1)[None, :]"),
    ],
    ids=["gate-up-swap", "mask-off-by-one"],
)
def test_planted_defects_are_caught(monkeypatch, tmp_path, old, new):
    mutant = mutate(silu_module._act_and_mul_kernel, old, new, tmp_path)
    monkeypatch.setattr(silu_module, "_act_and_mul_kernel", mutant)
    inputs = SILU.inputs(Shape("t", {"rows": 3, "d": 301}), torch.float32, "cpu", seed=5)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):
        check(SILU, inputs, silu_and_mul_triton, torch.float32)


def test_an_unwritten_column_is_caught_on_every_repeat(monkeypatch, tmp_path):
    """The column-mask mutant left its last column to the allocator, which handed back a freed
    copy of the right answer in 23 of 200 repeats; ``check`` passes a NaN-filled ``out=``."""
    mutant = mutate(silu_module._act_and_mul_kernel, "(cols < d)[None, :]",
                    "(cols < d - 1)[None, :]", tmp_path)  # fmt: skip
    monkeypatch.setattr(silu_module, "_act_and_mul_kernel", mutant)
    shape = Shape("t", {"rows": 3, "d": 301})
    for _ in range(25):
        inputs = SILU.inputs(shape, torch.float32, "cpu", seed=5)
        with pytest.raises(AssertionError, match="NaN"):
            check(SILU, inputs, silu_and_mul_triton, torch.float32)
