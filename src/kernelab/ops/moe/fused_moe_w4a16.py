"""The fused mixture-of-experts layer with int4 expert weights (weight-only, activations in
float16/bfloat16).

    out[t] = Σ_j topk_weights[t, j] · down_e(silu(gate_e(x[t])) ⊙ up_e(x[t])),  e = topk_ids[t, j]
    W[k, n] = (q[k, n] − zeros[k // G, n]) · scales[k // G, n]   per expert and projection

Each expert's weights are in the int4 layout of ``kernelab.ops.packing`` (as ``w4a16_gemm``):
``w1_qweight`` [E, H/2, 2I] (gate columns, then up), ``w1_scales`` / ``w1_zeros`` [E, H/G, 2I];
``w2_qweight`` [E, I/2, H], ``w2_scales`` / ``w2_zeros`` [E, I/G, H]; G = 64 or 128.
``quantize_experts`` makes them from [E, N, K] float weights. The grouped GEMM multiplies the
codes minus the zero points (exact in 16-bit floats) on tensor cores and scales each group's
float32 partial sum, as the w4a16 GEMM; the rest is ``fused_moe``'s path (see ``_common``).

The ladder: the kernels of ``fused_moe`` with constexpr W4 → ``fused_moe_w4a16_triton``
(validate, plan, launch) → ``fused_moe_w4a16`` (public), with ``fused_moe_w4a16_ref`` (float64
on the dequantized weights) and ``fused_moe_w4a16_torch`` (dequantize, the expert loop).
"""

from __future__ import annotations

import torch

from kernelab.core import Contract, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.moe import _common as mc
from kernelab.ops.moe import _spec as ms
from kernelab.ops.moe._kernels import _fused_moe_kernel, _moe_align_kernel, _moe_sum_kernel

MoEConfig = mc.MoEConfig


def _packing():
    from kernelab.ops import packing  # the int4 layout (imported on use: no import cycle)

    return packing


def quantize_experts(w: torch.Tensor, group_size: int = 128, dtype=None):
    """[E, N, K] float weights (nn.Linear layout per expert) → (qweight [E, K/2, N],
    scales [E, K/G, N], zeros [E, K/G, N]), each expert quantized as ``quantize_int4``."""
    _check.tensor("w", w, dtypes=(*_check.FLOATS, torch.float64), ndim=3)
    parts = [_packing().quantize_int4(w[e].t(), group_size, dtype) for e in range(w.shape[0])]
    return tuple(
        torch.stack([getattr(p, n) for p in parts]) for n in ("qweight", "scales", "zeros")
    )


# --- reference, eager, launcher, public function ----------------------------------------------


def _loop(
    x,
    w1_qweight,
    w1_scales,
    w1_zeros,
    w2_qweight,
    w2_scales,
    w2_zeros,
    topk_weights,
    topk_ids,
    group_size,
    out,
    held=None,
):
    deq = _packing().dequantize_int4

    def w1_of(e):
        return deq(w1_qweight[e], w1_scales[e], w1_zeros[e], group_size, x.dtype)

    def w2_of(e):
        return deq(w2_qweight[e], w2_scales[e], w2_zeros[e], group_size, x.dtype)

    return ms.expert_loop(x, topk_weights, topk_ids, w1_qweight.shape[0], w1_of, w2_of, out, held)


def fused_moe_w4a16_ref(
    x,
    w1_qweight,
    w1_scales,
    w1_zeros,
    w2_qweight,
    w2_scales,
    w2_zeros,
    topk_weights,
    topk_ids,
    group_size,
    check=True,
    out=None,
    intermediate_dtype=None,
):
    """The expert loop on the dequantized weights, in x's dtype (exact in float64), the
    intermediate silu(gate)·up rounded to ``intermediate_dtype`` when given (verify gives the
    activations' dtype: the kernels store it there)."""
    return _loop(
        x,
        w1_qweight,
        w1_scales,
        w1_zeros,
        w2_qweight,
        w2_scales,
        w2_zeros,
        topk_weights,
        topk_ids,
        group_size,
        out,
        intermediate_dtype,
    )


def fused_moe_w4a16_torch(
    x,
    w1_qweight,
    w1_scales,
    w1_zeros,
    w2_qweight,
    w2_scales,
    w2_zeros,
    topk_weights,
    topk_ids,
    group_size,
    check=True,
    out=None,
):
    """Eager PyTorch: dequantize each expert hit to x's dtype, then the expert loop."""
    _validate(
        x,
        w1_qweight,
        w1_scales,
        w1_zeros,
        w2_qweight,
        w2_scales,
        w2_zeros,
        topk_weights,
        topk_ids,
        group_size,
        check,
        out,
    )
    return _loop(
        x,
        w1_qweight,
        w1_scales,
        w1_zeros,
        w2_qweight,
        w2_scales,
        w2_zeros,
        topk_weights,
        topk_ids.long(),
        group_size,
        out,
    )


def _check_int4(prefix, q, s, z, k, n, e, x, group_size):
    _check.tensor(f"{prefix}_qweight", q, dtypes=(torch.uint8,), ndim=3, device=x.device)
    _check.same_shape(f"{prefix}_qweight", q, (e, k // 2, n), "E, K/2, N")
    groups = (e, k // group_size, n)
    _check.tensor(f"{prefix}_scales", s, dtypes=(x.dtype,), ndim=3, device=x.device)
    _check.same_shape(f"{prefix}_scales", s, groups, "E, K // group_size, N")
    _check.tensor(f"{prefix}_zeros", z, dtypes=(torch.uint8,), ndim=3, device=x.device)
    _check.same_shape(f"{prefix}_zeros", z, groups, "E, K // group_size, N")


def _validate(
    x,
    w1_qweight,
    w1_scales,
    w1_zeros,
    w2_qweight,
    w2_scales,
    w2_zeros,
    topk_weights,
    topk_ids,
    group_size,
    check,
    out,
) -> None:
    _check.tensor("x", x, dtypes=(torch.float16, torch.bfloat16), ndim=2)
    h = x.shape[1]
    _check.tensor("w1_qweight", w1_qweight, dtypes=(torch.uint8,), ndim=3, device=x.device)
    e, _, two_i = w1_qweight.shape
    if two_i % 2 or e < 1:
        raise ValueError(f"w1_qweight: expected (E >= 1, H/2, 2·I), got {tuple(w1_qweight.shape)}")
    i = two_i // 2
    packing = _packing()
    packing.check_group_size(group_size, h)
    packing.check_group_size(group_size, i)
    _check_int4("w1", w1_qweight, w1_scales, w1_zeros, h, two_i, e, x, group_size)
    _check_int4("w2", w2_qweight, w2_scales, w2_zeros, i, h, e, x, group_size)
    mc.validate_routing(x, topk_weights, topk_ids, e, check)
    if check:
        packing.check_zero_points("w1_zeros", w1_zeros)
        packing.check_zero_points("w2_zeros", w2_zeros)
    mc.validate_out(out, x, h)


def _plan(
    x,
    w1_qweight,
    w1_scales,
    w1_zeros,
    w2_qweight,
    w2_scales,
    w2_zeros,
    topk_weights,
    topk_ids,
    group_size,
    check=True,
    out=None,
    config=None,
):
    w1 = mc.ExpertWeights(w1_qweight, w1_scales, w1_zeros, group_size)
    w2 = mc.ExpertWeights(w2_qweight, w2_scales, w2_zeros, group_size)
    return mc.plan(
        x,
        w1,
        w2,
        topk_weights,
        topk_ids,
        experts=w1_qweight.shape[0],
        intermediate=w1_qweight.shape[2] // 2,
        out=out,
        config=config,
    )


def fused_moe_w4a16_triton(
    x,
    w1_qweight,
    w1_scales,
    w1_zeros,
    w2_qweight,
    w2_scales,
    w2_zeros,
    topk_weights,
    topk_ids,
    group_size,
    check=True,
    out=None,
    config=None,
):
    """Launch the Triton kernels (natively on GPUs, through the interpreter on CPU tensors)."""
    args = dict(locals())  # every argument by name, config last
    del args["config"]
    _validate(**args)
    return _plan(**args, config=config).run()


def fused_moe_w4a16(
    x,
    w1_qweight,
    w1_scales,
    w1_zeros,
    w2_qweight,
    w2_scales,
    w2_zeros,
    topk_weights,
    topk_ids,
    group_size,
    check=True,
    out=None,
):
    """x [T, H] through the int4 experts ``topk_ids`` picks → [T, H] in x's dtype (layouts in
    the module docstring). Triton on CUDA/ROCm; torch on CPU (interpreter with
    KERNELAB_INTERPRET=1)."""
    args = dict(locals())  # every argument by name
    if isinstance(x, torch.Tensor) and use_triton(x):
        return fused_moe_w4a16_triton(**args)
    return fused_moe_w4a16_torch(**args)


# --- the declaration ---------------------------------------------------------------------------


def _int4(e, n, k, group_size, dtype, device, gen):
    if device.type == "meta":
        u8 = dict(dtype=torch.uint8, device=device)
        g = (e, k // group_size, n)
        return (
            torch.empty((e, k // 2, n), **u8),
            torch.empty(g, dtype=dtype, device=device),
            torch.empty(g, **u8),
        )
    w = ms.dense_weight(e, n, k, torch.float32, device, gen)
    return quantize_experts(w, group_size, dtype)


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    d = shape.dims
    e, h, i = d["experts"], d["hidden"], d["intermediate"]
    g = shape.params.get("group_size", 128)
    weights, ids = ms.routing(shape, device, gen)
    q1, s1, z1 = _int4(e, 2 * i, h, g, dtype, device, gen)
    q2, s2, z2 = _int4(e, h, i, g, dtype, device, gen)
    return {
        "x": ms.activations(shape, dtype, device, gen, dist),
        "w1_qweight": q1,
        "w1_scales": s1,
        "w1_zeros": z1,
        "w2_qweight": q2,
        "w2_scales": s2,
        "w2_zeros": z2,
        "topk_weights": weights,
        "topk_ids": ids,
        "group_size": g,
        "check": True,
    }


def _cost(inputs: dict):
    """See ``_spec.cost``; an expert's weights at their packed width: 3·H·I/2 bytes of codes
    plus its scales and zero points."""
    x, e = inputs["x"], inputs["w1_qweight"].shape[0]
    i = inputs["w2_qweight"].shape[1] * 2
    per_expert = sum(
        inputs[n][0].numel() * inputs[n].element_size()
        for p in ("w1", "w2")
        for n in (f"{p}_qweight", f"{p}_scales", f"{p}_zeros")
    )
    return ms.cost(x, inputs["topk_ids"], e, i, per_expert)


def _edge() -> list[Shape]:
    return [s for s in ms.edge(64, group_size=64) if not s.params.get("shared")]


FUSED_MOE_W4A16 = register(
    Op(
        "fused_moe_w4a16",
        description="routed SwiGLU experts with int4 weights (group-wise scales, zero points)",
        reference=fused_moe_w4a16_ref,
        make_inputs=_make_inputs,
        shapes={
            "representative": lambda: [
                s for s in ms.representative(group_size=128) if not s.params.get("shared")
            ],
            "edge": _edge,
        },
        cost=_cost,
        # The default contract, from the very quantized weights the kernel reads (quantization
        # error is not compared), with the intermediate in x's dtype as the kernels store it.
        # NaN and Inf go into the activations.
        contract=Contract(
            special_inputs=("x",), data_inputs=("x", "topk_weights"), intermediate_dtype="x"
        ),
        dtypes=(torch.float16, torch.bfloat16),
        kernels=(_moe_align_kernel, _fused_moe_kernel, _moe_sum_kernel),
        plan=_plan,
        tuning_space=lambda shape, dtype: MoEConfig.tuning_space(
            shape.dims["tokens"] * shape.dims["topk"], shape.dims["experts"], w4=True
        ),
    )
)
FUSED_MOE_W4A16.add_variant(
    Variant(
        "kernelab",
        fused_moe_w4a16_triton,
        "triton",
        description="fused_moe's grouped GEMMs on int4 codes, scales per group of K",
    )
)
FUSED_MOE_W4A16.add_torch(fused_moe_w4a16_torch)
