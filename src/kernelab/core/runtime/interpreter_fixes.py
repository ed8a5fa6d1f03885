"""The replacements kernelab installs in Triton's interpreter (the table of fixes, with what each
repairs and for which Triton versions, is ``interpreter.FIXES``).

Each ``make_*(original, m)`` receives the interpreter's original attribute and the module
``triton.runtime.interpreter`` and returns the replacement. A factory reads every private name
it needs from ``m`` when it is called, at the first CPU launch, so that a renamed one fails there
with an error naming the fix, never halfway through a kernel.

bfloat16 in the interpreter is stored as uint16; every fix below that says "bf16" widens such
operands exactly to float32 (a bf16 value is the top half of a float32), computes what the
interpreter computes for float32, and rounds back to nearest even, as the GPU and torch round.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

_TORCH_FLOAT = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8e4nv": getattr(torch, "float8_e4m3fn", None),
    "fp8e5": getattr(torch, "float8_e5m2", None),
    "fp8e4b8": getattr(torch, "float8_e4m3fnuz", None),
    "fp8e5b16": getattr(torch, "float8_e5m2fnuz", None),
}
# Bits as numpy and torch both hold them (torch has no uint16/32/64 arithmetic: signed views).
_NP_BITS = {8: np.uint8, 16: np.int16, 32: np.int32, 64: np.int64}
_TORCH_BITS = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}
_NP_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


def _contiguous(a, dtype=None) -> np.ndarray:
    a = np.asarray(a, dtype=dtype)
    return a if a.flags.c_contiguous and a.flags.writeable else a.copy()


# --- bfloat16 <-> float32 ------------------------------------------------------------------------


def is_bf16(handle) -> bool:
    """A TensorHandle holding bfloat16 values (a comparison's result keeps the operands' dtype
    but holds booleans: not bf16)."""
    return getattr(handle.dtype, "name", None) == "bf16" and handle.data.dtype == np.uint16


def widen_bf16(bits) -> np.ndarray:
    """bf16 storage -> float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def narrow_bf16(values) -> np.ndarray:
    """float32 -> bf16 storage, rounded to nearest even; NaN -> the canonical quiet NaN (torch's
    rule; the GPU's cvt.rn.bf16.f32 gives a NaN too)."""
    v = np.asarray(values, dtype=np.float32)
    bits = v.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return np.where(np.isnan(v), np.uint32(0x7FC0), rounded).astype(np.uint16)


# --- float conversions ---------------------------------------------------------------------------


def make_convert_float(original, m):
    """Narrowing float conversions round to nearest even through torch's casts; float8 results
    saturate to the largest finite value (the GPU's cvt.rn.satfinite). Round-toward-zero
    requests, and formats torch lacks, keep the interpreter's own code."""
    rtne = m._ir.ROUNDING_MODE.RTNE

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        src = _TORCH_FLOAT.get(getattr(input_dtype, "name", None))
        dst = _TORCH_FLOAT.get(getattr(output_dtype, "name", None))
        if src is None or dst is None or (rounding_mode is not None and rounding_mode != rtne):
            return original(input, input_dtype, output_dtype, rounding_mode)
        return convert_bits(input, input_dtype, output_dtype)

    return convert_float


def convert_bits(data, src_dtype, dst_dtype) -> np.ndarray:
    """Storage of ``src_dtype`` -> unsigned-integer storage of ``dst_dtype`` (Triton dtypes),
    rounded to nearest even by torch, float8 saturated."""
    src = _TORCH_FLOAT[src_dtype.name]
    dst = _TORCH_FLOAT[dst_dtype.name]
    width = src_dtype.primitive_bitwidth
    raw = _contiguous(data).view(_NP_BITS[width])
    values = torch.from_numpy(raw).view(src).to(torch.float64 if width == 64 else torch.float32)
    if dst_dtype.primitive_bitwidth == 8:
        finite_max = torch.finfo(dst).max
        values = torch.where(torch.isnan(values), values, values.clamp(-finite_max, finite_max))
    out_width = dst_dtype.primitive_bitwidth
    out = values.to(dst).view(_TORCH_BITS[out_width]).numpy()
    return out.view(_NP_UINT[out_width]).reshape(np.shape(data))


def make_cast_impl(original, m):
    """Casts into bfloat16 or float8 from integers or float64 round to nearest even (the
    interpreter's numpy ``astype`` writes the number itself into the storage integers): float64
    to bf16 rounded once, as the GPU does (torch rounds through float32, twice); the others
    through torch's casts (integers through float32)."""
    TensorHandle, f32 = m.TensorHandle, m.tl.float32

    def cast_impl(self, src, dst_type):
        dst = dst_type.scalar
        src_ty = src.dtype.scalar
        narrow = _TORCH_FLOAT.get(dst.name) is not None and dst.name not in ("fp64", "fp32", "fp16")
        if not narrow or (src_ty.is_floating() and src_ty.name != "fp64"):
            return original(self, src, dst_type)
        if src_ty.name == "fp64" and dst.name == "bf16":  # rounded once, as cvt.rn.bf16.f64
            wide = np.asarray(src.data, dtype=np.float64)
            bits = narrow_bf16(_round_to_odd(wide, np.zeros_like(wide), np.float32, np.uint32))
        elif src_ty.name == "fp64":
            bits = convert_bits(src.data, src_ty, dst)
        else:
            bits = convert_bits(np.asarray(src.data).astype(np.float32), f32, dst)
        return TensorHandle(bits, dst)

    return cast_impl


def make_create_dot(original, m):
    """tl.dot widens every float operand narrower than 32 bits exactly to float32 (products of
    two such values are exact in float32) and accumulates in the accumulator's type, as tensor
    cores do."""
    TensorHandle, f32 = m.TensorHandle, m.tl.float32

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        ops = []
        for h in (a, b):
            data = h.data
            if h.dtype.is_floating() and h.dtype.primitive_bitwidth < 32:
                data = convert_bits(data, h.dtype, f32).view(np.float32)
            ops.append(data)
        out = np.matmul(ops[0], ops[1], dtype=d.data.dtype) + d.data
        return TensorHandle(out, d.dtype.scalar)

    return create_dot


def make_dot_scaled_operand(original, m):
    """tl.dot_scaled's bf16 operands are widened exactly to float32 (the interpreter decodes
    every operand that is not e2m1 through float16, where bf16 values past 65504 become inf and
    those below 2^-24 become 0); the others keep the interpreter's decoding (e4m3 and e5m2 fit
    float16 exactly)."""

    def to_float32(value_handle):
        if is_bf16(value_handle):
            return widen_bf16(value_handle.data)
        return original(value_handle)

    return to_float32


def make_dot_scaled_scale(original, m):
    """tl.dot_scaled's e4m3 scales (nvfp4: float8e4nv, one per 16 values) are decoded to their
    float32 values, as the GPU reads them (the interpreter shifts every scale byte into a
    float32 exponent, the ue8m0 reading); uint8 scales keep the interpreter's decoding. e4m3's
    NaN byte decodes to NaN: the block reads as NaN."""
    f32 = m.tl.float32

    def scale_to_f32(scale_handle, compute_type):
        if getattr(scale_handle.dtype, "name", None) == "fp8e4nv":
            return convert_bits(scale_handle.data, scale_handle.dtype, f32).view(np.float32)
        return original(scale_handle, compute_type)

    return scale_to_f32


# --- bfloat16 arithmetic -------------------------------------------------------------------------


def make_bf16_via_f32(handles: int):
    """A factory for builder methods whose first ``handles`` arguments are operands: bf16
    operands are widened to float32, the original computes, a float32 result is rounded back
    (comparisons' booleans are kept)."""

    def make(original, m):
        TensorHandle, f32 = m.TensorHandle, m.tl.float32

        @functools.wraps(original)
        def method(self, *args):
            operands = args[:handles]
            if not any(is_bf16(h) for h in operands):
                return original(self, *args)
            bf16 = next(h.dtype.scalar for h in operands if is_bf16(h))
            wide = [TensorHandle(widen_bf16(h.data), f32) if is_bf16(h) else h for h in operands]
            out = original(self, *wide, *args[handles:])
            if out.data.dtype == np.float32:
                return TensorHandle(narrow_bf16(out.data), bf16)
            return TensorHandle(out.data, operands[0].dtype.scalar)

        return method

    return make


def _round_to_odd(exact: np.ndarray, err: np.ndarray, to, uint) -> np.ndarray:
    """``exact + err`` (``err`` 0 where ``exact`` is exact) rounded to ``to`` with round-to-odd:
    an inexact result gets an odd last bit. Round-to-odd at 24 bits followed by round to
    nearest even at 8 bits is the correctly rounded 8-bit result."""
    out = exact.astype(to)
    inexact = (out.astype(exact.dtype) != exact) | (err != 0)
    even = (out.view(uint) & uint(1)) == 0
    fix = inexact & even & np.isfinite(out)
    if fix.any():
        target = np.where(exact + err > out.astype(exact.dtype), np.inf, -np.inf).astype(to)
        out[fix] = np.nextafter(out[fix], target[fix])
    return out


def fma_bf16(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x·y + z rounded once to bfloat16 (float32 inputs holding bf16 values), as fma.rn.bf16.

    The product is exact in float64; TwoSum gives the sum's rounding error exactly; the sum is
    rounded to odd at float64, then at float32, then to nearest even at bf16."""
    p = x.astype(np.float64) * y.astype(np.float64)
    c = z.astype(np.float64)
    s = p + c
    with np.errstate(invalid="ignore"):
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
    err = np.where(np.isfinite(s), err, 0.0)
    s64 = _round_to_odd(s, err, np.float64, np.uint64)
    return narrow_bf16(_round_to_odd(s64, np.zeros_like(s64), np.float32, np.uint32))


def make_create_fma(original, m):
    """tl.fma on bf16 rounds once (the interpreter multiplied the storage integers)."""
    TensorHandle = m.TensorHandle

    def create_fma(self, x, y, z):
        if not any(is_bf16(h) for h in (x, y, z)):
            return original(self, x, y, z)
        wide = np.broadcast_arrays(*(widen_bf16(h.data) for h in (x, y, z)))
        return TensorHandle(fma_bf16(*wide), z.dtype.scalar)

    return create_fma


def _bf16_tensor(m, t) -> bool:
    return isinstance(t, m.tl.core.tensor) and is_bf16(t.handle)


def _retyped(m, t, dtype, data):
    ty = m.tl.block_type(dtype, list(t.type.shape)) if t.type.is_block() else dtype
    return m.tl.core.tensor(m.TensorHandle(data, dtype), ty)


def make_reduction(original, m):
    """A reduction or scan fast path (tl.sum, argmax/argmin, cumsum, cumprod) on bf16: the
    interpreter reduces the storage integers. Here the values are reduced in float32 and the
    result rounded once to bf16, as torch's bf16 reductions do. A GPU rounds each partial result
    of a bf16 reduction to bf16, in an order that depends on the layout: results may differ from
    it by a few bf16 ulps (kernels that care sum in float32, as kernelab's do)."""
    tl = m.tl

    def reduce(self, input, *args, **kwargs):
        first = input[0] if isinstance(input, tuple) else input
        if not _bf16_tensor(m, first):
            return original(self, input, *args, **kwargs)
        wide = _retyped(m, first, tl.float32, widen_bf16(first.handle.data))
        out = original(
            self, (wide, *input[1:]) if isinstance(input, tuple) else wide, *args, **kwargs
        )

        def narrow(t):
            if isinstance(t, tl.core.tensor) and t.dtype == tl.float32:
                return _retyped(m, t, tl.bfloat16, narrow_bf16(t.handle.data))
            return t

        if isinstance(out, (list, tuple)):
            return type(out)(narrow(t) for t in out)
        return narrow(out)

    return reduce


def make_atomic_rmw(original, m):
    """tl.atomic_add on bf16 (the interpreter raises 'Unsupported data type'; Triton allows no
    other read-modify-write on bf16): element by element, so that repeated addresses
    accumulate, each sum computed in float32 and rounded to nearest even, as the GPU's
    atom.add.noftz.bf16 does."""
    TensorHandle, add, native = m.TensorHandle, m._ir.ATOMIC_OP.FADD, m._interpreter

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        if not is_bf16(val) or rmwOp != add:
            return original(self, rmwOp, ptr, val, mask, sem, scope)
        ptrs, vals, masks = np.broadcast_arrays(ptr.data, val.data, mask.data)
        shape = vals.shape
        ptrs, vals, masks = (a.reshape(-1) for a in (ptrs, vals, masks))
        old = np.zeros(vals.shape, dtype=np.uint16)
        one = np.ones(1, dtype=bool)
        for i in np.flatnonzero(masks):
            where = ptrs[i : i + 1].astype(np.uint64)
            prev = native.load(where, one, np.zeros(1, np.uint16), np.dtype(np.uint16))
            old[i] = prev[0]
            native.store(where, narrow_bf16(widen_bf16(prev) + widen_bf16(vals[i])), one)
        return TensorHandle(old.reshape(shape), val.dtype.scalar)

    return create_atomic_rmw


# --- fixes for older Triton versions -------------------------------------------------------------


def make_get_bf16(original, m):
    """A bf16 scalar constant: its float32 value cast to bf16 (rounded by the cast's fix)."""
    bf16 = m.tl.bfloat16

    def get_bf16(self, value):
        return self.create_fp_trunc(self.get_fp32(value), bf16)

    return get_bf16


def make_nan_ignoring(op):
    """A factory for minnumf/maxnumf computing with ``op`` (numpy's fmin or fmax)."""

    def make(original, m):
        def nan_ignoring(self, lhs, rhs):
            return self.binary_op(lhs, rhs, op)

        return nan_ignoring

    return make


make_fmin = make_nan_ignoring(np.fmin)
make_fmax = make_nan_ignoring(np.fmax)


def make_patch_lang_tensor(original, m):
    """Scalars become indices by squeezing their one-element arrays first."""

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    return patch_lang_tensor


def make_patch_lang_core(original, m):
    """dtype.to_ir maps AMD's float8 formats to the builder's types."""

    def patch_lang_core(lang, scope):
        original(lang, scope)
        inner = lang.dtype.to_ir

        def to_ir(self, builder):
            if self.name == "fp8e4b8":
                return builder.get_fp8e4b8_ty()
            if self.name == "fp8e5b16":
                return builder.get_fp8e5b16_ty()
            return inner(self, builder)

        scope.set_attr(lang.dtype, "to_ir", to_ir)

    return patch_lang_core
