"""Triton's interpreter as kernelab runs it: CPU launches, the table of fixes, users' kernels.

A launch whose tensor arguments all live on the CPU runs through Triton's interpreter: always for
``@kernel`` functions (``triton.py``), and for plain ``@triton.jit`` functions while
``interpreting_user_kernels()`` is active (kernelab's verify and bench do this around a user's
candidate). While such a launch runs, the fixes of ``FIXES`` are installed and JIT functions
called from the kernel are interpreted too; everything is restored afterwards, so one process
can interpret a kernel and compile it for a GPU target.

Nothing here touches Triton's interpreter at import time. At the first CPU launch, the module
``triton.runtime.interpreter`` is imported and every fix that applies to the installed Triton is
resolved: its attributes found, their signatures checked, its replacement built. A fix that
cannot apply (Triton renamed a private name) raises one ``InterpreterFixError`` naming the fix
and the Triton version, at every CPU launch; GPU launches never get here.

Each fix names the test that runs the interpreter without it and asserts that Triton's own
behaviour is still wrong, for the versions the fix claims: when Triton fixes a bug, that test
fails, and the fix's version range is closed (or the fix deleted).
"""

from __future__ import annotations

import inspect
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

from kernelab.core.runtime import interpreter_fixes as fx


@dataclass(frozen=True)
class Patch:
    """One attribute of ``triton.runtime.interpreter`` replaced while a CPU launch runs.

    ``owner``: "" for the module itself, else a class in it. ``params``: the parameter names the
    original must have (else the fix does not apply). ``make(original, module)``: the
    replacement. ``new``: the attribute is missing and is added (``original`` is None)."""

    owner: str
    attr: str
    params: tuple[str, ...]
    make: Callable
    new: bool = False

    @property
    def path(self) -> str:
        return ".".join(p for p in ("triton.runtime.interpreter", self.owner, self.attr) if p)


@dataclass(frozen=True)
class Fix:
    """What Triton's interpreter does wrong, what kernelab does instead, for which versions."""

    name: str
    wrong: str
    remedy: str
    first: str  # the first Triton version with the bug (3.6: the oldest kernelab supports)
    last: str | None  # the last one; None: every later version too, until the test says not
    test: str  # the test showing that the unpatched interpreter is still wrong
    patches: tuple[Patch, ...]

    @property
    def versions(self) -> str:
        if self.last is None:
            return f"{self.first} and later"
        return self.first if self.first == self.last else f"{self.first} to {self.last}"

    def applies_to(self, version: str) -> bool:
        v = _version_tuple(version)
        first = _version_tuple(self.first)
        if v[: len(first)] < first:
            return False
        if self.last is None:
            return True
        last = _version_tuple(self.last)
        return v[: len(last)] <= last


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)


_TEST = "tests/core/runtime/test_interpreter.py::test_upstream_interpreter_is_still_wrong"
_BUILDER = "InterpreterBuilder"
_BIN = ("self", "lhs", "rhs", "op")

FIXES: tuple[Fix, ...] = (
    Fix(
        "float-narrowing",
        "float32 -> bfloat16 truncates (the GPU rounds to nearest even); rounding to float8 drops "
        "a carry out of the mantissa (125.6 as e4m3 became 64, not 128); no saturation",
        "narrowing float conversions round to nearest even through torch's casts; float8 "
        "saturates to its largest finite value, as cvt.rn.satfinite does",
        "3.6",
        None,
        f"{_TEST}[float-narrowing]",
        (
            Patch(
                "",
                "_convert_float",
                ("input", "input_dtype", "output_dtype", "rounding_mode"),
                fx.make_convert_float,
            ),
        ),
    ),
    Fix(
        "narrow-float-casts",
        "integers and float64 cast to bfloat16 or float8 are written into the storage integers "
        "as numbers (numpy astype), not as float bits",
        "such casts go through torch's rounding casts (integers through float32)",
        "3.6",
        None,
        f"{_TEST}[narrow-float-casts]",
        (Patch(_BUILDER, "cast_impl", ("self", "src", "dst_type"), fx.make_cast_impl),),
    ),
    Fix(
        "dot-operands",
        "tl.dot multiplies bfloat16 tiles as their raw uint16 storage, and widens float8 only "
        "to float16 (overflow past 65504)",
        "float operands narrower than 32 bits are widened exactly to float32 first",
        "3.6",
        None,
        f"{_TEST}[dot-operands]",
        (
            Patch(
                _BUILDER,
                "create_dot",
                ("self", "a", "b", "d", "input_precision", "max_num_imprecise_acc"),
                fx.make_create_dot,
            ),
        ),
    ),
    Fix(
        "bf16-elementwise",
        "bfloat16 arithmetic (+ - * / %, negation), comparisons, minimum/maximum and clamp "
        "compute on the raw uint16 storage: 1.0 + 0.25 gives 4.25e37; tl.fma likewise",
        "bf16 operands are widened to float32, computed, rounded back to nearest even; tl.fma "
        "rounds once (as fma.rn.bf16)",
        "3.6",
        None,
        f"{_TEST}[bf16-elementwise]",
        (
            Patch(_BUILDER, "binary_op", _BIN, fx.make_bf16_via_f32(2)),
            Patch(_BUILDER, "unary_op", ("self", "arg", "op"), fx.make_bf16_via_f32(1)),
            Patch(
                _BUILDER,
                "create_clampf",
                ("self", "arg", "lo", "hi", "propagate_nans"),
                fx.make_bf16_via_f32(3),
            ),
            Patch(_BUILDER, "create_fma", ("self", "x", "y", "z"), fx.make_create_fma),
        ),
    ),
    Fix(
        "bf16-constants",
        "a bfloat16 scalar constant (x * 2.5 with x in bf16) fails: the builder has no get_bf16",
        "get_bf16 is added: the constant in float32, rounded to bf16 (as Triton 3.9 does)",
        "3.6",
        "3.8",
        f"{_TEST}[bf16-constants]",
        (Patch(_BUILDER, "get_bf16", (), fx.make_get_bf16, new=True),),
    ),
    Fix(
        "nan-ignoring-min-max",
        "tl.minimum/tl.maximum propagate NaN by default, where PropagateNan.NONE asks for the "
        "other operand (min.f32 and min.bf16 on a GPU)",
        "the NaN-ignoring forms compute with numpy's fmin/fmax (as Triton 3.8 does)",
        "3.6",
        "3.7",
        f"{_TEST}[nan-ignoring-min-max]",
        (
            Patch(_BUILDER, "create_minnumf", _BIN[:3], fx.make_fmin),
            Patch(_BUILDER, "create_maxnumf", _BIN[:3], fx.make_fmax),
        ),
    ),
    Fix(
        "bf16-reductions",
        "tl.sum, tl.argmax/argmin and tl.cumsum/cumprod of bfloat16 reduce the raw uint16 storage",
        "bf16 values are reduced in float32 and the result rounded once to bf16 (as torch; a "
        "GPU rounds partial sums, in a layout-dependent order)",
        "3.6",
        None,
        f"{_TEST}[bf16-reductions]",
        (
            Patch("ReduceOps", "sum", ("self", "input"), fx.make_reduction),
            Patch(
                "ReduceOps",
                "min_max",
                ("self", "input", "val_reduce_op", "idx_reduce_op"),
                fx.make_reduction,
            ),
            Patch("ScanOps", "cumsum", ("self", "input"), fx.make_reduction),
            Patch("ScanOps", "cumprod", ("self", "input"), fx.make_reduction),
        ),
    ),
    Fix(
        "bf16-atomics",
        "tl.atomic_add on bfloat16 raises 'Unsupported data type'",
        "an element-by-element read-modify-write, each sum in float32 rounded to nearest even "
        "(atom.add.noftz.bf16)",
        "3.6",
        None,
        f"{_TEST}[bf16-atomics]",
        (
            Patch(
                _BUILDER,
                "create_atomic_rmw",
                ("self", "rmwOp", "ptr", "val", "mask", "sem", "scope"),
                fx.make_atomic_rmw,
            ),
        ),
    ),
    Fix(
        "scalar-index",
        "a scalar becomes an index through int() of its one-element array, which fails: "
        "range(0, n, BLOCK) with a runtime n",
        "the array is squeezed first (as Triton 3.7 does)",
        "3.6",
        "3.6",
        f"{_TEST}[scalar-index]",
        (Patch("", "_patch_lang_tensor", ("tensor", "scope"), fx.make_patch_lang_tensor),),
    ),
    Fix(
        "amd-fp8-dtypes",
        "dtype.to_ir lacks AMD's float8 formats (fp8e4b8, fp8e5b16), which its builder has",
        "to_ir maps them to the builder's types (as Triton 3.8 does)",
        "3.6",
        "3.7",
        f"{_TEST}[amd-fp8-dtypes]",
        (Patch("", "_patch_lang_core", ("lang", "scope"), fx.make_patch_lang_core),),
    ),
    Fix(
        "dot-scaled-bf16",
        "tl.dot_scaled decodes a bfloat16 operand through float16: values past 65504 become "
        "inf, values below 2^-24 become 0 (Triton 3.6 and 3.7 interpret no tl.dot_scaled)",
        "bf16 operands are widened exactly to float32, as the GPU's MMA reads them",
        "3.8",
        None,
        f"{_TEST}[dot-scaled-bf16]",
        (
            Patch(
                "", "_mxfp_value_handle_to_float32", ("value_handle",), fx.make_dot_scaled_operand
            ),
        ),
    ),
    Fix(
        "dot-scaled-e4m3-scales",
        "tl.dot_scaled reads an e4m3 scale (nvfp4's, one per 16 values) as a ue8m0 exponent "
        "byte: scale 1.0 (0x38) becomes 2^-71 (seen in 3.9; 3.6 and 3.7 interpret no "
        "tl.dot_scaled)",
        "e4m3 scales are decoded to their values, as the GPU's block-scaled MMA and its "
        "emulation (an e4m3 to bf16 conversion) read them",
        "3.9",
        None,
        f"{_TEST}[dot-scaled-e4m3-scales]",
        (
            Patch(
                "",
                "_dot_scaled_scale_to_f32",
                ("scale_handle", "compute_type"),
                fx.make_dot_scaled_scale,
            ),
        ),
    ),
)


class InterpreterFixError(RuntimeError):
    """A fix of ``FIXES`` cannot apply to the installed Triton (a renamed private attribute)."""


@dataclass
class _Install:
    fix: str
    owner: object
    attr: str
    original: object
    replacement: object
    owned: bool  # the attribute was the owner's own (not inherited): restore, else delete


@dataclass
class _State:
    module: ModuleType
    version: str
    installs: list[_Install]
    interpreted: type  # InterpretedFunction, caching its rewritten function on itself
    patch_lang: Callable


_lock = threading.RLock()
_state: _State | None = None
_failure: InterpreterFixError | None = None
_depth = 0
_launches = 0
#: numpy's floating-point RuntimeWarnings raised inside interpreted launches, by message
#: ("All-NaN slice encountered": a row of scores all NaN because its query holds a NaN, the
#: case verify plants; the kernel propagates it as the reference does). Counted, not printed.
_numeric = Counter()


def triton_version() -> str:
    import triton

    return triton.__version__


def active_fixes() -> list[Fix]:
    """The fixes that apply to the installed Triton."""
    version = triton_version()
    return [f for f in FIXES if f.applies_to(version)]


def _fail(what: str, version: str, why: str) -> InterpreterFixError:
    return InterpreterFixError(
        f"{what} cannot apply to the installed Triton {version}: {why}. Triton kernels cannot "
        "run on the CPU until kernelab's table of interpreter fixes "
        "(kernelab/core/runtime/interpreter.py) is updated for it; GPU launches are unaffected."
    )


def _resolve() -> _State:
    global _state, _failure
    with _lock:
        if _state is not None:
            return _state
        if _failure is not None:
            raise _failure
        try:
            _state = _build()
        except InterpreterFixError as exc:
            _failure = exc
            raise
        return _state


def _build() -> _State:
    version = triton_version()
    glue = "kernelab's interpreter glue"
    try:
        import triton.runtime.interpreter as m
    except Exception as exc:
        raise _fail(glue, version, f"importing triton.runtime.interpreter raised {exc!r}") from exc
    for name in ("InterpretedFunction", "_patch_lang"):
        if not hasattr(m, name):
            raise _fail(glue, version, f"triton.runtime.interpreter has no {name}")
    installs = []
    for fix in FIXES:
        if not fix.applies_to(version):
            continue
        what = f"kernelab's interpreter fix {fix.name!r} (for Triton {fix.versions})"
        for p in fix.patches:
            owner = getattr(m, p.owner, None) if p.owner else m
            if owner is None or hasattr(owner, p.attr) == p.new:
                exists = "already exists" if p.new else "does not exist"
                raise _fail(what, version, f"{p.path} {exists}")
            original = None if p.new else getattr(owner, p.attr)
            if not p.new:
                try:
                    params = tuple(inspect.signature(original).parameters)
                except (TypeError, ValueError):
                    params = None
                if params != p.params:
                    why = f"{p.path} takes {params}, the fix expects {p.params}"
                    raise _fail(what, version, why)
            try:
                replacement = p.make(original, m)
            except AttributeError as exc:
                raise _fail(what, version, f"the replacement needs {exc}") from exc
            owned = not p.new and (not isinstance(owner, type) or p.attr in vars(owner))
            installs.append(_Install(fix.name, owner, p.attr, original, replacement, owned))
    return _State(m, version, installs, _interpreted_class(m), m._patch_lang)


def _interpreted_class(m) -> type:
    class Interpreted(m.InterpretedFunction):
        """Triton's InterpretedFunction keeping its rewritten function on itself: Triton's own
        cache is a class-level dict that keeps every kernel ever interpreted alive."""

        _kernelab_rewritten = None

        def rewrite(self):
            if self._kernelab_rewritten is None:
                rewriter = getattr(self, "rewriter", None)
                rewritten = rewriter.rewrite_ast() if rewriter is not None else super().rewrite()
                self._kernelab_rewritten = rewritten
            return self._kernelab_rewritten

    return Interpreted


def _interpreted(fn, state: _State):
    """The interpreter's function for a JITFunction, kept on it (it lives and dies with it)."""
    interp = fn.__dict__.get("_kernelab_interpreted")
    if interp is None:
        interp = state.interpreted(fn.fn)
        fn.__dict__["_kernelab_interpreted"] = interp
    return interp


def call_device_function(fn, args, kwargs):
    """A JIT function called from an interpreted kernel.

    Triton's own ``InterpretedFunction.__call__`` patches ``triton.language`` for the callee
    (and never restores it, which leaves ``tl.core`` unusable for compiling afterwards). Here
    the language is already patched, once for the whole launch (``_interpreting``), and
    restored when the launch ends."""
    state = _resolve()
    return _interpreted(fn, state).rewrite()(*args, **kwargs)


def _device_call(self, *args, **kwargs):
    return call_device_function(self, args, kwargs)


def _lang_probe() -> Callable:
    """A function that sees both ``triton.language`` and ``triton.language.core``: the
    interpreter's ``_patch_lang`` of it patches every name a kernel or a standard-library
    function (``tl.sum``, ``tl.cdiv``: they use ``core``) calls."""
    import types

    import triton.language as tl

    return types.FunctionType((lambda: None).__code__, {"tl": tl, "core": tl.core})


class _Patched:
    """What the interpreter's ``_patch_lang`` returns during a launch that already patched the
    language: nothing to patch, nothing to restore."""

    def restore(self) -> None:
        pass


def _patch_lang_once(fn):
    return _Patched()


@contextmanager
def _interpreting(fixes=None):
    """While an interpreted launch runs: the fixes (``fixes``: names; None: all that apply)
    installed, and JIT functions called from the kernel (Triton's standard library: tl.sum,
    tl.cdiv...) interpreted, as with TRITON_INTERPRET=1. Restored afterwards; re-entrant.

    ``triton.language`` is patched for the interpreter once per launch, here, and the
    interpreter's own ``_patch_lang`` is a no-op until the launch ends. Triton patches it at
    every call of a JIT function from the kernel (each ``tl.sum``, ``tl.cdiv``, ``tl.maximum``
    of the standard library: ``inspect.getmembers`` of three modules), which was a fifth of the
    CPU time of interpreted RMSNorm kernels; the patches are the same each time.

    The lock is held for the whole launch: the patches and the interpreter's builder (which
    holds the program id being run) are process-wide, so interpreted launches are serialised."""
    global _depth, _launches
    from triton.runtime.jit import JITFunction

    state = _resolve()
    with _lock:
        installs = [i for i in state.installs if fixes is None or i.fix in fixes]
        if _depth == 0:
            _launches += 1
            original_call = JITFunction.__dict__["__call__"]
            JITFunction.__call__ = _device_call
            for i in installs:
                setattr(i.owner, i.attr, i.replacement)
            lang = state.patch_lang(_lang_probe())
            state.module._patch_lang = _patch_lang_once
        _depth += 1
        caught = None
        try:
            if _depth == 1:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    yield
            else:
                yield
        finally:
            _depth -= 1
            _sort_warnings(caught or ())
            if _depth == 0:
                state.module._patch_lang = state.patch_lang
                lang.restore()
                for i in reversed(installs):
                    if i.owned:
                        setattr(i.owner, i.attr, i.original)
                    else:
                        delattr(i.owner, i.attr)
                JITFunction.__call__ = original_call


def _sort_warnings(caught) -> None:
    """Count numpy's RuntimeWarnings of a launch (``numeric_warnings``); warn the rest again."""
    for w in caught:
        if issubclass(w.category, RuntimeWarning):
            _numeric[str(w.message)] += 1
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def numeric_warnings() -> dict[str, int]:
    """numpy's floating-point warnings raised inside interpreted launches so far in this
    process, by message: kept out of the terminal, counted for a summary."""
    return dict(_numeric)


def launch(fn, grid, args, kwargs, warmup: bool = False, fixes=None):
    """Run ``fn[grid](*args, **kwargs)`` (a JITFunction) through the interpreter."""
    if warmup:
        return None
    state = _resolve()
    interp = _interpreted(fn, state)
    with _interpreting(fixes):
        return interp.run(*args, grid=grid, warmup=False, **kwargs)


def _tensors(values):
    for v in values:
        if isinstance(v, tuple | list):
            yield from _tensors(v)
        elif hasattr(v, "data_ptr") and hasattr(v, "device"):
            yield v
        elif hasattr(getattr(v, "base", None), "data_ptr"):  # a host tensor descriptor
            yield v.base


def all_on_cpu(args, kwargs) -> bool:
    """Whether a launch has tensor arguments and all of them live on the CPU."""
    devices = [t.device.type for t in _tensors((*args, *kwargs.values()))]
    return bool(devices) and all(d == "cpu" for d in devices)


# --- users' kernels ------------------------------------------------------------------------------


def interpreted_launches() -> int:
    """Interpreted launches so far in this process (any kernel, any thread)."""
    return _launches


class Watch:
    """Interpreted launches (of any kernel, in any thread) while a ``interpreting_user_kernels``
    scope is open; the count is kept when it closes."""

    def __init__(self) -> None:
        self._start = _launches
        self._end: int | None = None

    @property
    def launches(self) -> int:
        return (_launches if self._end is None else self._end) - self._start


_user_depth = 0
_user_restore: list = []


def _user_run(original):
    def run(self, *args, grid, warmup, **kwargs):
        if not warmup and all_on_cpu(args, kwargs):
            return launch(self, grid, args, kwargs)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    return run


def _interpreted_run(original):
    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        with _interpreting():
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    return run


@contextmanager
def interpreting_user_kernels():
    """While open: a plain ``@triton.jit`` function launched with all its tensors on the CPU
    runs through the interpreter with kernelab's fixes, as a ``@kernel`` does (no
    TRITON_INTERPRET needed). Kernels Triton already interprets (TRITON_INTERPRET=1 set by the
    user) get the fixes too. Yields a ``Watch`` counting interpreted launches.

    Process-wide while open (the hook is on the JITFunction class), restored when the last
    scope closes; re-entrant and safe to open from several threads."""
    global _user_depth
    from triton.runtime.jit import JITFunction

    with _lock:
        if _user_depth == 0:
            hooks = [(JITFunction, _user_run)]
            m = sys.modules.get("triton.runtime.interpreter")
            if m is not None and "run" in vars(getattr(m, "InterpretedFunction", object)):
                hooks.append((m.InterpretedFunction, _interpreted_run))
            for cls, hook in hooks:
                original = cls.__dict__["run"]
                _user_restore.append((cls, original))
                cls.run = hook(original)
        _user_depth += 1
        watch = Watch()
    try:
        yield watch
    finally:
        with _lock:
            watch._end = _launches
            _user_depth -= 1
            if _user_depth == 0:
                while _user_restore:
                    cls, original = _user_restore.pop()
                    cls.run = original


def interpreted_on_cpu(fn: Callable) -> Callable:
    """``fn`` called inside ``interpreting_user_kernels()`` (its signature kept)."""
    import functools

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with interpreting_user_kernels():
            return fn(*args, **kwargs)

    return call
