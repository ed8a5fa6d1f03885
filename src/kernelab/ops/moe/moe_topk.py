"""Router logits → each token's top-k experts and their routing weights.

    ids[t]      = the k experts with the largest logits[t, :] (ties: the lower expert first)
    weights[t]  = softmax(logits[t])[ids[t]]   or   sigmoid(logits[t, ids[t]])
                  (÷ their sum with ``renormalize``), × ``routed_scaling_factor``

Softmax and sigmoid are increasing, so the experts with the largest scores are the experts with
the largest logits: selecting on the logits (exact in the input's dtype) picks the same experts
as selecting on the scores, without a rounding of the scores deciding a near tie. Mixtral
(softmax, renormalised), Qwen3-MoE (softmax, ``norm_topk_prob``) and the sigmoid routers are
covered that way.

DeepSeek-V3's grouped selection (``n_group`` > 1 and/or a ``bias``, its
``e_score_correction_bias``): the selection key is c = float32(score) + bias, the score s the
softmax or sigmoid of the logits rounded to float32 (transformers' router computes in float32);
the E experts form ``n_group`` groups of E / n_group consecutive experts, each group scored by
the sum of its two largest keys (in float32); the ``topk_group`` best groups are kept and the k
largest keys among their experts chosen. The weights are the *unbiased* scores s of the chosen
experts (renormalised if asked, then × ``routed_scaling_factor``): the bias only steers the
choice. This is transformers' ``DeepseekV3TopkRouter`` (5.x: experts of dropped groups masked to
−inf, ``norm_topk_prob``, then the scaling factor), except that its renormalisation adds 1e-20
to the sum (a sum of sigmoids is > 0 here) and that its ``torch.topk(sorted=False)`` leaves the
order of equal values and of the chosen experts unspecified. Here ties go to the lower group
and the lower expert, and the ids come in decreasing order of key. The kernel's float32
sigmoid may differ from the correctly rounded one by an ulp, so two keys within about 1e-7 of
each other can be ordered differently from the reference: a property of float32 routing, which
transformers shares.

NaN logits (every path, the kernel's included): a NaN selection key (a NaN logit, or the
score or biased score of one) ranks as −inf, tied with it, so ties go to the lower expert as
everywhere; the weights are the scoring's own: with softmax a row holding a NaN logit has NaN
weights throughout (its softmax is NaN), with sigmoid a chosen NaN expert weighs NaN (and,
renormalised, its whole row). A +inf logit is the largest key (softmax: its row NaN, as
exp(inf − inf)).

The ladder: ``_moe_topk_kernel`` → ``moe_topk_triton`` (validate, plan, launch) → ``moe_topk``
(public), with ``moe_topk_ref`` (float64 weights) and ``moe_topk_torch`` (eager) beside it.
"""

from __future__ import annotations

import torch

from kernelab.core import (
    DEFAULT_FLOORS,
    Contract,
    Cost,
    Op,
    Sampling,
    Shape,
    Variant,
    register,
)
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan, cdiv
from kernelab.core.runtime.triton import next_pow2, use_triton
from kernelab.ops.moe import _spec as ms
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


def _select(logits, top_k, scoring, n_group, topk_group, bias):
    """The chosen experts (int64), in decreasing order of the selection key."""
    if bias is None and n_group == 1:
        return ms.topk_select(logits, top_k)
    x = logits if logits.dtype == torch.float64 else logits.float()  # scores in float32 at least
    key = (torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)).float()
    if bias is not None:
        key = key + bias.to(torch.float32)
    key = torch.where(torch.isnan(key), float("-inf"), key)  # a NaN score ranks as −inf
    if n_group > 1:
        t, e = key.shape
        top2 = key.view(t, n_group, e // n_group).sort(dim=-1, descending=True).values
        groups = ms.topk_select(top2[..., 0] + top2[..., 1], topk_group)
        kept = torch.zeros((t, n_group), dtype=torch.bool, device=key.device)
        kept.scatter_(1, groups, True)
        # only the kept groups' experts, even where one of them ranks as −inf
        return ms.topk_select(key, top_k, kept.repeat_interleave(e // n_group, dim=1))
    return ms.topk_select(key, top_k)


def moe_topk_ref(
    router_logits,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    bias=None,
    routed_scaling_factor=1.0,
    check=True,
):
    """(weights, ids): the stable sort's top-k of the logits (or of the float32 biased scores,
    within the best groups), their scores in the logits' dtype (exact when given float64)."""
    ids = _select(router_logits, top_k, scoring, n_group, topk_group, bias)
    w = _weights(router_logits, ids, scoring, renormalize) * routed_scaling_factor
    return w, ids.to(torch.int32)


def moe_topk_torch(
    router_logits,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    bias=None,
    routed_scaling_factor=1.0,
    check=True,
):
    """Eager PyTorch, as transformers' routers (float32 scores, renormalised), but with the op's
    tie order: a stable sort of the logits rather than torch.topk, whose order among equal
    values is unspecified."""
    args = (n_group, topk_group, bias, routed_scaling_factor)
    _validate(router_logits, top_k, scoring, renormalize, *args, check)
    logits = router_logits.float()
    ids = _select(logits, top_k, scoring, n_group, topk_group, bias)
    w = _weights(logits, ids, scoring, renormalize) * routed_scaling_factor
    return w, ids.to(torch.int32)


def _validate(
    router_logits,
    top_k,
    scoring,
    renormalize,
    n_group=1,
    topk_group=1,
    bias=None,
    routed_scaling_factor=1.0,
    check=True,
) -> None:
    _check.tensor("router_logits", router_logits, dtypes=_check.FLOATS, ndim=2)
    e = router_logits.shape[1]
    _check.integer("top_k", top_k, min_value=1)
    if top_k > e:
        raise ValueError(f"top_k: expected at most the number of experts ({e}), got {top_k}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: expected one of {SCORINGS}, got {scoring!r}")
    _check.boolean("renormalize", renormalize)
    _check.integer("n_group", n_group, min_value=1)
    if e % n_group:
        raise ValueError(
            f"n_group: expected a divisor of the number of experts ({e}), got {n_group}"
        )
    if n_group > 1 and e // n_group < 2:
        raise ValueError(
            f"n_group: expected groups of at least 2 experts (a group's score is the sum of its "
            f"two best), got {n_group} groups of {e // n_group}"
        )
    _check.integer("topk_group", topk_group, min_value=1)
    if topk_group > n_group:
        raise ValueError(f"topk_group: expected at most n_group ({n_group}), got {topk_group}")
    kept = topk_group * (e // n_group)
    if top_k > kept:
        raise ValueError(
            f"top_k: expected at most topk_group x experts per group ({topk_group} x "
            f"{e // n_group} = {kept}), got {top_k}"
        )
    if bias is not None:
        _check.tensor("bias", bias, dtypes=(torch.float32,), ndim=1, device=router_logits.device)
        _check.same_shape("bias", bias, (e,), "one per expert")
    _check.finite_positive("routed_scaling_factor", routed_scaling_factor)
    _check.boolean("check", check)
    if check and bias is not None and bias.numel() and bias.device.type != "meta":
        bad = ~torch.isfinite(bias)
        if bool(bad.any()):  # a device sync
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"bias: expected finite values, got {float(bias[i])} at expert {i}")


def _plan(
    router_logits,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    bias=None,
    routed_scaling_factor=1.0,
    config=None,
):
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
            # without a bias, any float32 pointer (never read)
            Bias=weights if bias is None else bias,
            stride_b=0 if bias is None else bias.stride(0),
            T=t,
            E=e,
            group_size=e // n_group,
            scaling=float(routed_scaling_factor),
            TOPK=top_k,
            SIGMOID=scoring == "sigmoid",
            RENORMALIZE=renormalize,
            HAS_BIAS=bias is not None,
            N_GROUP=n_group,
            TOPK_GROUP=topk_group,
            BLOCK_T=block_t,
            BLOCK_E=block_e,
            BLOCK_G=next_pow2(n_group),
        ),
        4,
        1,
    )
    return LaunchPlan((call,), (weights, ids))


def moe_topk_triton(
    router_logits,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    bias=None,
    routed_scaling_factor=1.0,
    check=True,
    config=None,
):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    args = (n_group, topk_group, bias, routed_scaling_factor)
    _validate(router_logits, top_k, scoring, renormalize, *args, check)
    return _plan(router_logits, top_k, scoring, renormalize, *args, config=config).run()


def moe_topk(
    router_logits,
    top_k,
    scoring="softmax",
    renormalize=True,
    n_group=1,
    topk_group=1,
    bias=None,
    routed_scaling_factor=1.0,
    check=True,
):
    """router_logits [T, E] → (weights float32 [T, top_k], ids int32 [T, top_k]), the experts
    in decreasing order of logit (of biased score with ``bias`` or groups). Triton on
    CUDA/ROCm; torch on CPU (interpreter with KERNELAB_INTERPRET=1).

    DeepSeek-V3's router: ``scoring="sigmoid"``, ``n_group`` groups of experts of which the
    ``topk_group`` best (by the sum of their two largest biased scores) are kept, ``bias`` the
    float32 [E] ``e_score_correction_bias`` (selection only), ``routed_scaling_factor``
    multiplying the weights (after the renormalisation). ``check``: read the bias on the
    host, every value finite (a device sync; off for a bias known good and inside a CUDA
    graph; unchecked, a NaN biased score ranks as −inf as the module docstring says, and an
    infinite bias decides the choice by itself). See the module docstring.
    """
    args = (n_group, topk_group, bias, routed_scaling_factor)
    if isinstance(router_logits, torch.Tensor) and use_triton(router_logits):
        return moe_topk_triton(router_logits, top_k, scoring, renormalize, *args, check)
    return moe_topk_torch(router_logits, top_k, scoring, renormalize, *args, check)


# --- the declaration ---------------------------------------------------------------------------


#: DeepSeek-V3's router (config.json): 8 groups of 32 experts, the best 4 kept, weights × 2.5.
DEEPSEEK_V3_GROUPS = {"n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "bias": True}


def _representative() -> list[Shape]:
    shapes = []
    for name, e, k, *_ in ms.MOE_MODELS:
        for t in ms.MOE_TOKENS:
            if name.startswith("deepseek"):
                scoring, extra, what = "sigmoid", DEEPSEEK_V3_GROUPS, "sigmoid grouped 4 of 8"
            else:
                scoring, extra, what = "softmax", {}, "softmax"
            shapes.append(
                Shape(
                    f"{name} T={t} E={e} k={k} {what}",
                    {"tokens": t, "experts": e},
                    {"top_k": k, "scoring": scoring, "renormalize": True, **extra},
                    batch_dim="tokens",
                )
            )
    return shapes


def _groups(n_group, topk_group, scaling=1.0, bias=True) -> dict:
    return {"n_group": n_group, "topk_group": topk_group, "routed_scaling_factor": scaling,
            "bias": bias}  # fmt: skip


def _edge() -> list[Shape]:
    cases = [
        ("top-k = experts", 5, 8, 8, "softmax", True, {}),
        ("not renormalised", 7, 60, 4, "softmax", False, {}),
        ("sigmoid, not renormalised", 9, 16, 2, "sigmoid", False, {}),
        ("tied logits", 33, 64, 6, "softmax", True, {"ties": True}),
        ("one expert of 3", 3, 3, 1, "sigmoid", True, {}),
        ("non-contiguous rows", 6, 40, 3, "softmax", True, {"row_pad": 5}),
        ("empty", 0, 8, 2, "softmax", True, {}),
        # DeepSeek-V3's grouped selection at the edges of its arguments
        ("bias, one group", 7, 24, 3, "sigmoid", True, _groups(1, 1, 2.5)),
        ("groups of 2, top-k = the kept experts", 9, 16, 4, "sigmoid", False, _groups(8, 2, 2.5)),
        ("3 groups of 5, softmax", 11, 15, 2, "softmax", True, _groups(3, 1)),
        ("every group kept", 6, 32, 8, "sigmoid", True, _groups(4, 4, 2.5)),
        ("groups, no bias, tied logits", 20, 32, 4, "sigmoid", True,
         {**_groups(4, 2, bias=False), "ties": True}),
        ("groups, non-contiguous rows", 5, 64, 6, "sigmoid", True,
         {**_groups(8, 3, 2.5), "row_pad": 3}),
        ("groups, empty", 0, 16, 2, "sigmoid", True, _groups(4, 2)),
    ]  # fmt: skip
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
    inputs = {"router_logits": logits, "top_k": p["top_k"], "scoring": p["scoring"],
              "renormalize": p["renormalize"]}  # fmt: skip
    if "n_group" in p:
        # The correction bias: float32, a tenth of the logits' spread (comparable with the
        # spread of the sigmoid scores, so that it moves the choice without deciding it alone).
        bias = _inputs.randn((e,), torch.float32, device, gen, scale=0.1) if p["bias"] else None
        inputs.update(n_group=p["n_group"], topk_group=p["topk_group"], bias=bias,
                      routed_scaling_factor=p["routed_scaling_factor"])  # fmt: skip
    return inputs


def _cost(inputs: dict) -> Cost:
    """Read the logits (and the float32 bias) once; write float32 weights and int32 ids.
    FLOPs: the scores (one exponential per logit), k passes of comparisons over the row, and
    with groups three more (each group's two best) and the bias added."""
    logits, k = inputs["router_logits"], inputs["top_k"]
    t, e = logits.shape
    bias = inputs.get("bias")
    grouped = inputs.get("n_group", 1) > 1
    flops = (k + 2 + 3 * grouped + (bias is not None)) * t * e
    extra = 0 if bias is None else e * bias.element_size()
    return Cost(flops=flops, bytes=t * e * logits.element_size() + t * k * 8 + extra)


MOE_TOPK = register(
    Op(
        "moe_topk",
        description="router logits -> top-k experts (int32) and softmax/sigmoid weights, "
        "DeepSeek-V3 grouped selection",
        reference=moe_topk_ref,
        make_inputs=_make_inputs,
        sampling=Sampling(
            rows={"router_logits": 0, "topk_weights": 0, "topk_ids": 0}, tile={"tokens": 32}
        ),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # The ids are exact (floor 0: any wrong expert fails); the float32 weights within 2x
        # eager torch's float32 error. NaN and ±inf logits are routed as the module docstring
        # defines, the same in every path: verify plants them.
        contract=Contract(
            floors={**DEFAULT_FLOORS, "int32": 0.0}, special_inputs=("router_logits",)
        ),
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
