"""Router logits → each token's top-k experts and their routing weights.

    ids[t]      = the k experts with the largest logits[t, :] (ties: the lower expert first)
    weights[t]  = softmax(logits[t])[ids[t]]   or   sigmoid(logits[t, ids[t]])
                  (÷ their sum with ``renormalize``)

Softmax and sigmoid are increasing, so the experts with the largest scores are the experts with
the largest logits: selecting on the logits (exact in the input's dtype) picks the same experts
as selecting on the scores, without a rounding of the scores deciding a near tie. Mixtral
(softmax, renormalised), Qwen3-MoE (softmax, ``norm_topk_prob``) and the sigmoid routers are
covered; DeepSeek-V3's grouped selection (best groups first, a score-correction bias) is not.

The ladder: ``_moe_topk_kernel`` → ``moe_topk_triton`` (validate, plan, launch) → ``moe_topk``
(public), with ``moe_topk_ref`` (float64) and ``moe_topk_torch`` (eager) beside it.
"""

from __future__ import annotations

import torch

from kernelab.ops._model import (
    DEFAULT_FLOORS,
    Contract,
    Cost,
    Op,
    Sampling,
    Shape,
    Variant,
    register,
)
from kernelab.ops._runtime import check as _check
from kernelab.ops._runtime import inputs as _inputs
from kernelab.ops._runtime.launch import KernelCall, LaunchPlan, cdiv
from kernelab.ops._runtime.triton import next_pow2, use_triton
from kernelab.ops.moe import _common as mc
from kernelab.ops.moe._kernels import _moe_topk_kernel

SCORINGS = ("softmax", "sigmoid")
#: Logits a program holds: 16 per thread over 4 warps.
TILE_ELEMENTS = 2048

# --- reference, eager, launcher, public function ----------------------------------------------


def _weights(logits, ids, scoring, renormalize):
    if scoring == "softmax":
        w = torch.softmax(logits, dim=-1).gather(1, ids)
    else:
        w = torch.sigmoid(logits.gather(1, ids))
    return w / w.sum(dim=-1, keepdim=True) if renormalize else w


def moe_topk_ref(router_logits, top_k, scoring="softmax", renormalize=True):
    """(weights, ids): the stable sort's top-k of the logits, their scores in the logits'
    dtype (exact when given float64)."""
    ids = mc.topk_select(router_logits, top_k)
    return _weights(router_logits, ids, scoring, renormalize), ids.to(torch.int32)


def moe_topk_torch(router_logits, top_k, scoring="softmax", renormalize=True):
    """Eager PyTorch, as transformers' routers (float32 scores, renormalised), but with the op's
    tie order: a stable sort of the logits rather than torch.topk, whose order among equal
    values is unspecified."""
    _validate(router_logits, top_k, scoring, renormalize)
    logits = router_logits.float()
    ids = mc.topk_select(logits, top_k)
    return _weights(logits, ids, scoring, renormalize), ids.to(torch.int32)


def _validate(router_logits, top_k, scoring, renormalize) -> None:
    _check.tensor("router_logits", router_logits, dtypes=_check.FLOATS, ndim=2)
    e = router_logits.shape[1]
    _check.integer("top_k", top_k, min_value=1)
    if top_k > e:
        raise ValueError(f"top_k: expected at most the number of experts ({e}), got {top_k}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: expected one of {SCORINGS}, got {scoring!r}")
    _check.boolean("renormalize", renormalize)


def _plan(router_logits, top_k, scoring="softmax", renormalize=True, config=None):
    """The launch of ``_moe_topk_kernel``; ``config``: tokens per program."""
    t, e = router_logits.shape
    dev = router_logits.device
    weights = torch.empty((t, top_k), dtype=torch.float32, device=dev)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=dev)
    if t == 0:
        return LaunchPlan(result=(weights, ids))
    block_e = next_pow2(e)
    block_t = config or max(1, min(64, TILE_ELEMENTS // block_e, next_pow2(t)))
    call = KernelCall(
        _moe_topk_kernel,
        (cdiv(t, block_t),),
        dict(
            Weights=weights,
            stride_wt=weights.stride(0),
            Ids=ids,
            stride_it=ids.stride(0),
            Logits=router_logits,
            stride_lt=router_logits.stride(0),
            stride_le=router_logits.stride(1),
            T=t,
            E=e,
            TOPK=top_k,
            SIGMOID=scoring == "sigmoid",
            RENORMALIZE=renormalize,
            BLOCK_T=block_t,
            BLOCK_E=block_e,
        ),
        4,
        1,
    )
    return LaunchPlan((call,), (weights, ids))


def moe_topk_triton(router_logits, top_k, scoring="softmax", renormalize=True, config=None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(router_logits, top_k, scoring, renormalize)
    return _plan(router_logits, top_k, scoring, renormalize, config).run()


def moe_topk(router_logits, top_k, scoring="softmax", renormalize=True):
    """router_logits [T, E] → (weights float32 [T, top_k], ids int32 [T, top_k]), the experts
    in decreasing order of logit. Triton on CUDA/ROCm; torch on CPU (interpreter with
    KERNELAB_INTERPRET=1)."""
    if isinstance(router_logits, torch.Tensor) and use_triton(router_logits):
        return moe_topk_triton(router_logits, top_k, scoring, renormalize)
    return moe_topk_torch(router_logits, top_k, scoring, renormalize)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    shapes = []
    for name, e, k, *_ in mc.MOE_MODELS:
        for t in mc.MOE_TOKENS:
            scoring = "sigmoid" if name.startswith("deepseek") else "softmax"
            shapes.append(
                Shape(
                    f"{name} T={t} E={e} k={k} {scoring}",
                    {"tokens": t, "experts": e},
                    {"top_k": k, "scoring": scoring, "renormalize": True},
                    batch_dim="tokens",
                )
            )
    return shapes


def _edge() -> list[Shape]:
    cases = [
        ("top-k = experts", 5, 8, 8, "softmax", True, {}),
        ("not renormalised", 7, 60, 4, "softmax", False, {}),
        ("sigmoid, not renormalised", 9, 16, 2, "sigmoid", False, {}),
        ("tied logits", 33, 64, 6, "softmax", True, {"ties": True}),
        ("one expert of 3", 3, 3, 1, "sigmoid", True, {}),
        ("non-contiguous rows", 6, 40, 3, "softmax", True, {"row_pad": 5}),
        ("empty", 0, 8, 2, "softmax", True, {}),
    ]
    return [
        Shape(
            f"{label} T={t} E={e} k={k}",
            {"tokens": t, "experts": e},
            {"top_k": k, "scoring": s, "renormalize": r, **p},
            batch_dim="tokens",
        )
        for label, t, e, k, s, r, p in cases
    ]


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    t, e = shape.dims["tokens"], shape.dims["experts"]
    p = shape.params
    logits = _inputs.randn((t, e), dtype, device, gen, dist)
    if p.get("ties") and device.type != "meta":
        logits = logits.clamp(-1, 1).mul(2).round().div(2)  # five values: ties everywhere
    if p.get("row_pad"):
        logits = _inputs.strided_rows(logits, p["row_pad"])
    return {"router_logits": logits, "top_k": p["top_k"], "scoring": p["scoring"],
            "renormalize": p["renormalize"]}  # fmt: skip


def _cost(inputs: dict) -> Cost:
    """Read the logits once; write float32 weights and int32 ids. FLOPs: the scores (one
    exponential per logit for softmax) and k passes of comparisons over the row."""
    logits, k = inputs["router_logits"], inputs["top_k"]
    t, e = logits.shape
    return Cost(flops=(k + 2) * t * e, bytes=t * e * logits.element_size() + t * k * 8)


MOE_TOPK = register(
    Op(
        "moe_topk",
        description="router logits -> top-k experts (int32) and softmax/sigmoid weights",
        reference=moe_topk_ref,
        make_inputs=_make_inputs,
        sampling=Sampling(
            rows={"router_logits": 0, "topk_weights": 0, "topk_ids": 0}, tile={"tokens": 32}
        ),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # The ids are exact (floor 0: any wrong expert fails); the float32 weights within 2x
        # eager torch's float32 error. Special values are not routed (a NaN logit's row is
        # NaN in the weights, and which expert it names is not defined).
        contract=Contract(floors={**DEFAULT_FLOORS, "int32": 0.0}, special_inputs=()),
        outputs=("topk_weights", "topk_ids"),
        out_arg=None,
        kernels=(_moe_topk_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: [1, 2, 4, 8, 16, 32],
    )
)
MOE_TOPK.add_variant(
    Variant("kernelab", moe_topk_triton, "triton", description="Triton, k passes of argmax")
)
MOE_TOPK.add_torch(moe_topk_torch)
