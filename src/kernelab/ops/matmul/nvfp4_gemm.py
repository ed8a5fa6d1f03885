"""nvfp4 GEMM: e2m1 weights with e4m3 scales per 16 values and a per-tensor scale, through
tl.dot_scaled, bfloat16 out.

    out = a' @ dequant(b)ᵀ,   dequant(b)[n, k] = e2m1(b[n, k]) · b_scale[n, k // 16] · b_global

``b`` is the nn.Linear weight [N, K] from ``packing.quantize_nvfp4``: uint8 [N, K/2], two e2m1
values per byte along K (element 2i in the low nibble), ``b_scale`` float8_e4m3fn [N, K/16] and
``b_global`` a one-element float32 tensor. ``a`` is bfloat16 [M, K]: used as it is (weight-only,
``quantize_a=False``) or quantized to nvfp4 on the fly, inside the kernel, by
``packing.quantize_nvfp4``'s rule relative to the per-tensor scale ``a_global`` (a calibrated
one-element float32 tensor; None: ``packing.nvfp4_global_scale(a)``, one more pass over ``a``),
and then ``a'`` is that quantize-dequantize of ``a`` and the reference says so. K must be a
multiple of 16.

Its own op rather than a format of ``mx_gemm``: the per-tensor scales are arguments an MX
format does not have, and the scales are e4m3 values rather than ue8m0 exponents.

Triton 3.9 takes 16-value e4m3 scales in ``tl.dot_scaled`` (a float8e4nv scale tensor
[·, K/16]): on sm_100 with both operands nvfp4 it is the block-scaled tensor-core MMA
(``tcgen05.mma…kind::mxf4nvf4.block_scale.block16``); on sm_90 and gfx942, and weight-only on
every target, Triton converts the scales to bf16, scales the upcast operands (exactly: an e2m1
value times an e4m3 scale fits bf16) and runs an ordinary MMA (``kernelab inspect`` reports
which). sm_80 has no float8e4nv type: Triton rejects the kernel there. The per-tensor scales
multiply the float32 accumulator once, in the epilogue. Triton's interpreter reads e4m3 scales
as exponent bytes; kernelab's interpreter fix ``dot-scaled-e4m3-scales`` decodes them.

A block of ``a`` holding NaN or Inf gets e4m3's NaN scale, and its rows read as NaN: so the
interpreter and the emulated paths compute (a NaN scale converted to bf16); how sm_100's
block-scaled MMA reads a NaN e4m3 scale has not been measured here.

The ladder: ``_nvfp4_gemm_kernel`` → ``nvfp4_gemm_triton`` → ``nvfp4_gemm``; ``nvfp4_gemm_ref``
(float64 on the dequantized operands) and ``nvfp4_gemm_torch`` (eager, float32) beside it.
"""

from __future__ import annotations

import torch

from kernelab.core import Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul._kernels import _nvfp4_gemm_kernel
from kernelab.ops.matmul._packing import (
    NV_BLOCK,
    check_global_scale,
    check_scales,
    dequantize_nvfp4,
    nvfp4_global_scale,
    quantize_nvfp4,
)

# --- launch heuristics as data ----------------------------------------------------------------


class Nvfp4Config(gc.ScaledTileConfig):
    """Tiles of the nvfp4 kernel (scale blocks of 16 values); see ``ScaledTileConfig``."""


# --- reference, eager, launcher ---------------------------------------------------------------


def _quantized_a(a, a_global):
    """a's nvfp4 quantize-dequantize (float64) in a's dtype."""
    g = nvfp4_global_scale(a) if a_global is None else a_global
    return dequantize_nvfp4(*quantize_nvfp4(a, g), dtype=a.dtype)


def nvfp4_gemm_ref(a, b, b_scale, b_global, quantize_a=False, a_global=None, out=None, check=True):
    """a' @ dequant(b)ᵀ in a's dtype (exact in float64), a' = a or its nvfp4 quantize-dequantize."""
    if quantize_a:
        a = _quantized_a(a, a_global)
    y = a @ dequantize_nvfp4(b, b_scale, b_global, a.dtype).t()
    return y if out is None else out.copy_(y)


def nvfp4_gemm_torch(
    a, b, b_scale, b_global, quantize_a=False, a_global=None, out=None, check=True
):
    """Eager PyTorch in float32: the scaled e2m1 values multiplied, then the per-tensor scales
    (as the kernel orders them), rounded to bfloat16."""
    _validate(a, b, b_scale, b_global, quantize_a, a_global, out, check)
    g = b_global.float().reshape(())
    if quantize_a:
        ga = nvfp4_global_scale(a) if a_global is None else a_global.float().reshape(())
        values, scales, _ = quantize_nvfp4(a, ga)
        a = dequantize_nvfp4(values, scales, torch.ones((), device=a.device), torch.float32)
        g = g * ga
    w = dequantize_nvfp4(b, b_scale, torch.ones((), device=b.device), torch.float32)
    y = ((a.float() @ w.t()) * g).to(torch.bfloat16)
    return y if out is None else out.copy_(y)


def _validate(a, b, b_scale, b_global, quantize_a, a_global, out, check=True):
    """Shapes and dtypes from metadata; with ``check`` (a device sync), the global scales'
    values: finite and positive."""
    _check.boolean("quantize_a", quantize_a)
    _check.tensor("a", a, dtypes=(torch.bfloat16,), ndim=2)
    m, k = a.shape
    if k % NV_BLOCK:
        raise ValueError(f"a: K = {k} is not a multiple of the {NV_BLOCK}-value scale block")
    _check.tensor("b", b, dtypes=(torch.uint8,), ndim=2, device=a.device)
    if b.shape[1] * 2 != k:
        raise ValueError(f"b: expected [N, K/2] = [N, {k // 2}] packed bytes, got {tuple(b.shape)}")
    n = b.shape[0]
    _check.tensor("b_scale", b_scale, dtypes=(torch.float8_e4m3fn,), ndim=2, device=a.device)
    _check.same_shape("b_scale", b_scale, (n, k // NV_BLOCK), "(N, K / 16)")
    for name, g in (("b_global", b_global), ("a_global", a_global)):
        if g is None and name == "a_global":
            continue
        check_global_scale(name, g)
        _check.tensor(name, g, dtypes=(torch.float32,), device=a.device)
    if a_global is not None and not quantize_a:
        raise ValueError("a_global: the activation's scale is used only with quantize_a=True")
    if out is not None:
        _check.tensor("out", out, dtypes=(torch.bfloat16,), ndim=2, device=a.device)
        _check.same_shape("out", out, (m, n), "(M, N)")
    _check.boolean("check", check)
    if check:
        check_scales("b_global", b_global)
        if a_global is not None:
            check_scales("a_global", a_global)


def nvfp4_gemm_triton(
    a, b, b_scale, b_global, quantize_a=False, a_global=None, out=None, check=True, config=None
):
    _validate(a, b, b_scale, b_global, quantize_a, a_global, out, check)
    return _plan(a, b, b_scale, b_global, quantize_a, a_global, out, config).run()


def _plan(a, b, b_scale, b_global, quantize_a=False, a_global=None, out=None, config=None):
    """The launch of ``_nvfp4_gemm_kernel`` for these (validated) arguments; nothing for an
    empty output."""
    m, k = a.shape
    n = b.shape[0]
    c = out if out is not None else torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return LaunchPlan(result=c)
    if k == 0:
        return LaunchPlan(result=c.zero_())
    cfg = config or Nvfp4Config.default_for(m, n, k, torch.bfloat16, a.device)
    if cfg.block_k % 64:
        raise ValueError(f"config: block_k must be a multiple of 64, got {cfg.block_k}")
    if quantize_a and a_global is None:
        a_global = nvfp4_global_scale(a)
    call = KernelCall(
        _nvfp4_gemm_kernel,
        (gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n),),
        dict(
            C=c,
            stride_cm=c.stride(0),
            stride_cn=c.stride(1),
            A=a,
            stride_am=a.stride(0),
            stride_ak=a.stride(1),
            B=b,
            stride_bn=b.stride(0),
            stride_bk=b.stride(1),
            BS=b_scale,
            stride_bsn=b_scale.stride(0),
            stride_bsk=b_scale.stride(1),
            BG=b_global,
            AG=a_global if quantize_a else b_global,  # read only with QUANTIZE_A
            M=m,
            N=n,
            K=k,
            **gc.tile_args(cfg),
            QUANTIZE_A=bool(quantize_a),
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    return LaunchPlan((call,), c)


def nvfp4_gemm(a, b, b_scale, b_global, quantize_a=False, a_global=None, out=None, check=True):
    """bfloat16 [M, N] = a' @ dequant(b)ᵀ; see the module docstring.

    a : bfloat16 [M, K], K a multiple of 16.
    b, b_scale, b_global : the weight from ``packing.quantize_nvfp4`` (uint8 [N, K/2],
    float8_e4m3fn [N, K/16], float32 one element).
    quantize_a : quantize ``a`` to nvfp4 on the fly, relative to ``a_global`` (float32 one
    element; None: from ``a``'s max). out : optional bfloat16 [M, N].
    check : read ``b_global`` and ``a_global`` on the host, each finite and positive (a device
    sync; off for scales known good and inside a CUDA graph).
    """
    if isinstance(a, torch.Tensor) and use_triton(a):
        return nvfp4_gemm_triton(a, b, b_scale, b_global, quantize_a, a_global, out, check)
    return nvfp4_gemm_torch(a, b, b_scale, b_global, quantize_a, a_global, out, check)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    # Decode weight-only (the weight read is the cost); prefill with the activations quantized
    # too (the block-scaled tensor-core rate is the point).
    shapes = []
    for label, n, k, _ in gc.projections():
        for m in gc.GEMM_M:
            decode = m <= 16
            shapes.append(
                Shape(
                    f"{label} {'decode' if decode else 'prefill'} M={m} {n}x{k} nvfp4"
                    + ("" if decode else " quantized a"),
                    {"M": m, "N": n, "K": k},
                    {"quantize_a": not decode},
                    batch_dim="M",
                    reduce_to=dict(gc.INTERPRETER_DIMS),
                )
            )
    return shapes


def _edge() -> list[Shape]:
    cases = [
        ("one row, one scale block", 1, 7, 16, {}),
        ("primes, K short of one tile", 7, 53, 80, {}),
        ("past one tile, quantized a", 70, 200, 336, {"quantize_a": True}),
        ("one row, quantized a", 1, 24, 48, {"quantize_a": True}),
        ("empty M", 0, 16, 64, {}),
    ]
    return [
        Shape(f"{label} {m}x{n}x{k}", {"M": m, "N": n, "K": k}, p, batch_dim="M")
        for label, m, n, k, p in cases
    ]


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    m, n, k = shape.dims["M"], shape.dims["N"], shape.dims["K"]
    quantize_a = bool(shape.params.get("quantize_a", False))
    if device.type == "meta":
        a = torch.empty((m, k), dtype=torch.bfloat16, device=device)
        b = torch.empty((n, k // 2), dtype=torch.uint8, device=device)
        b_scale = torch.empty((n, k // NV_BLOCK), dtype=torch.float8_e4m3fn, device=device)
        b_global = torch.empty((), dtype=torch.float32, device=device)
        a_global = torch.empty((), dtype=torch.float32, device=device) if quantize_a else None
    else:
        a = _inputs.randn((m, k), torch.bfloat16, device, gen, dist)
        w = _inputs.randn((n, k), torch.float32, device, gen, "normal") / max(1.0, k**0.5)
        # magnitudes that differ from block to block, so that a scale of the wrong block shows
        spread = _inputs.randn((n, k // NV_BLOCK), torch.float32, device, gen, "normal").exp()
        w = w * spread.repeat_interleave(NV_BLOCK, dim=1)
        b, b_scale, b_global = quantize_nvfp4(w)
        # the activation's scale as calibration gives it: from the activations themselves
        a_global = nvfp4_global_scale(a) if quantize_a else None
    return {
        "a": a,
        "b": b,
        "b_scale": b_scale,
        "b_global": b_global,
        "quantize_a": quantize_a,
        "a_global": a_global,
    }


def _cost(inputs: dict) -> Cost:
    a, b, s = inputs["a"], inputs["b"], inputs["b_scale"]
    m, k = a.shape
    n = b.shape[0]
    nbytes = 2 * m * k + b.numel() + s.numel() + 4 + 2 * m * n
    if inputs.get("a_global") is not None:
        nbytes += 4
    # weight-only: the weights are upcast and multiplied in bfloat16
    compute = "float4_e2m1fn_x2" if inputs.get("quantize_a") else None
    return Cost(flops=2 * m * n * k, bytes=nbytes, compute=compute)


def _rows_independent(inputs: dict) -> bool:
    """Activations quantized without a given ``a_global`` take their scale from the whole
    tensor's amax: no output row is independent of the others then."""
    return not inputs.get("quantize_a") or inputs.get("a_global") is not None


NVFP4_GEMM = register(
    Op(
        "nvfp4_gemm",
        description="nvfp4 weights (e4m3 scales per 16, per-tensor scale) through "
        "tl.dot_scaled, bf16 or on-the-fly quantized activations, bf16 out",
        reference=nvfp4_gemm_ref,
        make_inputs=_make_inputs,
        sampling=gc.gemm_sampling(
            rows={"a": 0}, cols={"b": 0, "b_scale": 0}, applies=_rows_independent
        ),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        dtypes=(torch.bfloat16,),
        kernels=(_nvfp4_gemm_kernel,),
        plan=_plan,
        tuning_space=gc.mnk_space(Nvfp4Config),
        # the activations carry NaN and Inf; the prepared weight and its scales never do.
        # Only a is data: the packed weight, its e4m3 scales and b_global are made together,
        # and a_global is a calibration, not recomputed for each step's activations.
        contract=Contract(special_inputs=("a",), data_inputs=("a",)),
    )
)
NVFP4_GEMM.add_variant(
    Variant(
        "kernelab",
        nvfp4_gemm_triton,
        "triton",
        description="tl.dot_scaled with e4m3 scales per 16: native block-scaled MMA on sm_100 "
        "(both operands nvfp4), emulated elsewhere",
    )
)
NVFP4_GEMM.add_torch(nvfp4_gemm_torch)
