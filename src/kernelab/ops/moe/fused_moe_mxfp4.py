"""The fused mixture-of-experts layer with mxfp4 expert weights (weight-only, activations in
float16/bfloat16: how gpt-oss's experts are served on GPUs without fp4 tensor cores).

    out[t] = Σ_j topk_weights[t, j] · down_e(silu(gate_e(x[t])) ⊙ up_e(x[t])),  e = topk_ids[t, j]
    W[n, k] = e2m1(values[n, k]) · 2^(scale[n, k // 32] − 127)   per expert and projection

Weights in the OCP MX layout of ``kernelab.ops.packing`` (as ``mx_gemm``'s), per expert the
nn.Linear layout [N, K] along K: ``w1`` uint8 [E, 2I, H/2] (two e2m1 values per byte, element
2i in the low nibble; gate rows, then up), ``w1_scale`` uint8 [E, 2I, H/32] (ue8m0, one per 32
values along K; 255 is NaN); ``w2`` uint8 [E, H, I/2], ``w2_scale`` uint8 [E, H, I/32]. H and
I must be multiples of 32. ``packing.quantize_mxfp4_experts`` makes them from [E, N, K] float
weights.

The grouped GEMM decodes each K step's bytes in registers to x's dtype, the 32-group's
power-of-two scale applied (exact in bfloat16; in float16 exact while the weight lies in its
range), and multiplies on tensor cores with float32 accumulation; the rest is ``fused_moe``'s
path (see ``_common``): the SiLU-gated product rounded once to x's dtype (the down GEMM's
16-bit operand: in float16 a value past 65504 is ±Inf there, as in every implementation that
stores it so; the reference rounds it there too), the routing weight applied in float32 after
the down projection, the k parts kept and summed in float32, one rounding to x's dtype.

The ladder: the kernels of ``fused_moe`` with constexpr MX4 → ``fused_moe_mxfp4_triton``
(validate, plan, launch) → ``fused_moe_mxfp4`` (public), with ``fused_moe_mxfp4_ref`` (the
expert loop on the dequantized weights; float64 as verify runs it) and
``fused_moe_mxfp4_torch`` (dequantize to x's dtype, the expert loop).
"""

from __future__ import annotations

import torch

from kernelab.core import Contract, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.triton import use_triton
from kernelab.ops import packing
from kernelab.ops.moe import _common as mc
from kernelab.ops.moe import _spec as ms
from kernelab.ops.moe._kernels import _fused_moe_kernel, _moe_align_kernel, _moe_sum_kernel

MoEConfig = mc.MoEConfig
MX_BLOCK = packing.MX_BLOCK

#: gpt-oss-120b's MoE layer (openai/gpt-oss-120b config.json: num_local_experts 128,
#: num_experts_per_tok 4, hidden_size 2880, intermediate_size 2880), with SiLU-gated experts in
#: place of its clamped SwiGLU with biases: its shapes and mxfp4 bytes, not its activation.
GPT_OSS = ("gpt-oss-120b-like", 128, 4, 2880, 2880, 0)

# --- reference, eager, launcher, public function ----------------------------------------------


def _loop(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, out, held=None):
    def w1_of(e):
        return packing.dequantize_mxfp4_experts(w1[e], w1_scale[e], x.dtype).t()

    def w2_of(e):
        return packing.dequantize_mxfp4_experts(w2[e], w2_scale[e], x.dtype).t()

    return ms.expert_loop(x, topk_weights, topk_ids, w1.shape[0], w1_of, w2_of, out, held)


def fused_moe_mxfp4_ref(
    x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check=True, out=None,
    intermediate_dtype=None,
):  # fmt: skip
    """The expert loop on the dequantized weights, in x's dtype (exact in float64), the
    intermediate silu(gate)·up rounded to ``intermediate_dtype`` when given (verify gives the
    activations' dtype: the kernels store it there)."""
    return _loop(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, out, intermediate_dtype)


def fused_moe_mxfp4_torch(
    x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check=True, out=None
):  # fmt: skip
    """Eager PyTorch: dequantize each expert hit to x's dtype, then the expert loop."""
    _validate(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check, out)
    return _loop(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids.long(), out)


def _check_mx(prefix, w, scale, shape, what, x):
    """mxfp4 bytes of an (E, N, K) weight (``what`` names the sizes) and its ue8m0 scales."""
    e, n, k = shape
    _check.tensor(prefix, w, dtypes=(torch.uint8,), ndim=3, device=x.device)
    _check.same_shape(prefix, w, (e, n, k // 2), what.replace("K)", "K / 2)"))
    _check.tensor(f"{prefix}_scale", scale, dtypes=(torch.uint8,), ndim=3, device=x.device)
    _check.same_shape(
        f"{prefix}_scale", scale, (e, n, k // MX_BLOCK), what.replace("K)", "K / 32)")
    )


def _validate(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check, out) -> None:
    _check.tensor("x", x, dtypes=(torch.float16, torch.bfloat16), ndim=2)
    h = x.shape[1]
    if h % MX_BLOCK:
        raise ValueError(f"x: hidden size H = {h} is not a multiple of the 32-value scale block")
    _check.tensor("w1", w1, dtypes=(torch.uint8,), ndim=3, device=x.device)
    e, two_i, _ = w1.shape
    if two_i % 2 or e < 1:
        raise ValueError(f"w1: expected (E >= 1, 2·I, H/2) with gate and up rows, got {w1.shape}")
    i = two_i // 2
    if i % MX_BLOCK:
        raise ValueError(
            f"w1: intermediate size I = {i} (from 2·I = {two_i} rows) is not a multiple of the "
            "32-value scale block"
        )
    _check_mx("w1", w1, w1_scale, (e, two_i, h), "(E, 2·I, H)", x)
    _check_mx("w2", w2, w2_scale, (e, h, i), "(E, H, I)", x)
    mc.validate_routing(x, topk_weights, topk_ids, e, check)
    mc.validate_out(out, x, h)


def _plan(
    x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check=True, out=None, config=None
):  # fmt: skip
    """The launches for these (validated) arguments (see ``_common.plan``)."""
    return mc.plan(
        x,
        mc.ExpertWeights(w1, w1_scale, None, MX_BLOCK, mx4=True),
        mc.ExpertWeights(w2, w2_scale, None, MX_BLOCK, mx4=True),
        topk_weights,
        topk_ids,
        experts=w1.shape[0],
        intermediate=w1.shape[1] // 2,
        out=out,
        config=config,
    )


def fused_moe_mxfp4_triton(
    x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check=True, out=None, config=None
):  # fmt: skip
    """Launch the Triton kernels (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check, out)
    return _plan(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check, out, config).run()


def fused_moe_mxfp4(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check=True, out=None):
    """x [T, H] (float16/bfloat16) through the mxfp4 experts ``topk_ids`` [T, k] picks,
    weighted by ``topk_weights`` → [T, H] in x's dtype (layouts in the module docstring).
    ``check`` checks the ids on the host (a sync); without it an id outside [0, E) contributes
    nothing. Triton on CUDA/ROCm; torch on CPU (interpreter with KERNELAB_INTERPRET=1)."""
    args = (x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, check, out)
    if isinstance(x, torch.Tensor) and use_triton(x):
        return fused_moe_mxfp4_triton(*args)
    return fused_moe_mxfp4_torch(*args)


# --- the declaration ---------------------------------------------------------------------------


def _experts(e, n, k, device, gen):
    """mxfp4 experts of trained-layer magnitudes, each 32-group's spread by e^N(0, 1), so that
    a scale read from a wrong group, or off by a power of two, changes the result."""
    if device.type == "meta":
        u8 = dict(dtype=torch.uint8, device=device)
        return torch.empty((e, n, k // 2), **u8), torch.empty((e, n, k // MX_BLOCK), **u8)
    w = ms.dense_weight(e, n, k, torch.float32, device, gen)
    spread = _inputs.randn((e, n, k // MX_BLOCK), torch.float32, device, gen, "normal").exp()
    return packing.quantize_mxfp4_experts(w * spread.repeat_interleave(MX_BLOCK, dim=2))


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    d = shape.dims
    e, h, i = d["experts"], d["hidden"], d["intermediate"]
    weights, ids = ms.routing(shape, device, gen)
    w1, s1 = _experts(e, 2 * i, h, device, gen)
    w2, s2 = _experts(e, h, i, device, gen)
    return {
        "x": ms.activations(shape, dtype, device, gen, dist),
        "w1": w1,
        "w2": w2,
        "w1_scale": s1,
        "w2_scale": s2,
        "topk_weights": weights,
        "topk_ids": ids,
        "check": True,
    }


def _cost(inputs: dict):
    """See ``_spec.cost``; an expert's weights at their packed width: 3·H·I/2 bytes of e2m1
    plus 3·H·I/32 bytes of ue8m0 scales."""
    w1, w2, s1, s2 = (inputs[n] for n in ("w1", "w2", "w1_scale", "w2_scale"))
    per_expert = sum(t[0].numel() * t.element_size() for t in (w1, w2, s1, s2))
    return ms.cost(inputs["x"], inputs["topk_ids"], w1.shape[0], w1.shape[1] // 2, per_expert)


def _representative() -> list[Shape]:
    return ms.representative(models=(*ms.MOE_MODELS[:2], GPT_OSS))


def _edge() -> list[Shape]:
    return [s for s in ms.edge(MX_BLOCK) if not s.params.get("shared")]


def _tuning_space(shape: Shape, dtype) -> list[MoEConfig]:
    d = shape.dims
    space = MoEConfig.tuning_space(d["tokens"] * d["topk"], d["experts"])
    return [c for c in space if c.block_k % MX_BLOCK == 0] or [
        MoEConfig.default_for(d["tokens"] * d["topk"], d["experts"], mx4=True)
    ]


FUSED_MOE_MXFP4 = register(
    Op(
        "fused_moe_mxfp4",
        description="routed SwiGLU experts with mxfp4 weights (e2m1, ue8m0 scales per 32), "
        "16-bit activations",
        reference=fused_moe_mxfp4_ref,
        make_inputs=_make_inputs,
        shapes={"representative": _representative, "edge": _edge},
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
        tuning_space=_tuning_space,
    )
)
FUSED_MOE_MXFP4.add_variant(
    Variant(
        "kernelab",
        fused_moe_mxfp4_triton,
        "triton",
        description="fused_moe's grouped GEMMs on e2m1 decoded in registers, ue8m0 scales per "
        "32 of K",
    )
)
FUSED_MOE_MXFP4.add_torch(fused_moe_mxfp4_torch)
