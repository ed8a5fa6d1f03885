"""kernelab's interpreter: the table of fixes (each still needed, or not applied), bfloat16
arithmetic as a GPU does it, laziness, and users' plain @triton.jit kernels on the CPU."""

import gc
import threading
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from kernelab.core.runtime import interpreter
from kernelab.core.runtime.interpreter import FIXES, InterpreterFixError, interpreting_user_kernels
from kernelab.core.runtime.triton import kernel
from tests.core.runtime.fresh import SRC, run_python

VERSION = triton.__version__
BF16 = torch.bfloat16


def bf16(*values):
    return torch.tensor(values, dtype=BF16)


def run(fn, grid, *args, without=None, **kwargs):
    """Launch through kernelab's interpreter with every fix that applies here, except
    ``without``."""
    names = {f.name for f in interpreter.active_fixes()} - {without}
    with np.errstate(all="ignore"):  # NaN, Inf and raw bits are intended
        interpreter.launch(fn, grid, args, kwargs, fixes=names)


# --- kernels -------------------------------------------------------------------------------------


@triton.jit
def _add(Z, X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Z + i, tl.load(X + i) + tl.load(Y + i))


_add_kernel = kernel(_add.fn)


@triton.jit
def _cast(Z, X, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Z + i, tl.load(X + i).to(Z.dtype.element_ty))


@triton.jit
def _dot(C, A, B, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(A + r[:, None] * N + r[None, :])
    b = tl.load(B + r[:, None] * N + r[None, :])
    tl.store(C + r[:, None] * N + r[None, :], tl.dot(a, b))


@triton.jit
def _elementwise(Z, X, Y, W, OP: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(X + i)
    y = tl.load(Y + i)
    w = tl.load(W + i)
    if OP == "add":
        r = x + y
    elif OP == "sub":
        r = x - y
    elif OP == "mul":
        r = x * y
    elif OP == "div":
        r = x / y
    elif OP == "mod":
        r = x % y
    elif OP == "neg":
        r = -x
    elif OP == "abs":
        r = tl.abs(x)
    elif OP == "scalar":
        r = x * 2.5 - 0.375
    elif OP == "minimum":
        r = tl.minimum(x, y)
    elif OP == "maximum":
        r = tl.maximum(x, y)
    elif OP == "minimum_nan":
        r = tl.minimum(x, y, propagate_nan=tl.PropagateNan.ALL)
    elif OP == "maximum_nan":
        r = tl.maximum(x, y, propagate_nan=tl.PropagateNan.ALL)
    elif OP == "clamp":
        r = tl.clamp(x, -0.5, 0.75)
    elif OP == "where":
        r = tl.where(x < y, x, y)
    elif OP == "fma":
        r = tl.fma(x, y, w)
    elif OP == "exp":
        r = tl.exp(x.to(tl.float32))
    elif OP == "log":
        r = tl.log(tl.abs(x).to(tl.float32))
    elif OP == "sqrt":
        r = tl.sqrt(tl.abs(x).to(tl.float32))
    elif OP == "rsqrt":
        r = tl.rsqrt(tl.abs(x).to(tl.float32))
    elif OP == "sin":
        r = tl.sin(x.to(tl.float32))
    elif OP == "cos":
        r = tl.cos(x.to(tl.float32))
    elif OP == "erf":
        r = tl.math.erf(x.to(tl.float32))
    elif OP == "sigmoid":
        r = tl.sigmoid(x.to(tl.float32))
    elif OP == "lt":
        r = x < y
    elif OP == "le":
        r = x <= y
    elif OP == "gt":
        r = x > y
    elif OP == "ge":
        r = x >= y
    elif OP == "eq":
        r = x == y
    else:
        r = x != y
    tl.store(Z + i, r.to(Z.dtype.element_ty))


@triton.jit
def _reduce(Z, I, X, OP: tl.constexpr, ROWS: tl.constexpr, N: tl.constexpr):
    r = tl.arange(0, ROWS)
    c = tl.arange(0, N)
    x = tl.load(X + r[:, None] * N + c[None, :])
    if OP == "sum":
        tl.store(Z + r, tl.sum(x, 1))
    elif OP == "max":
        tl.store(Z + r, tl.max(x, 1))
    elif OP == "min":
        tl.store(Z + r, tl.min(x, 1))
    elif OP == "argmax":
        tl.store(I + r, tl.argmax(x, 1))
    elif OP == "argmin":
        tl.store(I + r, tl.argmin(x, 1))
    elif OP == "max_with_index":
        v, j = tl.max(x, 1, return_indices=True)
        tl.store(Z + r, v)
        tl.store(I + r, j)
    elif OP == "cumsum":
        tl.store(Z + r[:, None] * N + c[None, :], tl.cumsum(x, 1))
    elif OP == "cumprod":
        tl.store(Z + r[:, None] * N + c[None, :], tl.cumprod(x, 1))
    else:  # a reduction with a combine function of its own (the interpreter's slow path)
        tl.store(Z + r, tl.reduce(x, 1, _add_combine))


@triton.jit
def _add_combine(a, b):
    return a + b


@triton.jit
def _atomic(Z, OLD, X, IDX, N: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    x = tl.load(X + i)
    j = tl.load(IDX + i)
    old = tl.atomic_add(Z + j, x)
    tl.store(OLD + i, old)


# the same functions as @kernel (kernelab's decorator) and as plain @triton.jit
_elementwise_kernel = kernel(_elementwise.fn)
_reduce_kernel = kernel(_reduce.fn)
_atomic_kernel = kernel(_atomic.fn)


@triton.jit
def _runtime_range(Z, n, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(0, n, BLOCK):
        acc += 1.0
    tl.store(Z + tl.arange(0, BLOCK), acc)


# --- the table: every fix is still needed where it is applied, and only there ------------------


def _wrong(got, expected) -> bool:
    return not torch.equal(got.view(torch.uint8), expected.view(torch.uint8))


def _demo_float_narrowing(without):
    xs = torch.tensor([1 + 2**-8 + 2**-12, -(1 + 2**-8 + 2**-12), 3.1416, 125.6])
    z = torch.empty(4, dtype=BF16)
    run(_cast, (1,), z, xs, N=4, without=without)
    e4m3 = torch.empty(4, dtype=torch.float8_e4m3fn)
    run(_cast, (1,), e4m3, xs, N=4, without=without)
    return _wrong(z, xs.to(BF16)) or _wrong(e4m3, xs.to(torch.float8_e4m3fn))


def _demo_narrow_float_casts(without):
    ints = torch.tensor([3, -7, 1000, 65], dtype=torch.int32)
    z = torch.empty(4, dtype=BF16)
    run(_cast, (1,), z, ints, N=4, without=without)
    doubles = torch.tensor([1 + 2**-8 + 2**-12, -2.5, 1e30, 0.1], dtype=torch.float64)
    w = torch.empty(4, dtype=BF16)
    run(_cast, (1,), w, doubles, N=4, without=without)
    return _wrong(z, ints.to(BF16)) or _wrong(w, doubles.to(BF16))


def _demo_dot_operands(without):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=g).to(BF16) for _ in range(2))
    c = torch.empty(16, 16)
    run(_dot, (1,), c, a, b, N=16, without=without)
    return not torch.allclose(c, a.float() @ b.float(), rtol=1e-5, atol=1e-5)


def _demo_bf16_elementwise(without):
    z = torch.empty(4, dtype=BF16)
    run(_add, (1,), z, bf16(1.0, -3.0, 0.5, 2.0), bf16(0.25, 1.0, -0.5, 1.0), N=4, without=without)
    return _wrong(z, bf16(1.25, -2.0, 0.0, 3.0))


def _demo_bf16_constants(without):
    x, y, w = bf16(1.0, -3.0, 0.5, 2.0), bf16(1, 1, 1, 1), bf16(1, 1, 1, 1)
    z = torch.empty(4, dtype=BF16)
    try:
        run(_elementwise, (1,), z, x, y, w, OP="scalar", N=4, without=without)
    except Exception as exc:  # Triton 3.6 to 3.8: 'InterpreterBuilder' ... no attribute 'get_bf16'
        return "get_bf16" in str(exc)
    return _wrong(z, x * 2.5 - 0.375)


def _demo_nan_ignoring_min_max(without):
    x, y = (
        torch.tensor([float("nan"), 1.0, 2.0, -1.0]),
        torch.tensor([1.0, float("nan"), 3.0, -2.0]),
    )
    z = torch.empty(4)
    run(_elementwise, (1,), z, x, y, y, OP="minimum", N=4, without=without)
    return _wrong(z, torch.fmin(x, y))


def _demo_bf16_reductions(without):
    x = bf16(1.0, -3.0, 0.5, 2.0).reshape(1, 4)
    z, idx = torch.empty(1, dtype=BF16), torch.empty(1, dtype=torch.int32)
    run(_reduce, (1,), z, idx, x, OP="sum", ROWS=1, N=4, without=without)
    return _wrong(z, bf16(0.5))


def _demo_bf16_atomics(without):
    z, old = torch.zeros(1, dtype=BF16), torch.empty(4, dtype=BF16)
    idx = torch.zeros(4, dtype=torch.int32)
    try:
        run(_atomic, (1,), z, old, bf16(1.0, -3.0, 0.5, 2.0), idx, N=4, without=without)
    except Exception as exc:  # Triton's: InterpreterError(ValueError('Unsupported data type'))
        return "Unsupported data type" in str(exc)
    return _wrong(z, bf16(0.5))


def _demo_scalar_index(without):
    z = torch.zeros(4)
    try:
        run(_runtime_range, (1,), z, 10, BLOCK=4, without=without)
    except Exception as exc:  # Triton 3.6: only 0-dimensional arrays can be converted...
        return "0-dimensional" in str(exc)
    return not torch.equal(z, torch.full((4,), 3.0))


def _demo_amd_fp8_dtypes(without):
    z = torch.empty(4, dtype=torch.float8_e4m3fnuz)
    x = torch.tensor([1.0, -2.0, 0.5, 3.0])
    try:
        run(_cast, (1,), z, x, N=4, without=without)
    except Exception as exc:  # Triton 3.6 and 3.7: fail to convert fp8e4b8 to ir type
        return "fp8e4b8" in str(exc)
    return _wrong(z, x.to(torch.float8_e4m3fnuz))


@triton.jit
def _dot_scaled_bf16(C, A, B, S, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(A + r[:, None] * 2 * N + tl.arange(0, 2 * N)[None, :])
    b = tl.load(B + r[:, None] * N + r[None, :])  # [N, K/2]: K = 2N e2m1 values per row
    s = tl.load(S + r[:, None] * (2 * N // 32) + tl.arange(0, 2 * N // 32)[None, :])
    c = tl.dot_scaled(a, None, "bf16", b.T, s, "e2m1")
    tl.store(C + r[:, None] * N + r[None, :], c)


def _demo_dot_scaled_bf16(without):
    if not hasattr(interpreter_module(), "_mxfp_value_handle_to_float32"):
        pytest.skip(f"Triton {VERSION}'s interpreter has no tl.dot_scaled")
    n = 16
    a = torch.full((n, 2 * n), 1e6).to(BF16)
    a[:, ::2] = 2.0**-30  # below float16's smallest subnormal
    b = torch.full((n, n), 0x22, dtype=torch.uint8)  # e2m1 code 2 (1.0) in both nibbles
    s = torch.full((n, 1), 127, dtype=torch.uint8)  # 2^0
    c = torch.empty(n, n)
    run(_dot_scaled_bf16, (1,), c, a, b, s, N=n, without=without)
    return not torch.equal(c, a.float().sum(dim=1, keepdim=True).expand(n, n))


@triton.jit
def _dot_scaled_e4m3_scales(C, A, B, S, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(A + r[:, None] * 2 * N + tl.arange(0, 2 * N)[None, :])
    b = tl.load(B + r[:, None] * N + r[None, :])  # [N, K/2]: K = 2N e2m1 values per row
    s = tl.load(S + r[:, None] * (2 * N // 16) + tl.arange(0, 2 * N // 16)[None, :])
    c = tl.dot_scaled(a, None, "bf16", b.T, s, "e2m1")
    tl.store(C + r[:, None] * N + r[None, :], c)


def _demo_dot_scaled_e4m3_scales(without):
    if not hasattr(interpreter_module(), "_dot_scaled_scale_to_f32"):
        pytest.skip(f"Triton {VERSION}'s interpreter has no tl.dot_scaled scale decoding")
    n = 16
    a = torch.ones(n, 2 * n, dtype=BF16)
    b = torch.full((n, n), 0x22, dtype=torch.uint8)  # e2m1 code 2 (1.0) in both nibbles
    # two 16-value blocks per row with e4m3 scales 1.0 and 0.375 (bytes 0x38, 0x2C)
    s = torch.tensor([1.0, 0.375]).repeat(n, 1).to(torch.float8_e4m3fn)
    c = torch.empty(n, n)
    run(_dot_scaled_e4m3_scales, (1,), c, a, b, s, N=n, without=without)
    return not torch.equal(c, torch.full((n, n), 16 * 1.375))


def interpreter_module():
    import triton.runtime.interpreter as m

    return m


UPSTREAM = {
    "float-narrowing": _demo_float_narrowing,
    "narrow-float-casts": _demo_narrow_float_casts,
    "dot-operands": _demo_dot_operands,
    "bf16-elementwise": _demo_bf16_elementwise,
    "bf16-constants": _demo_bf16_constants,
    "nan-ignoring-min-max": _demo_nan_ignoring_min_max,
    "bf16-reductions": _demo_bf16_reductions,
    "bf16-atomics": _demo_bf16_atomics,
    "scalar-index": _demo_scalar_index,
    "amd-fp8-dtypes": _demo_amd_fp8_dtypes,
    "dot-scaled-bf16": _demo_dot_scaled_bf16,
    "dot-scaled-e4m3-scales": _demo_dot_scaled_e4m3_scales,
}


def test_every_fix_has_a_record_and_an_upstream_test():
    assert [f.name for f in FIXES] == list(UPSTREAM)
    for fix in FIXES:
        assert fix.wrong and fix.remedy and fix.patches
        assert fix.test.endswith(f"test_upstream_interpreter_is_still_wrong[{fix.name}]")
        assert Path(SRC.parent, fix.test.partition("::")[0]) == Path(__file__)


@pytest.mark.parametrize("fix", FIXES, ids=lambda f: f.name)
def test_upstream_interpreter_is_still_wrong(fix):
    """Where a fix claims this Triton version, Triton's interpreter without it is wrong and
    kernelab's is right; elsewhere the fix is not applied, and Triton is right on its own."""
    demo = UPSTREAM[fix.name]
    installed = {i.fix for i in interpreter._resolve().installs}
    if fix.applies_to(VERSION):
        assert fix.name in installed
        assert demo(without=fix.name), (
            f"Triton {VERSION} no longer has the bug that fix {fix.name!r} repairs: close its "
            f"version range (last={VERSION!r} minus one) or delete it"
        )
        assert not demo(without=None)
    else:
        assert fix.name not in installed and fix not in interpreter.active_fixes()
        assert not demo(without=None), f"Triton {VERSION} still has the bug of {fix.name!r}"


def test_version_ranges():
    fix = next(f for f in FIXES if f.name == "amd-fp8-dtypes")
    assert fix.versions == "3.6 to 3.7"
    assert fix.applies_to("3.6.0") and fix.applies_to("3.7.1+git1234") and fix.applies_to("3.7")
    assert not fix.applies_to("3.8.0") and not fix.applies_to("3.5.1")
    open_ended = next(f for f in FIXES if f.last is None)
    assert open_ended.versions == "3.6 and later" and open_ended.applies_to("4.0.0rc1")


def test_fixes_are_installed_only_while_a_cpu_launch_runs():
    state = interpreter._resolve()
    assert state.installs

    def unpatched():
        for i in state.installs:
            assert getattr(i.owner, i.attr, None) is i.original  # None: added by a fix

    unpatched()
    with interpreter._interpreting():
        for i in state.installs:
            assert getattr(i.owner, i.attr) is i.replacement
        assert JITFunction.__call__ is interpreter._device_call
    unpatched()
    assert JITFunction.__call__ is not interpreter._device_call


# --- laziness ------------------------------------------------------------------------------------


def test_import_touches_no_interpreter_private():
    """With a private the fixes need gone, kernelab.ops imports (and never even imports the
    interpreter module); the first CPU launch names the fix and the version."""
    code = (
        "import sys\n"
        "import triton.runtime.interpreter as m\n"
        "del m.InterpreterBuilder.create_dot\n"
        "del sys.modules['triton.runtime.interpreter']\n"
        "import kernelab.ops\n"
        "assert 'triton.runtime.interpreter' not in sys.modules\n"
        "print('imported')\n"
    )
    out = run_python(code)
    assert out.returncode == 0 and "imported" in out.stdout, out.stderr


@pytest.fixture
def fresh_state(monkeypatch):
    """kernelab's interpreter resolved anew (the test's changes to Triton are undone after)."""
    monkeypatch.setattr(interpreter, "_state", None)
    monkeypatch.setattr(interpreter, "_failure", None)
    return monkeypatch


def test_a_renamed_private_is_one_clear_error_at_the_first_cpu_launch(fresh_state):
    import triton.runtime.interpreter as m
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fresh_state.delattr(m.InterpreterBuilder, "create_dot")
    # The GPU path never resolves the fixes: the same @kernel compiles for sm_90.
    src = ASTSource(
        _add_kernel, {"Z": "*bf16", "X": "*bf16", "Y": "*bf16", "N": "constexpr"}, {"N": 4}
    )
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    assert "add.bf16" in compiled.asm["ptx"] or "add.rn.bf16" in compiled.asm["ptx"]
    z, x = torch.empty(4, dtype=BF16), bf16(1, 2, 3, 4)
    for _ in range(2):  # the same error at every CPU launch
        with pytest.raises(InterpreterFixError) as exc:
            _add_kernel[(1,)](z, x, x, N=4)
        message = str(exc.value)
        assert "'dot-operands'" in message and f"Triton {VERSION}" in message
        assert "InterpreterBuilder.create_dot does not exist" in message
    assert interpreter._depth == 0 and JITFunction.__call__ is not interpreter._device_call


def test_a_changed_signature_is_refused(fresh_state):
    import triton.runtime.interpreter as m

    fresh_state.setattr(m.InterpreterBuilder, "binary_op", lambda self, a, b, op, extra=None: a)
    with pytest.raises(InterpreterFixError, match=r"'bf16-elementwise'.*binary_op takes"):
        _add_kernel[(1,)](torch.empty(4), torch.ones(4), torch.ones(4), N=4)


def _make_fill():
    @kernel
    def fill(Z, N: tl.constexpr):
        tl.store(Z + tl.arange(0, N), tl.arange(0, N).to(tl.float32))

    return fill


def test_kernels_created_in_a_loop_do_not_accumulate():
    from triton.runtime.interpreter import InterpretedFunction

    triton_cache = getattr(InterpretedFunction, "rewritten_fn", {})
    before = len(triton_cache)
    refs = []
    for _ in range(20):
        fill = _make_fill()
        z = torch.empty(8)
        fill[(1,)](z, N=8)
        assert torch.equal(z, torch.arange(8.0))
        refs.append(weakref.ref(fill))
    del fill
    gc.collect()
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert len(triton_cache) == before


# --- bfloat16 as a GPU computes it ---------------------------------------------------------------


def test_the_bf16_example_through_kernel_and_through_a_plain_triton_jit():
    x, y = bf16(1.0, -3.0, 0.5, 2.0), bf16(0.25, 1.0, -0.5, 1.0)
    z = torch.empty(4, dtype=BF16)
    _add_kernel[(1,)](z, x, y, N=4)
    assert z.tolist() == [1.25, -2.0, 0.0, 3.0]
    w = torch.empty(4, dtype=BF16)
    with interpreting_user_kernels() as watch:
        _add[(1,)](w, x, y, N=4)
    assert w.tolist() == [1.25, -2.0, 0.0, 3.0] and watch.launches == 1


def _operands(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y, w = (torch.randn(n, generator=g).mul(3).to(BF16) for _ in range(3))
    y[:8] = x[:8]  # equal pairs for ==, <=, minimum...
    y[8:12] = -x[8:12]
    y[y == 0] = 1.0
    return x, y, w


ELEMENTWISE = {
    "add": lambda x, y, w: x + y,
    "sub": lambda x, y, w: x - y,
    "mul": lambda x, y, w: x * y,
    "div": lambda x, y, w: x / y,
    "mod": lambda x, y, w: torch.fmod(x, y),
    "neg": lambda x, y, w: -x,
    "abs": lambda x, y, w: x.abs(),
    "scalar": lambda x, y, w: x * 2.5 - 0.375,
    # by default tl.minimum/maximum ignore NaN (PropagateNan.NONE: min.bf16 on a GPU)
    "minimum": lambda x, y, w: torch.fmin(x, y),
    "maximum": lambda x, y, w: torch.fmax(x, y),
    "minimum_nan": lambda x, y, w: torch.minimum(x, y),
    "maximum_nan": lambda x, y, w: torch.maximum(x, y),
    "clamp": lambda x, y, w: x.clamp(-0.5, 0.75),  # of a NaN: undefined (Triton's docs)
    "where": lambda x, y, w: torch.where(x < y, x, y),
    # rounded once from the exact value (the product of two bf16 values is exact in float64)
    "fma": lambda x, y, w: (x.double() * y.double() + w.double()).to(BF16),
    # the math functions take float32 only, on a GPU as here (test below): widened by hand
    "exp": lambda x, y, w: x.exp(),
    "log": lambda x, y, w: x.abs().log(),
    "sqrt": lambda x, y, w: x.abs().sqrt(),
    "rsqrt": lambda x, y, w: x.abs().rsqrt(),
    "sin": lambda x, y, w: x.sin(),
    "cos": lambda x, y, w: x.cos(),
    "erf": lambda x, y, w: torch.erf(x),
    "sigmoid": lambda x, y, w: torch.sigmoid(x),
    "lt": lambda x, y, w: x < y,
    "le": lambda x, y, w: x <= y,
    "gt": lambda x, y, w: x > y,
    "ge": lambda x, y, w: x >= y,
    "eq": lambda x, y, w: x == y,
    "ne": lambda x, y, w: x != y,
}


@pytest.mark.parametrize("op", list(ELEMENTWISE))
def test_bf16_elementwise_is_torchs_bf16(op):
    """Arithmetic, comparisons, min/max, clamp, where, fma and the math functions on bf16:
    bitwise what torch computes in bf16 (float32, then rounded to nearest even)."""
    x, y, w = _operands()
    x[:3] = torch.tensor([1.0 if op == "clamp" else float("nan"), float("inf"), -0.0])
    expected = ELEMENTWISE[op](x, y, w)
    z = torch.empty(64, dtype=torch.int8 if expected.dtype == torch.bool else BF16)
    with np.errstate(all="ignore"):
        _elementwise_kernel[(1,)](z, x, y, w, OP=op, N=64)
    if expected.dtype == torch.bool:
        assert torch.equal(z.bool(), expected)
    else:
        assert torch.equal(z.isnan(), expected.isnan())
        assert torch.equal(z[~z.isnan()], expected[~expected.isnan()]), (z, expected)


@pytest.mark.parametrize("sign", [1, -1])
def test_bf16_fma_rounds_once(sign):
    """1.5 × 1.359375 = 261/128 lies exactly halfway between two bf16 values: a tiny addend
    decides the direction, which rounding the product first would lose."""
    x, y = bf16(1.5), bf16(1.359375)
    w = torch.tensor([sign * 2.0**-30], dtype=BF16)
    z = torch.empty(1, dtype=BF16)
    _elementwise_kernel[(1,)](z, x, y, w, OP="fma", N=1)
    assert z.item() == (262 / 128 if sign > 0 else 260 / 128)


def test_float64_to_bf16_rounds_once_as_the_gpu():
    """1 + 2⁻⁸ + 2⁻⁴⁰ is just above a bf16 midpoint: rounded once (cvt.rn.bf16.f64 on sm_90) it
    goes up; through float32 (torch's cast) it lands on the midpoint and ties to even."""
    x = torch.tensor([1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40)], dtype=torch.float64)
    z = torch.empty(2, dtype=BF16)
    run(_cast, (1,), z, x, N=2)
    assert z.tolist() == [1 + 2**-7, -(1 + 2**-7)] and x.to(BF16).tolist() == [1.0, -1.0]


def _messages(exc) -> str:
    out = []
    while exc is not None:
        out.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(out)


@pytest.mark.parametrize("op", ["exp", "sqrt", "sigmoid", "atomic_max", "atomic_xchg"])
def test_bf16_math_functions_are_refused_as_by_the_compiler(op):
    """tl.exp & co. take float32 or float64 only, and atomics other than add take no bf16:
    compiled for sm_90 and interpreted, the same refusal."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def bad(Z, X, OP: tl.constexpr):
        i = tl.arange(0, 16)
        x = tl.load(X + i)
        if OP == "exp":
            r = tl.exp(x)
        elif OP == "sqrt":
            r = tl.sqrt(x)
        elif OP == "sigmoid":
            r = tl.sigmoid(x)
        elif OP == "atomic_max":
            r = tl.atomic_max(Z + i, x)
        else:
            r = tl.atomic_xchg(Z + i, x)
        tl.store(Z + i, r)

    src = ASTSource(bad, {"Z": "*bf16", "X": "*bf16", "OP": "constexpr"}, {"OP": op})
    with pytest.raises(Exception) as compiled:
        triton.compile(src, target=GPUTarget("cuda", 90, 32))
    with pytest.raises(Exception) as interpreted:
        run(bad, (1,), torch.empty(16, dtype=BF16), torch.ones(16, dtype=BF16), OP=op)
    expected = (
        "Expected dtype ['fp32', 'fp64'] but got bf16"
        if op in ("exp", "sqrt", "sigmoid")
        else f"{op} does not support bf16"
    )
    assert expected in _messages(compiled.value) and expected in _messages(interpreted.value)


REDUCTIONS = {
    "sum": lambda x: x.sum(1),
    "max": lambda x: x.amax(1),
    "min": lambda x: x.amin(1),
    "argmax": lambda x: x.argmax(1),
    "argmin": lambda x: x.argmin(1),
    "max_with_index": lambda x: (x.amax(1), x.argmax(1)),
    "cumsum": lambda x: x.cumsum(1),
    "cumprod": lambda x: x.cumprod(1),
    "reduce": lambda x: x.sum(1),
}


@pytest.mark.parametrize("op", list(REDUCTIONS))
def test_bf16_reductions_are_torchs_bf16(op):
    """Reductions of bf16 in float32, rounded once (torch's bf16 reductions do the same)."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4, 16, generator=g) * (0.7 if op == "cumprod" else 3)).to(BF16)
    expected = REDUCTIONS[op](x)
    values, indices = expected if isinstance(expected, tuple) else (expected, expected)
    z = torch.empty(x.shape if op.startswith("cum") else (4,), dtype=BF16)
    idx = torch.empty(4, dtype=torch.int32)
    _reduce_kernel[(1,)](z, idx, x, OP=op, ROWS=4, N=16)
    if values.dtype == BF16:
        if op == "reduce":  # the combine function adds in bf16, each step rounded
            ref = x[:, 0]
            for j in range(1, 16):
                ref = ref + x[:, j]
            values = ref
        assert torch.equal(z, values), (z, values)
    if indices.dtype == torch.int64:
        assert torch.equal(idx.long(), indices)


def test_bf16_atomic_add_in_element_order():
    """Two programs of 8 elements each, repeated addresses: each update applied in turn, the
    sum in float32 rounded to bf16 (atom.add.noftz.bf16), old values returned."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, generator=g).mul(5).to(BF16)
    idx = torch.tensor([0, 1, 0, 2, 0, 1, 3, 3] * 2, dtype=torch.int32)
    z = bf16(0.5, -1.0, 2.0, 100.0)
    ref, ref_old = z.clone(), torch.empty(16, dtype=BF16)
    for k in range(16):
        j = int(idx[k])
        ref_old[k] = ref[j]
        ref[j] = (ref[j].float() + x[k].float()).to(BF16)
    old = torch.empty(16, dtype=BF16)
    _atomic_kernel[(2,)](z, old, x, idx, N=8)
    assert torch.equal(z, ref) and torch.equal(old, ref_old)


# --- users' plain @triton.jit kernels ------------------------------------------------------------


def test_user_kernels_are_interpreted_only_inside_the_scope():
    x = bf16(1.0, 2.0)
    z = torch.empty(2, dtype=BF16)
    original = JITFunction.__dict__["run"]
    # plain Triton: no driver on a CPU-only machine; CPU tensors refused on a GPU one
    with pytest.raises((RuntimeError, ValueError)):
        _add[(1,)](z, x, x, N=2)
    with interpreting_user_kernels() as outer:
        with interpreting_user_kernels() as inner:
            _add[(1,)](z, x, x, N=2)
        assert inner.launches == 1
        _add[(1,)](z, x, x, N=2)
        assert JITFunction.__dict__["run"] is not original
    assert outer.launches == 2 and inner.launches == 1
    assert JITFunction.__dict__["run"] is original
    assert z.tolist() == [2.0, 4.0]


def test_launches_off_the_cpu_keep_their_path():
    meta = torch.empty(4, device="meta")
    assert interpreter.all_on_cpu((torch.ones(2), 3), {"BLOCK": 4})
    assert not interpreter.all_on_cpu((meta, torch.ones(2)), {})
    assert not interpreter.all_on_cpu((1, 2), {"N": 3})
    assert interpreter.all_on_cpu((triton.reinterpret(torch.ones(2), tl.float32),), {})
    with interpreting_user_kernels() as watch, pytest.raises((RuntimeError, ValueError)):
        _add[(1,)](meta, meta, meta, N=4)
    assert watch.launches == 0


def test_user_kernels_from_several_threads():
    x, y = bf16(1.0, -3.0, 0.5, 2.0), bf16(0.25, 1.0, -0.5, 1.0)
    results, errors = [], []

    def work():
        try:
            with interpreting_user_kernels():
                for _ in range(3):
                    z = torch.empty(4, dtype=BF16)
                    _add[(1,)](z, x, y, N=4)
                    results.append(z.tolist())
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [[1.25, -2.0, 0.0, 3.0]] * 12
    assert interpreter._user_depth == 0 and not interpreter._user_restore


def test_interpreted_on_cpu_keeps_the_signature():
    import inspect

    def launcher(x, y, out=None):
        out = torch.empty_like(x) if out is None else out
        _add[(1,)](out, x, y, N=x.numel())
        return out

    wrapped = interpreter.interpreted_on_cpu(launcher)
    assert list(inspect.signature(wrapped).parameters) == ["x", "y", "out"]
    assert wrapped(bf16(1.0, 2.0), bf16(0.5, 0.5)).tolist() == [1.5, 2.5]


USER_SETS_TRITON_INTERPRET = """
import torch, triton, triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from kernelab.core.runtime.interpreter import interpreting_user_kernels

@triton.jit
def add(Z, X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Z + i, tl.load(X + i) + tl.load(Y + i))

assert isinstance(add, InterpretedFunction)
x = torch.tensor([1.0, -3.0, 0.5, 2.0], dtype=torch.bfloat16)
y = torch.tensor([0.25, 1.0, -0.5, 1.0], dtype=torch.bfloat16)
z = torch.empty_like(x)
with interpreting_user_kernels() as watch:
    add[(1,)](z, x, y, N=4)
assert watch.launches == 1 and z.tolist() == [1.25, -2.0, 0.0, 3.0], (watch.launches, z)
print("ok")
"""


def test_kernels_triton_itself_interprets_are_seen_and_fixed(tmp_path):
    """With TRITON_INTERPRET=1 set by the user, @triton.jit makes Triton's InterpretedFunction:
    inside the scope its launches are counted (bench must not time them) and get the fixes."""
    script = tmp_path / "user.py"
    script.write_text(USER_SETS_TRITON_INTERPRET)
    out = run_python(script=script, TRITON_INTERPRET="1")
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# --- the interpreter's own overheads -------------------------------------------------------------


@kernel
def _sums(Z, X, CALLS: tl.constexpr, N: tl.constexpr):
    """CALLS calls of standard-library JIT functions (tl.sum, tl.cdiv) per program."""
    i = tl.arange(0, N)
    x = tl.load(X + tl.program_id(0) * N + i)
    acc = 0.0
    for _ in tl.static_range(CALLS):
        acc += tl.sum(x) + tl.cdiv(N, 4)
    tl.store(Z + tl.program_id(0), acc)


def _lang_patches(monkeypatch, calls: int) -> int:
    """How often the interpreter scans a module of triton.language for its builtins during one
    launch of 4 programs making ``calls`` standard-library calls each."""
    import triton.runtime.interpreter as m

    seen = []
    original = m._patch_builtin
    monkeypatch.setattr(m, "_patch_builtin", lambda *a: (seen.append(a[0]), original(*a))[1])
    x = torch.arange(32.0).reshape(4, 8)
    z = torch.empty(4)
    _sums[(4,)](z, x, CALLS=calls, N=8)
    monkeypatch.undo()
    assert torch.equal(z, calls * (x.sum(1) + 2))
    return len(seen)


def test_the_language_is_patched_once_per_launch_not_per_call(monkeypatch):
    """Triton re-patches triton.language at each JIT-function call from a kernel (a fifth of
    an interpreted RMSNorm's CPU time); kernelab patches it once per launch."""
    once = _lang_patches(monkeypatch, 1)
    assert _lang_patches(monkeypatch, 8) == once
    # and restores it: the builtins are Triton's again after the launch
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.core.load)
    assert tl.core.is_builtin(tl.tensor.__add__)


# --- numpy's warnings inside interpreted launches ----------------------------------------------


@triton.jit
def _row_max(Out, X, N: tl.constexpr):
    x = tl.load(X + tl.arange(0, N))
    tl.store(Out, tl.max(x, axis=0))


def test_numpy_warnings_of_a_launch_are_counted_not_printed():
    """A row of NaN scores (a query holding a NaN) makes the interpreter's tl.max call
    np.nanmax on an all-NaN slice: the warning is counted, and nothing reaches the caller."""
    x = torch.full((8,), float("nan"))
    out = torch.zeros(1)
    before = interpreter.numeric_warnings().get("All-NaN slice encountered", 0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        interpreter.launch(_row_max, (1,), (out, x), {"N": 8})
    assert torch.isnan(out).all()
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], [
        str(w.message) for w in seen
    ]
    assert interpreter.numeric_warnings()["All-NaN slice encountered"] == before + 1


@triton.jit
def _warns(Out):
    warnings.warn("from the kernel", UserWarning, stacklevel=1)
    tl.store(Out, 1.0)


def test_other_warnings_of_a_launch_still_reach_the_caller():
    out = torch.zeros(1)
    with pytest.warns(UserWarning, match="from the kernel"):
        interpreter.launch(_warns, (1,), (out,), {})
