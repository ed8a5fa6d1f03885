"""RMSNorm: the Triton kernel through the interpreter against the float64 reference."""

import importlib
import re

import pytest
import torch

import kernelab
from kernelab.ops import RMSNORM, rmsnorm, rmsnorm_ref
from kernelab.ops.norm.rmsnorm import RMSNormConfig, rmsnorm_torch, rmsnorm_triton
from tests.mutants import mutate
from tests.opcheck import check

rmsnorm_module = importlib.import_module("kernelab.ops.norm.rmsnorm")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
EDGE = RMSNORM.shapes("edge")


def _check(inputs, fn, dtype):
    return check(RMSNORM, inputs, fn, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", EDGE, ids=lambda s: s.label)
def test_kernel_matches_reference_on_edge_shapes(shape, dtype):
    inputs = RMSNORM.inputs(shape, dtype, "cpu", seed=7)
    _check(inputs, rmsnorm_triton, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dist", ["shifted", "heavy", "tiny", "huge"])
def test_kernel_matches_reference_on_hard_distributions(dist, dtype):
    shape = RMSNORM.shapes("representative")[1].reduced(4)  # decode shape, with residual
    _check(RMSNORM.inputs(shape, dtype, "cpu", seed=3, dist=dist), rmsnorm_triton, dtype)


@pytest.mark.parametrize(
    "config", [RMSNormConfig(1, 256, 1), RMSNormConfig(4, 64, 2), RMSNormConfig(2, 128, 4)], ids=str
)
def test_kernel_is_correct_for_tuning_configs_including_the_looped_path(config):
    # 3 rows of 300 columns: looped over blocks of 256/128/64, several rows per program.
    shape = kernelab.ops.Shape("t", {"rows": 3, "cols": 300}, {"residual": True})
    inputs = RMSNORM.inputs(shape, torch.float32, "cpu", seed=1)
    _check(inputs, lambda **kw: rmsnorm_triton(**kw, config=config), torch.float32)


def test_residual_is_updated_in_place_with_the_sum():
    x = torch.randn(4, 33, dtype=torch.float32)
    residual = torch.randn(4, 33, dtype=torch.float32)
    weight = torch.randn(33)
    expected_residual = residual + x
    ptr = residual.data_ptr()
    out = rmsnorm_triton(x, weight, 1e-6, residual=residual)
    assert residual.data_ptr() == ptr
    torch.testing.assert_close(residual, expected_residual, rtol=0, atol=0)
    torch.testing.assert_close(
        out, rmsnorm_ref(expected_residual.double(), weight.double()).float()
    )


def test_three_dimensional_input_and_out_argument():
    x = torch.randn(2, 5, 64)
    weight = torch.randn(64)
    out = torch.empty_like(x)
    result = rmsnorm_triton(x, weight, out=out)
    assert result is out
    torch.testing.assert_close(out, rmsnorm_torch(x, weight))


def test_non_contiguous_residual_is_written_back():
    x = torch.randn(3, 8, 16).transpose(0, 1)  # no 2-D view with unit column stride exists...
    residual = torch.randn(3, 8, 16).transpose(0, 1)
    expected = residual + x
    rmsnorm_triton(x, torch.ones(16), residual=residual)
    torch.testing.assert_close(residual, expected)


def test_public_op_dispatches_to_torch_on_cpu_and_to_triton_when_interpreting(monkeypatch):
    calls = []
    monkeypatch.setattr(rmsnorm_module, "rmsnorm_triton", lambda *a: calls.append("triton"))
    monkeypatch.setattr(rmsnorm_module, "rmsnorm_torch", lambda *a: calls.append("torch"))
    x, w = torch.randn(2, 8), torch.ones(8)
    monkeypatch.delenv("KERNELAB_INTERPRET", raising=False)
    rmsnorm_module.rmsnorm(x, w)
    monkeypatch.setenv("KERNELAB_INTERPRET", "1")
    rmsnorm_module.rmsnorm(x, w)
    assert calls == ["torch", "triton"]


def test_empty_input_returns_empty_output(interpret):
    out = rmsnorm(torch.empty(0, 64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16))
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"x": torch.randn(2, 8).int()}, TypeError, "x: expected dtype"),
        ({"x": [1.0, 2.0]}, TypeError, "x: expected a torch.Tensor"),
        ({"weight": torch.ones(7)}, ValueError, "weight: expected shape (8,)"),
        ({"weight": torch.ones(2, 8)}, ValueError, "weight: expected 1 dimensions"),
        ({"residual": torch.randn(3, 8)}, ValueError, "residual: expected shape (2, 8)"),
        ({"residual": torch.randn(2, 8).half()}, TypeError, "residual: expected dtype"),
        ({"out": torch.empty(2, 9)}, ValueError, "out: expected shape (2, 8)"),
        ({"eps": 0.0}, ValueError, "eps: expected a finite positive float"),
        ({"eps": -1e-6}, ValueError, "eps: expected a finite positive float"),
        ({"eps": float("inf")}, ValueError, "eps: expected a finite positive float, got inf"),
        ({"eps": float("nan")}, ValueError, "eps: expected a finite positive float, got nan"),
        ({"eps": "1e-6"}, TypeError, "eps: expected a float, got str"),
        ({"eps": True}, TypeError, "eps: expected a float, got bool"),
        ({"eps": torch.tensor(1e-6)}, TypeError, "eps: expected a float, got Tensor"),
    ],
)
@pytest.mark.parametrize("fn", [rmsnorm_triton, rmsnorm_torch], ids=["triton", "torch"])
def test_bad_arguments_raise_naming_the_argument(fn, kwargs, exc, words):
    args = {"x": torch.randn(2, 8), "weight": torch.ones(8), **kwargs}
    with pytest.raises(exc) as info:
        fn(**args)
    assert words in str(info.value)


# --- planted defects: the comparison must catch them ------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "count"),
    [
        # mask off by one: the last column is never written (stays as allocated) or read
        (
            "mask = row_ok[:, None] & (cols[None, :] < n_cols)",
            "mask = row_ok[:, None] & (cols[None, :] < n_cols - 1)",
            1,
        ),
        # the mean taken over the block width instead of the row length
        ("tl.sum(hc * hc, axis=1) / n_cols", "tl.sum(hc * hc, axis=1) / BLOCK_N", 1),
        # the residual's sum not used for the output
        (
            "            h = s.to(tl.float32)\n        if IS_RMS:",
            "            h = h\n        if IS_RMS:",
            1,
        ),
    ],
    ids=["mask-off-by-one", "mean-over-block", "residual-not-normalised"],
)
def test_planted_defects_are_caught(monkeypatch, tmp_path, old, new, count):
    mutant = mutate(rmsnorm_module._rmsnorm_kernel, old, new, tmp_path, count)
    monkeypatch.setattr(rmsnorm_module, "_rmsnorm_kernel", mutant)
    shape = kernelab.ops.Shape("t", {"rows": 3, "cols": 1021}, {"residual": True})
    inputs = RMSNORM.inputs(shape, torch.float32, "cpu", seed=5)
    with pytest.raises(AssertionError, match=r"rel L2|NaN"):  # NaN: the poisoned out= unwritten
        _check(inputs, rmsnorm_triton, torch.float32)


def test_offsets_are_computed_in_64_bits(tmp_path):
    """Row offsets are int64 so tensors beyond 2**31 elements index correctly (static check)."""
    import triton
    from triton.backends.compiler import GPUTarget

    launch = RMSNORM.launches(RMSNORM.shapes("representative")[-1], torch.bfloat16)[0]
    sig = dict(launch.signature)
    src = triton.compiler.ASTSource(
        fn=launch.kernel, signature=sig, constexprs=dict(launch.constexprs)
    )
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": launch.num_warps}
    )
    ttir = compiled.asm["ttir"]
    assert re.search(r"arith\.muli [^\n]*: (tensor<[^>]*xi64>|i64)", ttir), "no 64-bit offsets"
    assert "ld.global" in compiled.asm["ptx"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_of_262144_columns_loop_correctly(dtype):
    shape = kernelab.ops.Shape("wide", {"rows": 2, "cols": 262144}, {"residual": True})
    _check(RMSNORM.inputs(shape, dtype, "cpu", seed=11), rmsnorm_triton, dtype)
