"""Packed weight layouts of the weight-only quantized GEMMs, and converters into them.

kernelab int4 layout (``w4a16_gemm``), for a weight of K input and N output features:

- ``qweight``: uint8 [K // 2, N]. Byte (i, n) holds the 4-bit codes of rows k = 2i (low
  nibble) and k = 2i + 1 (high nibble) of column n. N is the contiguous dimension, so a row of
  bytes is a coalesced read across output features.
- ``scales``: [K // G, N] in the activation dtype (float16 or bfloat16), G = group size
  (64 or 128): one scale per group of G consecutive k per column.
- ``zeros``: uint8 [K // G, N], the zero point of each group, an integer code 0..15.
- The weight is ``W[k, n] = (q[k, n] − zeros[k // G, n]) · scales[k // G, n]`` and the layer
  computes ``x @ W`` (W is the transpose of the nn.Linear weight).

kernelab int8 layout (``w8a16_gemm``): ``qweight`` int8 [K, N] and one scale per output
column, ``scales`` [N]; ``W[k, n] = q[k, n] · scales[n]`` (symmetric, no zero point).

Converters: from a float weight (round to nearest, asymmetric min/max groups for int4,
symmetric absmax per column for int8), and from AWQ- and GPTQ-style checkpoints, which pack
eight 4-bit codes into each int32:

- AWQ (``qweight`` int32 [K, N // 8]): word (k, j) holds columns 8j..8j+7 in the nibble order
  0, 2, 4, 6, 1, 3, 5, 7 (nibble p, bits 4p..4p+3, holds column 8j + AWQ_ORDER[p]);
  ``qzeros`` int32 [K // G, N // 8] packed the same way; ``scales`` [K // G, N].
- GPTQ (``qweight`` int32 [K // 8, N]): word (i, n) holds rows 8i..8i+7 in order (nibble p
  holds row 8i + p); ``qzeros`` int32 [K // G, N // 8] packed along N in order, storing
  ``zero − 1`` (the original GPTQ convention, ``zero_offset=1``); ``scales`` [K // G, N];
  only checkpoints without activation reordering (``g_idx`` equal to k // G) are accepted.

Every ``pack_*`` has an ``unpack_*`` inverse; the round trip returns the same integers.

Block-scaled float8 weights (``fp8_block_gemm``, DeepSeek-V3's layout): ``values`` e4m3
[N, K] (the nn.Linear weight's own layout) and float32 ``scales`` [⌈N/128⌉, ⌈K/128⌉], one per
128 × 128 block, ``W[n, k] = values[n, k] · scales[n // 128, k // 128]`` (the last blocks
shorter when N or K is not a multiple of 128). ``quantize_fp8_block`` makes them from a float
weight: each block's max|w| maps to the format's largest value, optionally rounded up to a
power of two (``ue8m0``). A stack of expert weights [E, N, K] (``fused_moe_fp8``):
``quantize_fp8_block_experts``, scales [E, ⌈N/128⌉, ⌈K/128⌉].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core.runtime import check as _check
from kernelab.core.runtime import fp8 as _fp8

GROUP_SIZES = (64, 128)
#: Nibble p of an AWQ word holds column 8j + AWQ_ORDER[p].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class Int4Weight:
    """An int4 weight in the kernelab layout (see the module docstring)."""

    qweight: torch.Tensor  # uint8 [K // 2, N]
    scales: torch.Tensor  # [K // G, N]
    zeros: torch.Tensor  # uint8 [K // G, N]
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        """(K, N)."""
        return self.qweight.shape[0] * 2, self.qweight.shape[1]

    def dequantize(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return dequantize_int4(self.qweight, self.scales, self.zeros, self.group_size, dtype)


def _codes(name: str, q: torch.Tensor, bits: int) -> None:
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(q).__name__}")
    if q.dtype.is_floating_point or q.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor of codes, got {q.dtype}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) >= 1 << bits):
        raise ValueError(
            f"{name}: expected codes in [0, {(1 << bits) - 1}], "
            f"got values in [{int(q.min())}, {int(q.max())}]"
        )


def check_zero_points(name: str, zeros: torch.Tensor) -> None:
    """int4 zero points are codes too (0..15): the kernels subtract one from codes in int32 and
    the torch path in the activations' dtype, so a zero point past 15 is no int4 weight and the
    two disagree on it. Reads the values (a device sync where the tensor is on one)."""
    if zeros.numel():
        top = int(zeros.max())
        if top > 15:
            raise ValueError(f"{name}: expected int4 zero points in [0, 15], got a {top}")


def check_scales(name: str, scale: torch.Tensor) -> None:
    """Scales multiply every product they reach: each must be finite and above zero (a zero
    or NaN one silently zeroes or poisons its rows, a negative one flips their sign). Reads
    the values (a device sync where the tensor is on one)."""
    if scale.numel() and scale.device.type != "meta":
        flat = scale.reshape(-1)
        bad = ~(torch.isfinite(flat) & (flat > 0))
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            at = f" at index {i}" if flat.numel() > 1 else ""
            raise ValueError(f"{name}: expected finite positive scales, got {float(flat[i])}{at}")


def check_group_size(group_size: int, k: int) -> None:
    _check.integer("group_size", group_size)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size: expected one of {GROUP_SIZES}, got {group_size!r}")
    if k % group_size:
        raise ValueError(f"K: expected a multiple of group_size={group_size}, got {k}")


# --- the kernelab int4 layout -----------------------------------------------------------------


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes [K, N] (integers 0..15, K even) → uint8 [K // 2, N]; row 2i low, 2i + 1 high."""
    _codes("q", q, 4)
    if q.dim() != 2 or q.shape[0] % 2:
        raise ValueError(f"q: expected a [K, N] tensor with K even, got shape {tuple(q.shape)}")
    q = q.to(torch.uint8)
    return (q[0::2] | (q[1::2] << 4)).contiguous()


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [K // 2, N] → codes uint8 [K, N] (inverse of ``pack_int4``)."""
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise TypeError(f"qweight: expected a 2-D uint8 tensor, got {qweight.dtype} "
                        f"{tuple(qweight.shape)}")  # fmt: skip
    lo, hi = qweight & 0xF, qweight >> 4
    return torch.stack((lo, hi), dim=1).reshape(-1, qweight.shape[1])


def dequantize_int4(qweight, scales, zeros, group_size, dtype=torch.float64) -> torch.Tensor:
    """The [K, N] weight (q − zero) · scale, computed in ``dtype``."""
    _check.integer("group_size", group_size)
    q = unpack_int4(qweight).to(dtype)
    s = scales.to(dtype).repeat_interleave(group_size, dim=0)
    z = zeros.to(dtype).repeat_interleave(group_size, dim=0)
    return (q - z) * s


def quantize_int4(
    w: torch.Tensor, group_size: int = 128, dtype: torch.dtype | None = None
) -> Int4Weight:
    """Asymmetric round-to-nearest int4 of a float weight ``w`` [K, N] (transpose an nn.Linear
    weight first), per group of ``group_size`` rows per column. Scales are stored in ``dtype``
    (default: ``w``'s dtype) and the codes are computed with the stored scales."""
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 2:
        raise TypeError(f"w: expected a 2-D float tensor [K, N], got {type(w).__name__}")
    k, n = w.shape
    check_group_size(group_size, k)
    dtype = dtype or w.dtype
    g = w.to(torch.float32).reshape(k // group_size, group_size, n)
    lo, hi = g.amin(dim=1), g.amax(dim=1)
    scale = ((hi - lo) / 15).clamp_min(1e-8).to(dtype)
    s = scale.to(torch.float32)
    zero = torch.round(-lo / s).clamp(0, 15)
    q = torch.round(g / s[:, None, :]) + zero[:, None, :]
    q = q.clamp(0, 15).to(torch.uint8).reshape(k, n)
    return Int4Weight(pack_int4(q), scale.contiguous(), zero.to(torch.uint8), group_size)


# --- AWQ and GPTQ checkpoints -----------------------------------------------------------------


def _pack_words(codes: torch.Tensor, order) -> torch.Tensor:
    """Codes [..., 8·W] → int32 [..., W]; nibble p takes code index order[p] of each 8."""
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], -1, 8)
    word = torch.zeros(c.shape[:-1], dtype=torch.int64, device=codes.device)
    for p, idx in enumerate(order):
        word |= c[..., idx] << (4 * p)
    return _to_int32(word)


def _unpack_words(words: torch.Tensor, order) -> torch.Tensor:
    """int32 [..., W] → codes uint8 [..., 8·W] (inverse of ``_pack_words``)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty((*words.shape, 8), dtype=torch.uint8, device=words.device)
    for p, idx in enumerate(order):
        out[..., idx] = ((w >> (4 * p)) & 0xF).to(torch.uint8)
    return out.reshape(*words.shape[:-1], -1)


def _to_int32(word: torch.Tensor) -> torch.Tensor:
    return torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)


def _int32(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 2:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name}: expected a 2-D int32 tensor of packed codes, got {got}")


def pack_awq(q: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [K, N] and zero points [K // G, N] → AWQ (qweight [K, N // 8], qzeros)."""
    _codes("q", q, 4)
    _codes("zeros", zeros, 4)
    return _pack_words(q, AWQ_ORDER), _pack_words(zeros, AWQ_ORDER)


def unpack_awq(qweight: torch.Tensor, qzeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ words → codes [K, N] and zero points [K // G, N], uint8."""
    _int32("qweight", qweight)
    _int32("qzeros", qzeros)
    return _unpack_words(qweight, AWQ_ORDER), _unpack_words(qzeros, AWQ_ORDER)


def pack_gptq(q: torch.Tensor, zeros: torch.Tensor, zero_offset: int = 1):
    """Codes [K, N] and zeros [K // G, N] → GPTQ (qweight [K // 8, N], qzeros [K // G, N // 8])
    with ``zero − zero_offset`` stored (wrapping modulo 16, as GPTQ's packer does)."""
    _codes("q", q, 4)
    _codes("zeros", zeros, 4)
    zero_offset = _check.integer("zero_offset", zero_offset)
    seq = tuple(range(8))
    qweight = _pack_words(q.t(), seq).t().contiguous()
    stored = (zeros.to(torch.int64) - zero_offset) & 0xF
    return qweight, _pack_words(stored, seq)


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, zero_offset: int = 1):
    """GPTQ words → codes [K, N] and zero points [K // G, N], uint8 (inverse of pack_gptq)."""
    _int32("qweight", qweight)
    _int32("qzeros", qzeros)
    zero_offset = _check.integer("zero_offset", zero_offset)
    seq = tuple(range(8))
    q = _unpack_words(qweight.t(), seq).t().contiguous()
    zeros = ((_unpack_words(qzeros, seq).to(torch.int64) + zero_offset) & 0xF).to(torch.uint8)
    return q, zeros


def _from_codes(q, zeros, scales, group_size) -> Int4Weight:
    k, n = q.shape
    check_group_size(group_size, k)
    if tuple(zeros.shape) != (k // group_size, n) or tuple(scales.shape) != (k // group_size, n):
        raise ValueError(
            f"scales: expected shape {(k // group_size, n)} (K // group_size, N) like the "
            f"zeros, got scales {tuple(scales.shape)} and zeros {tuple(zeros.shape)}"
        )
    return Int4Weight(pack_int4(q), scales.contiguous(), zeros.contiguous(), group_size)


def from_awq(qweight, qzeros, scales, group_size: int) -> Int4Weight:
    """An AWQ checkpoint's (qweight, qzeros, scales) in the kernelab int4 layout."""
    q, zeros = unpack_awq(qweight, qzeros)
    return _from_codes(q, zeros, scales, group_size)


def from_gptq(qweight, qzeros, scales, group_size: int, g_idx=None, zero_offset: int = 1):
    """A GPTQ checkpoint (without activation reordering) in the kernelab int4 layout."""
    _check.integer("group_size", group_size)
    q, zeros = unpack_gptq(qweight, qzeros, zero_offset)
    if g_idx is not None:
        expected = torch.arange(q.shape[0], device=g_idx.device) // group_size
        if g_idx.shape != expected.shape or not torch.equal(g_idx.to(expected.dtype), expected):
            raise ValueError(
                "g_idx: expected k // group_size for every row (no activation reordering); "
                "reordered checkpoints must be permuted first"
            )
    return _from_codes(q, zeros, scales, group_size)


# --- int8 --------------------------------------------------------------------------------------


def quantize_int8(w: torch.Tensor, dtype: torch.dtype | None = None):
    """Symmetric per-column int8 of ``w`` [K, N]: returns (qweight int8 [K, N], scales [N])."""
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 2:
        raise TypeError(f"w: expected a 2-D float tensor [K, N], got {type(w).__name__}")
    dtype = dtype or w.dtype
    scale = (w.to(torch.float32).abs().amax(dim=0) / 127).clamp_min(1e-8).to(dtype)
    q = torch.round(w.to(torch.float32) / scale.to(torch.float32)).clamp(-127, 127)
    return q.to(torch.int8).contiguous(), scale.contiguous()


def dequantize_int8(qweight, scales, dtype=torch.float64) -> torch.Tensor:
    return qweight.to(dtype) * scales.to(dtype)[None, :]


# --- block-scaled float8 --------------------------------------------------------------------

#: Rows and columns of a weight's scale block (DeepSeek-V3's 128 × 128).
FP8_BLOCK = 128


def _pow2_ceil(scale: torch.Tensor) -> torch.Tensor:
    """The smallest power of two ≥ each (positive, finite) scale, exactly (frexp's exponent)."""
    mantissa, exponent = torch.frexp(scale)
    up = torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).to(exponent.dtype))
    return torch.where(torch.isfinite(scale), up, scale)


def _blocks(w: torch.Tensor, block: int) -> torch.Tensor:
    """w [N, K] zero-padded to whole blocks, as [N/b, b, K/b, b]."""
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    w = torch.nn.functional.pad(w, (0, kb * block - k, 0, nb * block - n))
    return w.reshape(nb, block, kb, block)


def quantize_fp8_block(
    w: torch.Tensor, fp8_dtype: torch.dtype | None = None, ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values e4m3 [N, K], float32 scales [⌈N/128⌉, ⌈K/128⌉]) of a float weight [N, K].

    scale = max(max|block| / FP8_MAX, MIN_SCALE) per 128 × 128 block (a power of two at or
    above it with ``ue8m0``); values = e4m3(clamp(w / scale, ±FP8_MAX)), rounded to nearest
    even, computed in float32.
    """
    _check.tensor("w", w, dtypes=_check.FLOATS, ndim=2)
    fp8_dtype = fp8_dtype or _fp8.FP8_DTYPES[0]
    _fp8.check_dtype("fp8_dtype", fp8_dtype)
    _check.boolean("ue8m0", ue8m0)
    n, k = w.shape
    top = torch.finfo(fp8_dtype).max
    blocks = _blocks(w.to(torch.float32), FP8_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)) if blocks.numel() else blocks.new_zeros(blocks.shape[::2])
    scales = (amax / top).clamp_min(_fp8.MIN_SCALE)
    if ue8m0:
        scales = _pow2_ceil(scales)
    q = (blocks / scales[:, None, :, None]).clamp(-top, top).to(fp8_dtype)
    nb, _, kb, _ = blocks.shape
    values = q.reshape(nb * FP8_BLOCK, kb * FP8_BLOCK)[:n, :k].contiguous()
    return values, scales.contiguous()


def dequantize_fp8_block(values, scales, dtype=torch.float64) -> torch.Tensor:
    """values · scales expanded over their 128 × 128 blocks, [N, K] in ``dtype``."""
    n, k = values.shape
    full = scales.to(dtype).repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    return values.to(dtype) * full[:n, :k]


def quantize_fp8_block_experts(
    w: torch.Tensor, fp8_dtype: torch.dtype | None = None, ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """A stack of expert weights [E, N, K] (nn.Linear layout per expert) → (values e4m3
    [E, N, K], float32 scales [E, ⌈N/128⌉, ⌈K/128⌉]), each expert as ``quantize_fp8_block``
    (a gate+up weight [2I, H] is quantized as one matrix: its blocks run across the two
    halves when I is not a multiple of 128)."""
    _check.tensor("w", w, dtypes=_check.FLOATS, ndim=3)
    parts = [quantize_fp8_block(w[e], fp8_dtype, ue8m0) for e in range(w.shape[0])]
    if not parts:
        fp8_dtype = fp8_dtype or _fp8.FP8_DTYPES[0]
        _, n, k = w.shape
        nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
        return torch.empty(w.shape, dtype=fp8_dtype, device=w.device), w.new_empty(
            (0, nb, kb), dtype=torch.float32
        )
    return torch.stack([v for v, _ in parts]), torch.stack([s for _, s in parts])


def dequantize_fp8_block_experts(values, scales, dtype=torch.float64) -> torch.Tensor:
    """[E, N, K] in ``dtype``: each expert as ``dequantize_fp8_block``."""
    return (
        torch.stack(
            [dequantize_fp8_block(values[e], scales[e], dtype) for e in range(values.shape[0])]
        )
        if values.shape[0]
        else torch.empty(values.shape, dtype=dtype, device=values.device)
    )


# --- microscaling formats (mxfp4, mxfp8) ----------------------------------------------------
#
# OCP Microscaling Formats (MX) v1.0: a block of 32 consecutive values along K shares one
# power-of-two scale, stored as its biased exponent (ue8m0: byte s means 2^(s − 127)).
#
# - mxfp4: values e2m1 (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}), two per byte along K, element 2i in the
#   low nibble and 2i + 1 in the high nibble (the order Triton's tl.dot_scaled and the tensor
#   cores read); a weight [N, K] is uint8 [N, K/2] with scales uint8 [N, K/32].
# - mxfp8: values e4m3 [N, K] with the same scales.
# - a stack of mxfp4 expert weights [E, N, K] (``fused_moe_mxfp4``): values [E, N, K/2],
#   scales [E, N, K/32] (``quantize_mxfp4_experts``).
#
# Quantization (the spec's rule): the block's shared exponent is ⌊log2 max|x|⌋ − emax, emax the
# element format's largest exponent (2 for e2m1, 8 for e4m3); values x / 2^exponent rounded to
# nearest even in the element format, saturating at its largest magnitude (6 or 448); a block
# holding NaN or Inf gets the NaN scale byte 255. The division by a power of two is exact, so
# the result is the same computed in any precision.

MX_BLOCK = 32
#: The ue8m0 byte that means NaN: the whole block reads as NaN (the spec's rule for a block
#: holding NaN or Inf, as e2m1 has neither).
MX_NAN_SCALE = 255
MX_FORMATS = ("mxfp4", "mxfp8")
#: The largest exponent of the element format (e2m1: 6 = 1.5 · 2^2; e4m3: 448 = 1.75 · 2^8).
MX_EMAX = {"mxfp4": 2, "mxfp8": 8}
#: e2m1 code → magnitude (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: Midpoints between neighbouring e2m1 magnitudes, and whether a tie rounds up (to the even
#: code above) or down: 0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4.
E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
                  (3.5, True), (5.0, False))  # fmt: skip


def check_mx_format(fmt: str) -> None:
    if fmt not in MX_FORMATS:
        hint = " (nvfp4 is quantize_nvfp4 and nvfp4_gemm)" if fmt == "nvfp4" else ""
        raise ValueError(f"fmt: expected one of {MX_FORMATS}, got {fmt!r}{hint}")


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8) of ``y``, rounded to nearest even, saturating at ±6."""
    ay = y.abs()
    code = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for mid, tie_up in E2M1_MIDPOINTS:
        code += (ay >= mid if tie_up else ay > mid).to(torch.uint8)
    return code | ((y < 0).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes → [..., K/2] bytes, element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes → [..., K] codes (the inverse of ``pack_fp4``)."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def _mx_shared_exponent(xb: torch.Tensor, fmt: str) -> torch.Tensor:
    """The biased scale byte (int32) of each block of ``xb`` [..., blocks, 32]: ⌊log2 amax⌋ + 127
    − emax, at least 0 (a block of zeros, or of values too small for any scale, gets 0); a
    block holding NaN or Inf gets ``MX_NAN_SCALE``."""
    amax = xb.abs().amax(dim=-1)
    _, exponent = torch.frexp(amax.to(torch.float32))  # amax = m · 2^e, 0.5 ≤ m < 1
    biased = exponent.to(torch.int32) - 1 + 127 - MX_EMAX[fmt]
    biased = torch.where(amax > 0, biased.clamp(0, 254), torch.zeros_like(biased))
    return torch.where(torch.isfinite(amax), biased, torch.full_like(biased, MX_NAN_SCALE))


def quantize_mx(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, scales) of a float [rows, K] in an MX format (K a multiple of 32): mxfp4 values
    uint8 [rows, K/2], mxfp8 values float8_e4m3fn [rows, K]; scales uint8 [rows, K/32]."""
    check_mx_format(fmt)
    _check.tensor("x", x, dtypes=(*_check.FLOATS, torch.float64), ndim=2)
    rows, k = x.shape
    if k % MX_BLOCK:
        raise ValueError(f"x: K = {k} is not a multiple of the {MX_BLOCK}-value scale block")
    xb = x.to(torch.float64).reshape(rows, k // MX_BLOCK, MX_BLOCK)
    scale = _mx_shared_exponent(xb, fmt)
    y = xb * torch.exp2((127 - scale.clamp(max=254)).to(torch.float64))[..., None]  # exact
    if fmt == "mxfp4":
        values = pack_fp4(e2m1_codes(y).reshape(rows, k))
    else:
        top = torch.finfo(torch.float8_e4m3fn).max
        values = y.clamp(-top, top).to(torch.float32).to(torch.float8_e4m3fn).reshape(rows, k)
    return values, scale.to(torch.uint8)


def dequantize_mx(values, scales, fmt: str, dtype=torch.float64) -> torch.Tensor:
    """values · 2^(scale − 127) per 32-value block, [rows, K] in ``dtype``."""
    check_mx_format(fmt)
    v = e2m1_values(unpack_fp4(values), dtype) if fmt == "mxfp4" else values.to(dtype)
    factor = torch.exp2(scales.to(dtype) - 127)
    factor = torch.where(scales == MX_NAN_SCALE, torch.nan, factor)
    return v * factor.repeat_interleave(MX_BLOCK, dim=-1)


def quantize_mxfp4_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stack of expert weights [E, N, K] (nn.Linear layout per expert, K a multiple of 32) →
    (values uint8 [E, N, K/2], scales uint8 [E, N, K/32]) in mxfp4: every row of every expert
    as ``quantize_mx(·, "mxfp4")`` (a scale block never spans two rows, so a gate+up weight
    [2I, H] quantizes as its two halves would)."""
    _check.tensor("w", w, dtypes=(*_check.FLOATS, torch.float64), ndim=3)
    e, n, k = w.shape
    if k % MX_BLOCK:
        raise ValueError(f"w: K = {k} is not a multiple of the {MX_BLOCK}-value scale block")
    values, scales = quantize_mx(w.reshape(e * n, k), "mxfp4")
    return values.reshape(e, n, k // 2), scales.reshape(e, n, k // MX_BLOCK)


def dequantize_mxfp4_experts(values, scales, dtype=torch.float64) -> torch.Tensor:
    """[E, N, K] in ``dtype``: each expert as ``dequantize_mx(·, "mxfp4")``."""
    return dequantize_mx(values, scales, "mxfp4", dtype)


# --- nvfp4 ----------------------------------------------------------------------------------
#
# NVIDIA's nvfp4: e2m1 values packed as mxfp4's (two per byte along K, element 2i in the low
# nibble), one e4m3 scale per 16 consecutive values along K (float8_e4m3fn [rows, K/16]), and a
# per-tensor float32 scale g: the value is e2m1 · scale · g. g puts the tensor's largest block
# scale at e4m3's top, g = max|x| / (448 · 6) (``nvfp4_global_scale``).
#
# Quantization, each step a float32 operation rounded to nearest even, the same in the GEMM's
# kernel for its on-the-fly activations: per block, s = e4m3(min(amax / (g · 6), 448)) (a block
# holding NaN or Inf gets the NaN scale); then q = e2m1(x / (s · g)), saturating at ±6 (0 where
# s · g is 0: a block of zeros, or one too small for any e4m3 scale).

NV_BLOCK = 16
#: e4m3's largest value (the largest block scale) times e2m1's (the largest value).
NV_RANGE = 448.0 * 6.0


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """float32 0-dim tensor max|x| / (448 · 6), or 1 where max|x| is 0 or not finite."""
    _check.tensor("x", x, dtypes=(*_check.FLOATS, torch.float64))
    amax = x.abs().amax().to(torch.float32) if x.numel() else x.new_zeros((), dtype=torch.float32)
    g = amax / NV_RANGE
    return torch.where((g > 0) & torch.isfinite(g), g, torch.ones_like(g))


def check_global_scale(name: str, g) -> torch.Tensor:
    """A one-element float tensor (float32 in use; float64 in the reference), as float32."""
    if not isinstance(g, torch.Tensor) or not g.is_floating_point() or g.numel() != 1:
        got = f"{g.dtype} {tuple(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
        raise TypeError(f"{name}: expected a one-element float32 tensor, got {got}")
    return g.to(torch.float32)


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | None = None):
    """(values uint8 [rows, K/2], scales float8_e4m3fn [rows, K/16], global_scale float32 0-dim)
    of a float [rows, K], K a multiple of 16, by the rule above; ``global_scale`` defaults to
    ``nvfp4_global_scale(x)`` (pass a calibrated one for activations)."""
    _check.tensor("x", x, dtypes=(*_check.FLOATS, torch.float64), ndim=2)
    rows, k = x.shape
    if k % NV_BLOCK:
        raise ValueError(f"x: K = {k} is not a multiple of the {NV_BLOCK}-value scale block")
    if global_scale is None:
        global_scale = nvfp4_global_scale(x)
    g = check_global_scale("global_scale", global_scale).to(x.device).reshape(())
    if not (bool(torch.isfinite(g)) and float(g) > 0):
        raise ValueError(f"global_scale: expected a positive finite scale, got {float(g)}")
    xb = x.to(torch.float32).reshape(rows, k // NV_BLOCK, NV_BLOCK)
    amax = xb.abs().amax(dim=-1) if xb.numel() else xb.new_zeros(xb.shape[:-1])
    t = (amax / (g * 6.0)).clamp(max=448.0)
    t = torch.where(torch.isfinite(amax), t, torch.nan)
    scales = t.to(torch.float8_e4m3fn)
    sg = scales.to(torch.float32) * g
    y = torch.where(sg[..., None] > 0, xb / sg[..., None], torch.zeros_like(xb))
    values = pack_fp4(e2m1_codes(y).reshape(rows, k))
    return values, scales, g.clone()


def dequantize_nvfp4(values, scales, global_scale, dtype=torch.float64) -> torch.Tensor:
    """e2m1 · scale · global_scale per 16-value block, [rows, K] in ``dtype`` (exact in
    float64)."""
    g = check_global_scale("global_scale", global_scale).to(values.device, dtype).reshape(())
    v = e2m1_values(unpack_fp4(values), dtype)
    return v * (scales.to(dtype) * g).repeat_interleave(NV_BLOCK, dim=-1)
