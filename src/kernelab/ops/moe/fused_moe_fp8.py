"""The fused mixture-of-experts layer with block-scaled float8 experts (DeepSeek-V3's recipe).

    out[t] = Σ_j topk_weights[t, j] · down_e(q(silu(gate_e(q(x[t]))) ⊙ up_e(q(x[t])))),
             e = topk_ids[t, j]  (+ the shared expert's, likewise)
    W[n, k] = values[n, k] · scale[n // 128, k // 128]   per expert and projection
    q(a): a per row and 128 columns to e4m3 and back, as ``fp8_quant(a, group_size=128)``

Weights: ``w1`` e4m3 [E, 2I, H] (gate rows, then up), ``w1_scale`` float32
[E, ⌈2I/128⌉, ⌈H/128⌉]; ``w2`` e4m3 [E, H, I], ``w2_scale`` [E, ⌈H/128⌉, ⌈I/128⌉]; a shared
expert the same with a leading 1 (``packing.quantize_fp8_block_experts`` makes them from float
weights; gate+up is quantized as one [2I, H] matrix, as checkpoints store it). H and I need
not be multiples of 128: the last blocks and groups are shorter.

The recipe (vLLM's ``fused_experts(use_fp8_w8a8=True, block_shape=[128, 128])``, with two
16-bit roundings fewer), and where it rounds:

1. x (float16/bfloat16) is quantized per token and 128 columns to e4m3 with float32 scales
   (``fp8_quant``'s arithmetic, in float32): rounding 1.
2. gate and up: e4m3 products summed on tensor cores in float32 per 128-wide K block, each
   block's sum times its activation group scale and weight block scale, accumulated in
   float32; silu(gate) · up in float32, stored as float32 (vLLM rounds it to x's dtype here
   first; we do not).
3. that intermediate is quantized per row and 128 columns to e4m3, like x: rounding 2.
4. down, as 2., times the routing weight in float32, stored as float32 per (token, slot)
   (vLLM rounds each to x's dtype; in float16 a part can overflow, or fall to subnormals,
   where their sum does not); the k parts and the shared expert's summed in float32 and
   rounded to x's dtype: rounding 3, the only one after the quantizations.

``fused_moe_fp8_ref`` makes roundings 1 and 2 exactly as the kernels do (the same float32
arithmetic, on its float64 values: the intermediate is rounded to float32 first, as the kernel
stores it) and computes everything else in float64, so the contract measures the kernels'
accumulation and output rounding, not the format's quantization error.

The activations are quantized to the weights' e4m3 flavour: ``float8_e4m3fn`` (largest value
448) on NVIDIA, ``float8_e4m3fnuz`` (240) on AMD gfx942. The reference sees float64 copies of
the weights, not their flavour, so the flavour travels as an argument: ``fp8_dtype`` (None:
``w1``'s dtype; the kernels and eager torch refuse one that is not ``w1``'s). The op's inputs
always name it, so the reference verify and bench build quantizes as the kernels do on every
device; called without it on float64 weights, the reference takes ``float8_e4m3fn``.

The ladder: ``fp8_quant``'s kernel, ``_moe_align_kernel``, ``_fused_moe_kernel`` with
constexpr FP8 (gate+up), ``fp8_quant``'s kernel on the intermediate, ``_fused_moe_kernel``
(down), [the shared expert's three], ``_moe_sum_kernel``; planned by ``_common.plan`` →
``fused_moe_fp8_triton`` → ``fused_moe_fp8``; ``fused_moe_fp8_ref`` and
``fused_moe_fp8_torch`` (the same recipe in float32, one expert at a time) beside it.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kernelab.core import Contract, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import fp8 as _fp8
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.triton import use_triton
from kernelab.ops import packing
from kernelab.ops.matmul.fp8_gemm import E4M3, e4m3_for, fp8_supported
from kernelab.ops.moe import _common as mc
from kernelab.ops.moe import _spec as ms
from kernelab.ops.moe._kernels import _fused_moe_kernel, _moe_align_kernel, _moe_sum_kernel
from kernelab.ops.quant.fp8_quant import FP8_QUANT, fp8_quant_torch

FP8_BLOCK = packing.FP8_BLOCK

MoEConfig = mc.MoEConfig

# --- the recipe's quantization, reference, eager ----------------------------------------------


def _fp8_of(w: torch.Tensor, fp8_dtype=None) -> torch.dtype:
    """The e4m3 flavour activations are quantized to: ``fp8_dtype`` when given, else the
    weights' own (float8_e4m3fn for float64 copies of the weights)."""
    if fp8_dtype is not None:
        return fp8_dtype
    return w.dtype if w.dtype in E4M3 else E4M3[0]


def quantize_activations(a: torch.Tensor, fp8_dtype, dtype) -> torch.Tensor:
    """q(a): ``a`` rounded to float32, quantized per row and 128 columns exactly as
    ``fp8_quant`` does, dequantized to ``dtype`` (values times their group's scale)."""
    values, scales = fp8_quant_torch(a.float(), fp8_dtype=fp8_dtype, group_size=FP8_BLOCK)
    full = scales.to(dtype).repeat_interleave(FP8_BLOCK, dim=-1)[..., : a.shape[-1]]
    return values.to(dtype) * full


def _mlp(xq, w1, s1, w2, s2, fp8, dtype) -> torch.Tensor:
    """down(q(silu(gate(xq)) · up(xq))) of one expert, in ``dtype``."""
    h = xq @ packing.dequantize_fp8_block(w1, s1, dtype).t()
    inner = quantize_activations(ms.silu_mul(h, w2.shape[1]), fp8, dtype)
    return inner @ packing.dequantize_fp8_block(w2, s2, dtype).t()


def _loop(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, shared, dtype, fp8):
    xq = quantize_activations(x, fp8, dtype)
    y = torch.zeros(x.shape, dtype=dtype, device=x.device)
    for e in range(w1.shape[0]):
        tok, slot = torch.where(topk_ids == e)
        if tok.numel() == 0:
            continue
        part = _mlp(xq[tok], w1[e], w1_scale[e], w2[e], w2_scale[e], fp8, dtype)
        y.index_add_(0, tok, part * topk_weights[tok, slot, None].to(dtype))
    if shared[0] is not None:
        sw1, sw2, ss1, ss2 = shared
        y = y + _mlp(xq, sw1[0], ss1[0], sw2[0], ss2[0], fp8, dtype)
    return y


def fused_moe_fp8_ref(
    x,
    w1,
    w2,
    w1_scale,
    w2_scale,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    shared_w1_scale=None,
    shared_w2_scale=None,
    check=True,
    out=None,
    fp8_dtype=None,
):
    """The recipe one expert at a time: the two activation quantizations as the kernels make
    them, in the e4m3 flavour ``fp8_dtype`` names (see the module docstring), the rest in x's
    dtype (float64 as verify runs it)."""
    shared = (shared_w1, shared_w2, shared_w1_scale, shared_w2_scale)
    fp8 = _fp8_of(w1, fp8_dtype)
    y = _loop(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids, shared, x.dtype, fp8)
    return y if out is None else out.copy_(y)


def fused_moe_fp8_torch(
    x,
    w1,
    w2,
    w1_scale,
    w2_scale,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    shared_w1_scale=None,
    shared_w2_scale=None,
    check=True,
    out=None,
    fp8_dtype=None,
):
    """Eager PyTorch: the recipe in float32 over the experts hit, rounded once to x's dtype."""
    args = dict(locals())
    _validate(**args)
    shared = (shared_w1, shared_w2, shared_w1_scale, shared_w2_scale)
    ids = topk_ids.long()
    y = _loop(x, w1, w2, w1_scale, w2_scale, topk_weights, ids, shared, torch.float32, w1.dtype)
    y = y.to(x.dtype)
    return y if out is None else out.copy_(y)


# --- argument checks, launcher, public function ------------------------------------------------


def _check_fp8(prefix, w, scale, shape, what, x, fp8):
    """An e4m3 weight of ``shape`` = (E, N, K) (``what`` names the sizes) and its float32
    block scales."""
    _check.tensor(prefix, w, dtypes=(fp8,), ndim=3, device=x.device)
    _check.same_shape(prefix, w, shape, what)
    e, n, k = shape
    blocks = (e, math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK))
    _check.tensor(f"{prefix}_scale", scale, dtypes=(torch.float32,), ndim=3, device=x.device)
    _check.same_shape(f"{prefix}_scale", scale, blocks, "(E, ceil(N / 128), ceil(K / 128))")


def _validate(
    x,
    w1,
    w2,
    w1_scale,
    w2_scale,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    shared_w1_scale=None,
    shared_w2_scale=None,
    check=True,
    out=None,
    fp8_dtype=None,
) -> None:
    _check.tensor("x", x, dtypes=(torch.float16, torch.bfloat16), ndim=2)
    h = x.shape[1]
    _check.tensor("w1", w1, dtypes=E4M3, ndim=3, device=x.device)
    e, two_i, w1_h = w1.shape
    if w1_h != h or two_i % 2 or e < 1:
        raise ValueError(
            f"w1: expected (E >= 1, 2·I, H={h}) with gate and up rows, got {tuple(w1.shape)}"
        )
    fp8 = w1.dtype
    if fp8_dtype is not None and fp8_dtype != fp8:
        raise TypeError(
            f"fp8_dtype: expected None or w1's dtype {fp8} (the activations are quantized to the "
            f"weights' e4m3 flavour), got {fp8_dtype!r}"
        )
    _check_fp8("w1", w1, w1_scale, (e, two_i, h), "(E, 2·I, H)", x, fp8)
    _check_fp8("w2", w2, w2_scale, (e, h, two_i // 2), "(E, H, I)", x, fp8)
    shared = (shared_w1, shared_w2, shared_w1_scale, shared_w2_scale)
    if any(s is not None for s in shared) and any(s is None for s in shared):
        raise ValueError(
            "shared_w1, shared_w2, shared_w1_scale, shared_w2_scale: expected all four "
            "(a shared expert) or none"
        )
    if shared_w1 is not None:
        _check.tensor("shared_w1", shared_w1, dtypes=(fp8,), ndim=3, device=x.device)
        if shared_w1.shape[0] != 1 or shared_w1.shape[2] != h or shared_w1.shape[1] % 2:
            raise ValueError(f"shared_w1: expected (1, 2·Is, H={h}), got {tuple(shared_w1.shape)}")
        si2 = shared_w1.shape[1]
        _check_fp8("shared_w1", shared_w1, shared_w1_scale, (1, si2, h), "(1, 2·Is, H)", x, fp8)
        _check_fp8("shared_w2", shared_w2, shared_w2_scale, (1, h, si2 // 2), "(1, H, Is)", x, fp8)
    mc.validate_routing(x, topk_weights, topk_ids, e, check)
    mc.validate_out(out, x, h)


def _quantize_launches(fp8):
    """a → (the launches of ``fp8_quant``'s per-group kernel on ``a``, values, scales)."""

    def quantize(a):
        p = FP8_QUANT.plan(a, fp8_dtype=fp8, group_size=FP8_BLOCK)
        values, scales = p.result
        return list(p.calls), values, scales

    return quantize


def _plan(
    x,
    w1,
    w2,
    w1_scale,
    w2_scale,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    shared_w1_scale=None,
    shared_w2_scale=None,
    check=True,
    out=None,
    fp8_dtype=None,
    config=None,
):
    """The launches for these (validated) arguments (see ``_common.plan``)."""

    def weights(w, s):
        return mc.ExpertWeights(w, s, None, FP8_BLOCK)

    shared = None
    if shared_w1 is not None:
        shared = (weights(shared_w1, shared_w1_scale), weights(shared_w2, shared_w2_scale))
    return mc.plan(
        x,
        weights(w1, w1_scale),
        weights(w2, w2_scale),
        topk_weights,
        topk_ids,
        experts=w1.shape[0],
        intermediate=w2.shape[2],
        shared=shared,
        out=out,
        config=config,
        quantize=_quantize_launches(w1.dtype),
    )


def fused_moe_fp8_triton(
    x,
    w1,
    w2,
    w1_scale,
    w2_scale,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    shared_w1_scale=None,
    shared_w2_scale=None,
    check=True,
    out=None,
    fp8_dtype=None,
    config=None,
):
    """Launch the Triton kernels (natively on GPUs, through the interpreter on CPU tensors)."""
    args = dict(locals())
    del args["config"]
    _validate(**args)
    if not fp8_supported(x.device):
        raise ValueError(f"x: fp8 experts need an sm_89+ or gfx942 device, got {x.device}")
    return _plan(**args, config=config).run()


def fused_moe_fp8(
    x,
    w1,
    w2,
    w1_scale,
    w2_scale,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    shared_w1_scale=None,
    shared_w2_scale=None,
    check=True,
    out=None,
    fp8_dtype=None,
):
    """x [T, H] (float16/bfloat16) through the block-scaled e4m3 experts ``topk_ids`` [T, k]
    picks, weighted by ``topk_weights`` (+ a shared expert) → [T, H] in x's dtype; layouts
    and the recipe in the module docstring. ``check`` checks the ids on the host (a sync);
    without it an id outside [0, E) contributes nothing. ``fp8_dtype``: None or the weights'
    e4m3 flavour, which the activations are quantized to. Triton on CUDA/ROCm; torch on CPU
    (interpreter with KERNELAB_INTERPRET=1)."""
    args = dict(locals())
    if isinstance(x, torch.Tensor) and use_triton(x):
        return fused_moe_fp8_triton(**args)
    return fused_moe_fp8_torch(**args)


# --- the declaration ---------------------------------------------------------------------------


def _block_spread(e, n, k, device, gen) -> torch.Tensor:
    """Magnitudes e^N(0, 1) per expert and 128 × 128 block (or per row and 128 columns with
    row blocks of 1), so that a scale read from a wrong block, or skipped, changes the result."""
    nb, kb = math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK)
    spread = _inputs.randn((e, nb, kb), torch.float32, device, gen, "normal").exp()
    return spread.repeat_interleave(FP8_BLOCK, 1).repeat_interleave(FP8_BLOCK, 2)[:, :n, :k]


def _experts(e, n, k, ue8m0, fp8, device, gen):
    if device.type == "meta":
        blocks = (e, math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK))
        return (
            torch.empty((e, n, k), dtype=fp8, device=device),
            torch.empty(blocks, dtype=torch.float32, device=device),
        )
    w = ms.dense_weight(e, n, k, torch.float32, device, gen) * _block_spread(e, n, k, device, gen)
    return packing.quantize_fp8_block_experts(w, fp8, ue8m0)


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    d, p = shape.dims, shape.params
    e, h, i = d["experts"], d["hidden"], d["intermediate"]
    ue8m0 = bool(p.get("ue8m0", False))
    # the device's flavour; a shape may name one ("e4m3fnuz": AMD's recipe, on any device)
    fp8 = _fp8.BY_NAME[p["fp8"]] if "fp8" in p else e4m3_for(device)
    weights, ids = ms.routing(shape, device, gen)
    x = ms.activations(shape, dtype, device, gen, dist)
    if device.type != "meta" and x.numel() and dist == "normal":
        # activation groups of different magnitudes (a wrong group's scale shows); only on
        # the normal distribution, where it cannot overflow float16
        x.mul_(_block_spread(1, 1, h, device, gen)[0, 0].to(dtype))
    w1, s1 = _experts(e, 2 * i, h, ue8m0, fp8, device, gen)
    w2, s2 = _experts(e, h, i, ue8m0, fp8, device, gen)
    shared = {"shared_w1": None, "shared_w2": None, "shared_w1_scale": None}
    shared["shared_w2_scale"] = None
    if p.get("shared"):
        si = d["shared_intermediate"]
        shared["shared_w1"], shared["shared_w1_scale"] = _experts(
            1, 2 * si, h, ue8m0, fp8, device, gen
        )
        shared["shared_w2"], shared["shared_w2_scale"] = _experts(1, h, si, ue8m0, fp8, device, gen)
    return {
        "x": x,
        "w1": w1,
        "w2": w2,
        "w1_scale": s1,
        "w2_scale": s2,
        "topk_weights": weights,
        "topk_ids": ids,
        "shared_w1": shared["shared_w1"],
        "shared_w2": shared["shared_w2"],
        "shared_w1_scale": shared["shared_w1_scale"],
        "shared_w2_scale": shared["shared_w2_scale"],
        "check": True,
        "fp8_dtype": fp8,
    }


def _bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _cost(inputs: dict):
    """See ``_spec.cost``; an expert's weights at their real width: 3·H·I bytes of e4m3 plus
    its float32 block scales; the shared expert's likewise."""
    x, w1, w2 = inputs["x"], inputs["w1"], inputs["w2"]
    e, _, i = w2.shape
    per_expert = _bytes(w1[0], w2[0], inputs["w1_scale"][0], inputs["w2_scale"][0])
    sw2 = inputs.get("shared_w2")
    si = sw2.shape[2] if sw2 is not None else 0
    shared_bytes = _bytes(
        inputs.get("shared_w1"), sw2, inputs.get("shared_w1_scale"), inputs.get("shared_w2_scale")
    )
    c = ms.cost(x, inputs["topk_ids"], e, i, per_expert, si, shared_bytes)
    return dataclasses.replace(c, compute="float8_e4m3fn")


def _edge() -> list[Shape]:
    def shape(label, t, e, k, h, i, **p):
        dims = {"tokens": t, "experts": e, "topk": k, "hidden": h, "intermediate": i}
        if p.get("shared"):
            dims["shared_intermediate"] = 200
        return Shape(f"{label} T={t} E={e} k={k} {h}x{i}", dims, p, batch_dim="tokens")

    return [
        *ms.edge(),
        shape("H and I past one block, not multiples of 128", 19, 4, 2, 320, 200),
        shape("shared expert past one block", 9, 4, 2, 256, 136, shared=True),
        shape("ue8m0 scales", 11, 4, 2, 256, 128, ue8m0=True),
    ]


def _tuning_space(shape: Shape, dtype) -> list[MoEConfig]:
    d = shape.dims
    space = MoEConfig.tuning_space(d["tokens"] * d["topk"], d["experts"], fp8=True)
    return [c for c in space if c.block_k >= 32 and FP8_BLOCK % c.block_k == 0]


FUSED_MOE_FP8 = register(
    Op(
        "fused_moe_fp8",
        description="routed SwiGLU experts in block-scaled e4m3 (1x128 activations, 128x128 "
        "weights) (+ shared expert)",
        reference=fused_moe_fp8_ref,
        make_inputs=_make_inputs,
        shapes={"representative": ms.representative, "edge": _edge},
        cost=_cost,
        # The default: 2x eager torch's error (the recipe in float32, rounded once), the
        # per-dtype floor; the activations' quantizations are in the reference (see the module
        # docstring). NaN and Inf go into the activations.
        contract=Contract(special_inputs=("x",), data_inputs=("x", "topk_weights")),
        dtypes=(torch.float16, torch.bfloat16),
        kernels=(*FP8_QUANT.kernels, _moe_align_kernel, _fused_moe_kernel, _moe_sum_kernel),
        plan=_plan,
        tuning_space=_tuning_space,
    )
)
FUSED_MOE_FP8.add_variant(
    Variant(
        "kernelab",
        fused_moe_fp8_triton,
        "triton",
        description="activations quantized per 1x128 group, grouped e4m3 GEMMs with block "
        "scales per K step, fused SwiGLU and routing weight, sum",
    )
)
FUSED_MOE_FP8.add_torch(fused_moe_fp8_torch)
FUSED_MOE_FP8.add_external(
    "vllm",
    "vllm",
    lambda: _vllm_fused_experts_fp8(),
    description="vLLM's Triton fused MoE, use_fp8_w8a8 with block_shape [128, 128]",
)


def _vllm_fused_experts_fp8():
    from vllm.model_executor.layers.fused_moe import fused_experts

    def experts(x, w1, w2, s1, s2, weights, ids):
        return fused_experts(
            x,
            w1,
            w2,
            weights.float(),
            ids,
            use_fp8_w8a8=True,
            w1_scale=s1,
            w2_scale=s2,
            block_shape=[FP8_BLOCK, FP8_BLOCK],
        )

    def call(
        x,
        w1,
        w2,
        w1_scale,
        w2_scale,
        topk_weights,
        topk_ids,
        shared_w1=None,
        shared_w2=None,
        shared_w1_scale=None,
        shared_w2_scale=None,
        check=True,
        out=None,
        fp8_dtype=None,
    ):
        y = experts(x, w1, w2, w1_scale, w2_scale, topk_weights, topk_ids)
        if shared_w1 is not None:  # the shared expert as one expert every token takes, weight 1
            t = x.shape[0]
            one = torch.ones((t, 1), dtype=torch.float32, device=x.device)
            zero = torch.zeros((t, 1), dtype=topk_ids.dtype, device=x.device)
            y = y + experts(x, shared_w1, shared_w2, shared_w1_scale, shared_w2_scale, one, zero)
        return y if out is None else out.copy_(y)

    return call
