"""Where Triton kernels run: natively on CUDA/ROCm, through Triton's interpreter on CPU.

``@kernel`` replaces ``@triton.jit``. The object it returns *is* a ``triton.JITFunction``, so
the compiler, ``triton.compile`` and ``kernelab inspect`` treat it as any Triton kernel; in
addition, a launch whose tensor arguments live on the CPU executes through the interpreter, and
helper functions marked ``@kernel`` are interpreted when called from an interpreted kernel.
This replaces the process-wide ``TRITON_INTERPRET=1`` switch, which must be set before import
and then forbids compiling the same kernel for a GPU target in the same process.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import torch
from triton.runtime import interpreter as _interp_mod
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from kernelab import _flags

_INTERPRETED: dict[int, InterpretedFunction] = {}
_lock = threading.RLock()
_depth = 0
_original_call = JITFunction.__call__


def _interpreted(fn: JITFunction) -> InterpretedFunction:
    key = id(fn.fn)
    if key not in _INTERPRETED:
        _INTERPRETED[key] = InterpretedFunction(fn.fn)
    return _INTERPRETED[key]


def _call_interpreted(self, *args, **kwargs):
    """A device-function call inside an interpreted kernel.

    Triton's own ``InterpretedFunction.__call__`` patches ``triton.language`` for the callee and
    never restores it, which leaves ``tl.core`` unusable for compiling afterwards; here the
    patch is scoped to the call, so one process can interpret and compile the same kernels.
    """
    fn = _interpreted(self)
    scope = _interp_mod._patch_lang(fn.fn)
    try:
        return fn.rewrite()(*args, **kwargs)
    finally:
        if scope is not None:
            scope.restore()


# --- float conversions as the GPU does them ------------------------------------------------
#
# Triton's interpreter narrows floats by bit manipulation: float32 -> bfloat16 truncates (the
# GPU rounds to nearest even), and when it does round, a carry out of the mantissa is dropped
# instead of raising the exponent (seen with triton 3.9: 125.6 as float8 e4m3 became 64, the GPU
# and torch give 128). Kernels then look one ulp worse than they are, or wrong, on CPU only.
# While kernelab interprets a kernel, narrowing conversions round to nearest even through
# torch's casts, and float8 conversions saturate to the largest finite value as the GPU's
# ``cvt.rn.satfinite`` does. Round-toward-zero requests keep the interpreter's own code.

_original_convert = _interp_mod._convert_float
_TORCH_FLOAT = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8e4nv": getattr(torch, "float8_e4m3fn", None),
    "fp8e5": getattr(torch, "float8_e5m2", None),
    "fp8e4b8": getattr(torch, "float8_e4m3fnuz", None),
    "fp8e5b16": getattr(torch, "float8_e5m2fnuz", None),
}
_TORCH_BITS = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
_NP_BITS = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def _convert_float_rne(data, src_dtype, dst_dtype, rounding_mode):
    src = _TORCH_FLOAT.get(getattr(src_dtype, "name", None))
    dst = _TORCH_FLOAT.get(getattr(dst_dtype, "name", None))
    rtz = rounding_mode is not None and rounding_mode != _interp_mod._ir.ROUNDING_MODE.RTNE
    if src is None or dst is None or rtz:
        return _original_convert(data, src_dtype, dst_dtype, rounding_mode)
    raw = np.ascontiguousarray(data).view(_NP_BITS[src_dtype.primitive_bitwidth])
    signed = (
        raw.view(np.int16)
        if raw.dtype == np.uint16
        else raw.view(np.int32)
        if raw.dtype == np.uint32
        else raw
    )
    values = torch.from_numpy(signed.copy()).view(src).to(torch.float32)
    if dst_dtype.primitive_bitwidth == 8:
        finite_max = torch.finfo(dst).max
        values = torch.where(torch.isnan(values), values, values.clamp(-finite_max, finite_max))
    out = values.to(dst).view(_TORCH_BITS[dst_dtype.primitive_bitwidth]).numpy()
    return out.view(_NP_BITS[dst_dtype.primitive_bitwidth]).reshape(np.shape(data))


_original_create_dot = _interp_mod.InterpreterBuilder.create_dot


def _create_dot_exact(self, a, b, d, input_precision, max_num_imprecise_acc):
    """Triton's interpreter hands bfloat16 tiles (stored as uint16) to numpy's matmul as raw
    integers, and widens float8 only to float16. Here every float operand narrower than 32 bits
    is widened exactly to float32 first; products of two such values are exact in float32, and
    the sum is accumulated in the accumulator's type, as tensor cores do."""
    ops = []
    for h in (a, b):
        data = h.data
        if h.dtype.is_floating() and h.dtype.primitive_bitwidth < 32:
            data = _convert_float_rne(data, h.dtype, _interp_mod.tl.float32, None)
            data = data.view(np.float32)
        ops.append(data)
    out = np.matmul(ops[0], ops[1], dtype=d.data.dtype) + d.data
    return _interp_mod.TensorHandle(out, d.dtype.scalar)


_original_si_to_fp = _interp_mod.InterpreterBuilder.create_si_to_fp
_original_ui_to_fp = _interp_mod.InterpreterBuilder.create_ui_to_fp


def _int_to_float(original):
    """Triton's interpreter converts integers to bfloat16 (and float8) with numpy's ``astype``
    into the uint16 (uint8) storage, which writes the integer, not its float bits. Here such
    conversions go through float32 and round as the GPU does; others keep the original code."""

    def convert(self, src, dst_type):
        dst = dst_type.scalar
        if dst.name not in _TORCH_FLOAT or dst.name in ("fp32", "fp16"):
            return original(self, src, dst_type)
        wide = np.asarray(src.data).astype(np.float32)
        bits = _convert_float_rne(wide, _interp_mod.tl.float32, dst, None)
        return _interp_mod.TensorHandle(bits, dst)

    return convert


_original_patch_tensor = _interp_mod._patch_lang_tensor


def _patch_lang_tensor(tensor, scope):
    """Triton 3.6's interpreter turns a scalar into an index with ``int(array)``, which fails
    for the one-element arrays it uses for scalar arguments (``range(0, n, BLOCK)`` with a
    runtime ``n``); later versions squeeze first. Same fix, for every version."""
    _original_patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))


_original_patch_core = _interp_mod._patch_lang_core


def _patch_lang_core(lang, scope):
    """Triton 3.6's interpreter maps Triton dtypes to its own types without AMD's float8
    formats (fp8e4b8, fp8e5b16), although its builder provides them; later versions map them.
    Same mapping, for every version."""
    _original_patch_core(lang, scope)
    inner = lang.dtype.to_ir

    def to_ir(self, builder):
        if self.name == "fp8e4b8":
            return builder.get_fp8e4b8_ty()
        if self.name == "fp8e5b16":
            return builder.get_fp8e5b16_ty()
        return inner(self, builder)

    scope.set_attr(lang.dtype, "to_ir", to_ir)


@contextmanager
def _interpreting():
    """While an interpreted launch runs: JIT functions called from it (Triton's own standard
    library: ``tl.sum``, ``tl.max``, ``tl.cdiv``...) are interpreted too, exactly as they would
    be had Triton been imported with TRITON_INTERPRET=1, float conversions round as the GPU
    does, and ``tl.dot`` multiplies 16- and 8-bit floats exactly (see above). Restored
    afterwards; re-entrant."""
    global _depth
    with _lock:
        if _depth == 0:
            JITFunction.__call__ = _call_interpreted
            _interp_mod._convert_float = _convert_float_rne
            _interp_mod._patch_lang_tensor = _patch_lang_tensor
            _interp_mod.InterpreterBuilder.create_dot = _create_dot_exact
            _interp_mod.InterpreterBuilder.create_si_to_fp = _int_to_float(_original_si_to_fp)
            _interp_mod.InterpreterBuilder.create_ui_to_fp = _int_to_float(_original_ui_to_fp)
            _interp_mod._patch_lang_core = _patch_lang_core
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            if _depth == 0:
                JITFunction.__call__ = _original_call
                _interp_mod._convert_float = _original_convert
                _interp_mod._patch_lang_tensor = _original_patch_tensor
                _interp_mod.InterpreterBuilder.create_dot = _original_create_dot
                _interp_mod.InterpreterBuilder.create_si_to_fp = _original_si_to_fp
                _interp_mod.InterpreterBuilder.create_ui_to_fp = _original_ui_to_fp
                _interp_mod._patch_lang_core = _original_patch_core


class Kernel(JITFunction):
    """A Triton JIT function that also runs on CPU tensors through the interpreter."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            if tensors and all(t.device.type == "cpu" for t in tensors):
                with _interpreting():
                    return _interpreted(self)[grid](*args, **kwargs)
            return JITFunction.__getitem__(self, grid)(*args, **kwargs)

        return launch

    def __call__(self, *args, **kwargs):
        # Reached only by the interpreter: compiled kernels inline helpers at code generation.
        return _call_interpreted(self, *args, **kwargs)


def kernel(fn=None, **options):
    """Decorator: ``@kernel`` or ``@kernel(do_not_specialize=[...])`` like ``@triton.jit``."""
    if fn is None:
        return lambda f: Kernel(f, **options)
    return Kernel(fn, **options)


def use_triton(t: torch.Tensor) -> bool:
    """Whether a public op should run its Triton kernel for a tensor on ``t``'s device.

    CUDA and ROCm (both ``cuda`` in torch): yes. CPU: only when KERNELAB_INTERPRET=1, which runs
    the kernel through Triton's interpreter; otherwise the torch implementation serves.
    """
    if t.device.type == "cuda":
        return True
    return t.device.type == "cpu" and _flags.interpret()


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def num_sms(device: torch.device | None) -> int:
    """Multiprocessors of ``device``; for CPU (interpreter) an H100/H200-sized guess of 132."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132
