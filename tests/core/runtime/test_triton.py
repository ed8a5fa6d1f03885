"""``kernelab.kernel`` (``@kernel``): one JITFunction, compiled for GPUs, interpreted on CPU."""

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

import kernelab
from kernelab.core.runtime.triton import Kernel
from tests.core.runtime.fresh import run_python


@kernelab.kernel
def _scale(Z, X, n, factor, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    tl.store(Z + i, tl.load(X + i, mask=mask) * factor, mask=mask)


@kernelab.kernel(do_not_specialize=["n"])
def _scale_any_n(Z, X, n, factor, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    tl.store(Z + i, tl.load(X + i, mask=mask) * factor, mask=mask)


def test_import_kernelab_loads_neither_torch_nor_triton():
    code = (
        "import sys, kernelab\n"
        "assert 'kernel' in kernelab.__all__\n"
        "assert not {'torch', 'triton'} & set(sys.modules), sorted(sys.modules)\n"
        "k = kernelab.kernel\n"
        "assert 'triton' in sys.modules and k.__module__ == 'kernelab.core.runtime.triton'\n"
        "assert 'triton.runtime.interpreter' not in sys.modules\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr


def test_the_public_decorator_is_a_jitfunction_that_runs_on_cpu():
    assert isinstance(_scale, Kernel) and isinstance(_scale, JITFunction)
    assert list(_scale_any_n.do_not_specialize) == ["n"]  # options reach JITFunction
    x = torch.randn(1000)
    for fn in (_scale, _scale_any_n):
        z = torch.empty_like(x)
        fn[(triton.cdiv(1000, 256),)](z, x, 1000, 0.5, BLOCK=256)
        assert torch.equal(z, x * 0.5)


def test_the_same_object_compiles_for_a_gpu_target():
    sig = {"Z": "*fp32", "X": "*fp32", "n": "i32", "factor": "fp32", "BLOCK": "constexpr"}
    compiled = triton.compile(
        ASTSource(_scale, sig, {"BLOCK": 256}), target=GPUTarget("cuda", 90, 32)
    )
    assert ".visible .entry _scale" in compiled.asm["ptx"]


def test_heuristics_and_a_single_config_autotune_reach_the_interpreter():
    """Triton's wrappers launch through ``run``: a wrapped @kernel still runs on the CPU."""
    wrapped = triton.heuristics({"BLOCK": lambda args: 128})(
        triton.autotune([triton.Config({}, num_warps=4)], key=["n"])(_scale)
    )
    x = torch.randn(300)
    z = torch.empty_like(x)
    wrapped[lambda meta: (triton.cdiv(300, meta["BLOCK"]),)](z, x, 300, 2.0)
    assert torch.equal(z, x * 2.0)
