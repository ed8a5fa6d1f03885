"""The GEMMs of ``kernelab.models`` as torch custom ops (no transformers needed)."""

import importlib

import pytest
import torch

from kernelab.models import _library
from kernelab.ops import packing as _packing

_fp8 = importlib.import_module("kernelab.ops.matmul.fp8_gemm")


def _lib() -> dict:
    """The generated custom ops; GEMM arguments in their public functions' order."""
    names = ("gemm", "w8a16_gemm", "w4a16_gemm", "fp8_gemm")
    return {n: _library.custom_op(n) for n in names}


def _inputs():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(24, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(24, generator=gen).to(torch.bfloat16)
    return x, w, bias


def test_gemm_custom_ops_pass_torch_opcheck():
    lib = _lib()
    x, w, bias = _inputs()
    torch.library.opcheck(lib["gemm"], (x, w, bias, None, "none", "nk"))
    torch.library.opcheck(lib["gemm"], (x, w, None, None, "silu", "nk"))
    q8, s8 = _packing.quantize_int8(w.t())
    torch.library.opcheck(lib["w8a16_gemm"], (x, q8, s8, bias))
    w4 = _packing.quantize_int4(w.t(), group_size=64)
    torch.library.opcheck(lib["w4a16_gemm"], (x, w4.qweight, w4.scales, w4.zeros, 64, None))
    fp8 = _fp8
    a8, sa = fp8.quantize_fp8(x)
    b8, sb = fp8.quantize_fp8(w)
    # test_schema compares inputs with arithmetic that CPU float8 tensors do not support
    fp8_tests = ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(lib["fp8_gemm"], (a8, b8, sa, sb, bias, "nk"), test_utils=fp8_tests)
    # the fake kernels give the real output's shape and dtype
    for op, args in (
        ("gemm", (x, w, bias, None, "none", "nk")),
        ("w4a16_gemm", (x, w4.qweight, w4.scales, w4.zeros, 64, None)),
        ("fp8_gemm", (a8, b8, sa, sb, None, "nk")),
    ):
        real = lib[op](*args)
        with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
            fake = lib[op](*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                             for a in args))  # fmt: skip
        assert (fake.shape, fake.dtype) == (real.shape, real.dtype) == ((3, 24), torch.bfloat16)


def test_gemm_custom_ops_compile_as_single_nodes():
    lib = _lib()
    x, w, bias = _inputs()
    w4 = _packing.quantize_int4(w.t(), group_size=64)
    q8, s8 = _packing.quantize_int8(w.t())

    def three(x):
        y = lib["w8a16_gemm"](x, q8, s8, None) + lib["gemm"](x, w, bias, None, "none", "nk")
        return y + lib["w4a16_gemm"](x, w4.qweight, w4.scales, w4.zeros, 64, None)

    explained = torch._dynamo.explain(three)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    targets = [n.target for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.ops.kernelab.w8a16_gemm.default in targets
    assert torch.ops.kernelab.gemm.default in targets
    assert torch.ops.kernelab.w4a16_gemm.default in targets
    compiled = torch.compile(three, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), three(x))


@pytest.mark.parametrize("quantize", [None, "w8a16", "w4a16", "fp8"])
def test_a_prepared_linear_matches_its_reference_through_the_interpreter(quantize, interpret):
    from kernelab.models import _linear, _parity
    from kernelab.numerics import error

    x, w, bias = _inputs()
    k = 128  # int4 groups of 128
    w = torch.cat([w, w.flip(1)], dim=1)
    prepared = _linear.prepare(w, bias, quantize, "proj")
    x3 = torch.cat([x, x.roll(1, 1)], dim=1).reshape(1, 3, k)
    got = prepared(x3)
    assert got.shape == (1, 3, 24) and got.dtype == torch.bfloat16
    want = prepared.reference(x3)
    assert error(got, want).rel_l2 <= _parity.tolerance(torch.bfloat16, quantize) / 4
    if quantize == "w4a16":
        assert prepared.tensors["group_size"] == 128
