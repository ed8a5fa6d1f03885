"""The fused mixture-of-experts layer: routed experts (and a shared expert) with SwiGLU MLPs.

    out[t] = Σ_j topk_weights[t, j] · down_e(silu(gate_e(x[t])) ⊙ up_e(x[t])),  e = topk_ids[t, j]
             (+ down_s(silu(gate_s(x[t])) ⊙ up_s(x[t])) for a shared expert, DeepSeek's)

x is float16/bfloat16 [T, H]; ``w1`` [E, 2I, H] holds each expert's gate then up rows, ``w2``
[E, H, I] its down projection (transformers' ``MixtralExperts`` and vLLM's layout); the
routing (``topk_weights``, ``topk_ids`` [T, k]) comes from a router (``moe_topk``). The launch
sequence and where the routing weight is applied: ``_common``.

The ladder: ``_moe_align_kernel`` → ``_fused_moe_kernel`` (twice, or four times with a shared
expert) → ``_moe_sum_kernel``, planned by ``_common.plan`` → ``fused_moe_triton`` (validate,
plan, launch) → ``fused_moe`` (public), with ``fused_moe_ref`` (a plain loop over experts,
exact in float64) and ``fused_moe_torch`` (the same loop in x's dtype, as transformers runs it)
beside it.
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

# --- reference, eager, launcher, public function ----------------------------------------------


def _loop(x, w1, w2, topk_weights, topk_ids, shared_w1, shared_w2, out, held=None):
    e = w1.shape[0]
    y = ms.expert_loop(
        x, topk_weights, topk_ids, e, lambda i: w1[i].t(), lambda i: w2[i].t(), held=held
    )
    if shared_w1 is not None:
        y = y + ms.silu_mul(x @ shared_w1[0].t(), shared_w2.shape[2], held) @ shared_w2[0].t()
    return y if out is None else out.copy_(y)


def fused_moe_ref(
    x,
    w1,
    w2,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    check=True,
    out=None,
    intermediate_dtype=None,
):
    """The layer one expert at a time in x's dtype (exact when given float64), each
    intermediate silu(gate)·up rounded to ``intermediate_dtype`` when given (verify gives the
    activations' dtype: the kernels store it there)."""
    return _loop(x, w1, w2, topk_weights, topk_ids, shared_w1, shared_w2, out, intermediate_dtype)


def fused_moe_torch(
    x, w1, w2, topk_weights, topk_ids, shared_w1=None, shared_w2=None, check=True, out=None
):
    """Eager PyTorch: the loop over the experts hit, in x's dtype."""
    _validate(x, w1, w2, topk_weights, topk_ids, shared_w1, shared_w2, check, out)
    return _loop(x, w1, w2, topk_weights, topk_ids.long(), shared_w1, shared_w2, out)


def _validate(x, w1, w2, topk_weights, topk_ids, shared_w1, shared_w2, check, out) -> None:
    _check.tensor("x", x, dtypes=(torch.float16, torch.bfloat16), ndim=2)
    h = x.shape[1]
    _check.tensor("w1", w1, dtypes=(x.dtype,), ndim=3, device=x.device)
    e, two_i, w1_h = w1.shape
    if w1_h != h or two_i % 2 or e < 1:
        raise ValueError(
            f"w1: expected (E >= 1, 2·I, H={h}) with gate and up rows, got {tuple(w1.shape)}"
        )
    _check.tensor("w2", w2, dtypes=(x.dtype,), ndim=3, device=x.device)
    _check.same_shape("w2", w2, (e, h, two_i // 2), "E, H, I")
    if (shared_w1 is None) != (shared_w2 is None):
        raise ValueError("shared_w1, shared_w2: expected both (a shared expert) or neither")
    if shared_w1 is not None:
        _check.tensor("shared_w1", shared_w1, dtypes=(x.dtype,), ndim=3, device=x.device)
        if shared_w1.shape[0] != 1 or shared_w1.shape[2] != h or shared_w1.shape[1] % 2:
            raise ValueError(f"shared_w1: expected (1, 2·Is, H={h}), got {tuple(shared_w1.shape)}")
        _check.tensor("shared_w2", shared_w2, dtypes=(x.dtype,), ndim=3, device=x.device)
        _check.same_shape("shared_w2", shared_w2, (1, h, shared_w1.shape[1] // 2), "1, H, Is")
    mc.validate_routing(x, topk_weights, topk_ids, e, check)
    mc.validate_out(out, x, h)


def _plan(
    x,
    w1,
    w2,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    check=True,
    out=None,
    config=None,
):
    """The launches for these (validated) arguments (see ``_common.plan``)."""
    shared = None
    if shared_w1 is not None:
        shared = (mc.ExpertWeights(shared_w1), mc.ExpertWeights(shared_w2))
    return mc.plan(
        x,
        mc.ExpertWeights(w1),
        mc.ExpertWeights(w2),
        topk_weights,
        topk_ids,
        experts=w1.shape[0],
        intermediate=w2.shape[2],
        shared=shared,
        out=out,
        config=config,
    )


def fused_moe_triton(
    x,
    w1,
    w2,
    topk_weights,
    topk_ids,
    shared_w1=None,
    shared_w2=None,
    check=True,
    out=None,
    config=None,
):
    """Launch the Triton kernels (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(x, w1, w2, topk_weights, topk_ids, shared_w1, shared_w2, check, out)
    return _plan(x, w1, w2, topk_weights, topk_ids, shared_w1, shared_w2, check, out, config).run()


def fused_moe(
    x, w1, w2, topk_weights, topk_ids, shared_w1=None, shared_w2=None, check=True, out=None
):
    """x [T, H] through the experts ``topk_ids`` [T, k] picks, weighted by ``topk_weights``
    (+ a shared expert ``shared_w1`` [1, 2·Is, H], ``shared_w2`` [1, H, Is]) → [T, H] in x's
    dtype. ``check`` checks the ids on the host (a sync); without it, an id outside [0, E)
    contributes nothing. Triton on CUDA/ROCm; torch on CPU (interpreter with
    KERNELAB_INTERPRET=1)."""
    if isinstance(x, torch.Tensor) and use_triton(x):
        return fused_moe_triton(x, w1, w2, topk_weights, topk_ids, shared_w1, shared_w2, check, out)
    return fused_moe_torch(x, w1, w2, topk_weights, topk_ids, shared_w1, shared_w2, check, out)


# --- the declaration ---------------------------------------------------------------------------


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    d = shape.dims
    e, h, i = d["experts"], d["hidden"], d["intermediate"]
    weights, ids = ms.routing(shape, device, gen)
    shared_w1 = shared_w2 = None
    if shape.params.get("shared"):
        si = d["shared_intermediate"]
        shared_w1 = ms.dense_weight(1, 2 * si, h, dtype, device, gen)
        shared_w2 = ms.dense_weight(1, h, si, dtype, device, gen)
    return {
        "x": ms.activations(shape, dtype, device, gen, dist),
        "w1": ms.dense_weight(e, 2 * i, h, dtype, device, gen),
        "w2": ms.dense_weight(e, h, i, dtype, device, gen),
        "topk_weights": weights,
        "topk_ids": ids,
        "shared_w1": shared_w1,
        "shared_w2": shared_w2,
        "check": True,
    }


def _cost(inputs: dict):
    """See ``_spec.cost``: an expert's gate, up and down weights are 3·H·I elements."""
    x, w1, w2, sw2 = inputs["x"], inputs["w1"], inputs["w2"], inputs.get("shared_w2")
    e, h, i = w2.shape
    si = sw2.shape[2] if sw2 is not None else 0
    return ms.cost(
        x,
        inputs["topk_ids"],
        e,
        i,
        3 * h * i * w1.element_size(),
        si,
        3 * h * si * w1.element_size(),
    )


def _tuning_space(shape: Shape, dtype) -> list[MoEConfig]:
    d = shape.dims
    return MoEConfig.tuning_space(d["tokens"] * d["topk"], d["experts"])


FUSED_MOE = register(
    Op(
        "fused_moe",
        description="routed SwiGLU experts (+ shared expert): grouped GEMMs, weighted top-k sum",
        reference=fused_moe_ref,
        make_inputs=_make_inputs,
        shapes={"representative": ms.representative, "edge": ms.edge},
        cost=_cost,
        # The default: 2x eager torch's error (which rounds after every step), the per-dtype
        # floor; the intermediate in x's dtype, as the kernels store it. NaN and Inf go into
        # the activations; the routing and weights are data.
        contract=Contract(special_inputs=("x",), intermediate_dtype="x"),
        dtypes=(torch.float16, torch.bfloat16),
        kernels=(_moe_align_kernel, _fused_moe_kernel, _moe_sum_kernel),
        plan=_plan,
        tuning_space=_tuning_space,
    )
)
FUSED_MOE.add_variant(
    Variant(
        "kernelab",
        fused_moe_triton,
        "triton",
        description="align by expert, grouped GEMMs with fused SwiGLU and routing weight, sum",
    )
)
FUSED_MOE.add_torch(fused_moe_torch)
FUSED_MOE.add_external(
    "vllm",
    "vllm",
    lambda: _vllm_fused_experts(),
    description="vLLM's Triton fused MoE (fused_experts), same weight layout",
)


def _vllm_fused_experts():
    from vllm.model_executor.layers.fused_moe import fused_experts

    def call(
        x, w1, w2, topk_weights, topk_ids, shared_w1=None, shared_w2=None, check=True, out=None
    ):
        y = fused_experts(x, w1, w2, topk_weights.float(), topk_ids)
        if shared_w1 is not None:
            y = y + ms.silu_mul(x @ shared_w1[0].t(), shared_w2.shape[2]) @ shared_w2[0].t()
        return y if out is None else out.copy_(y)

    return call
