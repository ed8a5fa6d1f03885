"""Microscaled GEMM: mxfp4 or mxfp8 weights (OCP MX v1.0), bfloat16 out, through tl.dot_scaled.

    out = a' @ dequant(b)ᵀ,   dequant(b)[n, k] = value(b[n, k]) · 2^(b_scale[n, k // 32] − 127)

``b`` is the nn.Linear weight [N, K] in an MX format (``packing.quantize_mx``): ``"mxfp4"``
uint8 [N, K/2], two e2m1 values per byte along K (element 2i in the low nibble), or
``"mxfp8"`` float8_e4m3fn [N, K]; ``b_scale`` uint8 [N, K/32] holds each 32-value block's
power-of-two scale as its biased exponent (ue8m0). ``a`` is bfloat16 [M, K]: used as it is
(weight-only, ``quantize_a=False``) or quantized to the weight's format on the fly, inside the
kernel, by the same rule as ``packing.quantize_mx`` (``quantize_a=True``; then ``a'`` is that
quantize-dequantize of ``a`` and the reference says so). K must be a multiple of 32: the
weight's scale blocks are whole (an error otherwise; pad the weight's K with zeros).

On sm_100, ``tl.dot_scaled`` is the block-scaled tensor-core MMA (tcgen05); on sm_90, sm_80
and gfx942 Triton emulates it by upcasting the operands to bfloat16 and multiplying on the
ordinary tensor cores (``kernelab inspect`` tells which it found). nvfp4 (e4m3 scales per 16
values and a per-tensor scale) is its own op, ``nvfp4_gemm``.

The ladder: ``_mx_gemm_kernel`` → ``mx_gemm_triton`` → ``mx_gemm``; ``mx_gemm_ref`` (float64
on the dequantized operands) and ``mx_gemm_torch`` (eager, float32) beside it.
"""

from __future__ import annotations

import torch

from kernelab.core import Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul._kernels import _mx_gemm_kernel
from kernelab.ops.matmul._packing import (
    MX_BLOCK,
    check_mx_format,
    dequantize_mx,
    quantize_mx,
)

# --- launch heuristics as data ----------------------------------------------------------------


class MxConfig(gc.ScaledTileConfig):
    """Tiles of the microscaled kernel (scale blocks of 32 values); see ``ScaledTileConfig``."""


# --- reference, eager, launcher ---------------------------------------------------------------


def mx_gemm_ref(a, b, b_scale, fmt="mxfp4", quantize_a=False, out=None):
    """a' @ dequant(b)ᵀ in a's dtype (exact in float64), a' = a or its MX quantize-dequantize."""
    if quantize_a:
        a = dequantize_mx(*quantize_mx(a, fmt), fmt, a.dtype)
    y = a @ dequantize_mx(b, b_scale, fmt, a.dtype).t()
    return y if out is None else out.copy_(y)


def mx_gemm_torch(a, b, b_scale, fmt="mxfp4", quantize_a=False, out=None):
    """Eager PyTorch: dequantize to float32, matmul, round to bfloat16."""
    _validate(a, b, b_scale, fmt, quantize_a, out)
    y = mx_gemm_ref(a.float(), b, b_scale, fmt, quantize_a).to(torch.bfloat16)
    return y if out is None else out.copy_(y)


def _validate(a, b, b_scale, fmt, quantize_a, out):
    check_mx_format(fmt)
    _check.boolean("quantize_a", quantize_a)
    _check.tensor("a", a, dtypes=(torch.bfloat16,), ndim=2)
    m, k = a.shape
    if k % MX_BLOCK:
        raise ValueError(f"a: K = {k} is not a multiple of the {MX_BLOCK}-value scale block")
    if fmt == "mxfp4":
        _check.tensor("b", b, dtypes=(torch.uint8,), ndim=2, device=a.device)
        if b.shape[1] * 2 != k:
            raise ValueError(
                f"b: expected [N, K/2] = [N, {k // 2}] packed bytes, got {tuple(b.shape)}"
            )
    else:
        _check.tensor("b", b, dtypes=(torch.float8_e4m3fn,), ndim=2, device=a.device)
        if b.shape[1] != k:
            raise ValueError(f"b: expected [N, K] = [N, {k}], got {tuple(b.shape)}")
    n = b.shape[0]
    _check.tensor("b_scale", b_scale, dtypes=(torch.uint8,), ndim=2, device=a.device)
    _check.same_shape("b_scale", b_scale, (n, k // MX_BLOCK), "(N, K / 32)")
    if out is not None:
        _check.tensor("out", out, dtypes=(torch.bfloat16,), ndim=2, device=a.device)
        _check.same_shape("out", out, (m, n), "(M, N)")


def mx_gemm_triton(a, b, b_scale, fmt="mxfp4", quantize_a=False, out=None, config=None):
    _validate(a, b, b_scale, fmt, quantize_a, out)
    return _plan(a, b, b_scale, fmt, quantize_a, out, config).run()


def _plan(a, b, b_scale, fmt="mxfp4", quantize_a=False, out=None, config=None):
    """The launch of ``_mx_gemm_kernel`` for these (validated) arguments; nothing for an empty
    output."""
    m, k = a.shape
    n = b.shape[0]
    c = out if out is not None else torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return LaunchPlan(result=c)
    if k == 0:
        return LaunchPlan(result=c.zero_())
    cfg = config or MxConfig.default_for(m, n, k, torch.bfloat16, a.device)
    if cfg.block_k % MX_BLOCK:
        raise ValueError(f"config: block_k must be a multiple of {MX_BLOCK}, got {cfg.block_k}")
    call = KernelCall(
        _mx_gemm_kernel,
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
            M=m,
            N=n,
            K=k,
            **gc.tile_args(cfg),
            FP4=fmt == "mxfp4",
            QUANTIZE_A=bool(quantize_a),
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    return LaunchPlan((call,), c)


def mx_gemm(a, b, b_scale, fmt="mxfp4", quantize_a=False, out=None):
    """bfloat16 [M, N] = a' @ dequant(b)ᵀ; see the module docstring.

    a : bfloat16 [M, K], K a multiple of 32.
    b : the weight [N, K] in ``fmt``: "mxfp4" uint8 [N, K/2] or "mxfp8" float8_e4m3fn [N, K].
    b_scale : uint8 [N, K/32] ue8m0 scales. quantize_a : quantize ``a`` to ``fmt`` on the fly.
    out : optional bfloat16 [M, N].
    """
    if isinstance(a, torch.Tensor) and use_triton(a):
        return mx_gemm_triton(a, b, b_scale, fmt, quantize_a, out)
    return mx_gemm_torch(a, b, b_scale, fmt, quantize_a, out)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    # Decode weight-only in mxfp4 (the weight read is the cost); prefill with the activations
    # quantized too, in mxfp4 and mxfp8 (the tensor-core rate is the point).
    shapes = []
    for label, n, k, _ in gc.projections():
        for m in gc.GEMM_M:
            decode = m <= 16
            for fmt in ("mxfp4",) if decode else ("mxfp4", "mxfp8"):
                shapes.append(
                    Shape(
                        f"{label} {'decode' if decode else 'prefill'} M={m} {n}x{k} {fmt}"
                        + ("" if decode else " quantized a"),
                        {"M": m, "N": n, "K": k},
                        {"fmt": fmt, "quantize_a": not decode},
                        batch_dim="M",
                        reduce_to=dict(gc.INTERPRETER_DIMS),
                    )
                )
    return shapes


def _edge() -> list[Shape]:
    cases = [
        ("one row, one scale block", 1, 7, 32, {"fmt": "mxfp4"}),
        ("primes, K short of one tile", 7, 53, 96, {"fmt": "mxfp4"}),
        ("past one tile, quantized a", 70, 200, 320, {"fmt": "mxfp4", "quantize_a": True}),
        ("mxfp8 weight-only", 5, 130, 224, {"fmt": "mxfp8"}),
        ("mxfp8, quantized a", 33, 96, 256, {"fmt": "mxfp8", "quantize_a": True}),
        ("empty M", 0, 16, 64, {"fmt": "mxfp4"}),
    ]
    return [
        Shape(f"{label} {m}x{n}x{k}", {"M": m, "N": n, "K": k}, p, batch_dim="M")
        for label, m, n, k, p in cases
    ]


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    m, n, k = shape.dims["M"], shape.dims["N"], shape.dims["K"]
    fmt = shape.params.get("fmt", "mxfp4")
    quantize_a = bool(shape.params.get("quantize_a", False))
    fp4 = fmt == "mxfp4"
    if device.type == "meta":
        a = torch.empty((m, k), dtype=torch.bfloat16, device=device)
        b = torch.empty(
            (n, k // 2 if fp4 else k), dtype=torch.uint8 if fp4 else torch.float8_e4m3fn
        )
        b, b_scale = b.to(device), torch.empty((n, k // MX_BLOCK), dtype=torch.uint8, device=device)
    else:
        a = _inputs.randn((m, k), torch.bfloat16, device, gen, dist)
        w = _inputs.randn((n, k), torch.float32, device, gen, "normal") / max(1.0, k**0.5)
        # magnitudes that differ from block to block, so that a scale of the wrong block shows
        spread = _inputs.randn((n, k // MX_BLOCK), torch.float32, device, gen, "normal").exp()
        w = w * spread.repeat_interleave(MX_BLOCK, dim=1)
        b, b_scale = quantize_mx(w, fmt)
    return {"a": a, "b": b, "b_scale": b_scale, "fmt": fmt, "quantize_a": quantize_a}


def _cost(inputs: dict) -> Cost:
    a, b, s = inputs["a"], inputs["b"], inputs["b_scale"]
    m, k = a.shape
    n = b.shape[0]
    nbytes = 2 * m * k + b.numel() * b.element_size() + s.numel() + 2 * m * n
    # weight-only: the weights are upcast and multiplied in bfloat16
    compute = None
    if inputs.get("quantize_a"):
        compute = "float4_e2m1fn_x2" if inputs["fmt"] == "mxfp4" else "float8_e4m3fn"
    return Cost(flops=2 * m * n * k, bytes=nbytes, compute=compute)


MX_GEMM = register(
    Op(
        "mx_gemm",
        description="mxfp4/mxfp8 weights (ue8m0 scales per 32) through tl.dot_scaled, bf16 or "
        "on-the-fly quantized activations, bf16 out",
        reference=mx_gemm_ref,
        make_inputs=_make_inputs,
        sampling=gc.gemm_sampling(rows={"a": 0}, cols={"b": 0, "b_scale": 0}),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # the packed weight and its ue8m0 scales are prepared together: only a is data
        contract=Contract(reduction=gc.reduction_of("a"), data_inputs=("a",)),
        dtypes=(torch.bfloat16,),
        kernels=(_mx_gemm_kernel,),
        plan=_plan,
        tuning_space=gc.mnk_space(MxConfig),
    )
)
MX_GEMM.add_variant(
    Variant(
        "kernelab",
        mx_gemm_triton,
        "triton",
        description="tl.dot_scaled: native block-scaled MMA on sm_100, emulated elsewhere",
    )
)
MX_GEMM.add_torch(mx_gemm_torch)
