"""What a model costs before anything runs: every op of a decoder layer and of the whole model,
with its FLOPs, minimum bytes and floor on a device of the hardware table.

    from kernelab.workloads import model_cost
    c = model_cost.cost("llama3-8b", "h200", cost.Workload(batch=64, context=8192))
    c.decode.floor_s, c.decode.tokens_per_s, c.kv_bytes_per_token, c.fit

Each op is costed by the cost model its kernelab declaration carries (``Op.cost``), on the
inputs the op itself would make for that shape (meta tensors: shapes and dtypes, nothing
allocated), so a change to an op's cost model shows here and nowhere needs a second copy of
its formula. The three steps kernelab has no op for (the embedding gather, sampling) have
their cost functions here, written the same way; the lm head is a GEMM and is costed by the
gemm op. Floors are datasheet floors (``kernelab.bench.roofline.datasheet``): the larger of
FLOPs / peak and bytes / bandwidth, per op, summed over the ops of a step (they run one after
the other).

The decoder layer is the pre-norm block of the architectures kernelab patches
(``kernelab.models._arch``), as a serving engine runs it with kernelab's kernels:

    rmsnorm(+residual) → qkv GEMM → rope → kv_cache_write → attention → o GEMM
    → rmsnorm(+residual) → gate_up GEMM → silu_and_mul → down GEMM

(q, k and v as one GEMM, gate and up as one; each norm adds the residual stream in place, so
the first layer's input norm is counted with a residual it does not have: H elements per
token). Prefill attends with ``attention_prefill`` over the new tokens; decode with
``paged_attention`` over the cache. The fp8 recipe quantizes the GEMM inputs: the norms become
``rmsnorm_fp8_quant`` and the other GEMM inputs pass through ``fp8_quant``. The lm head and
sampling see only the last token of each sequence. The mxfp4 recipe is weight-only, as gpt-oss
is served: the projections run ``mx_gemm`` on bf16 activations (a projection whose K is not a
multiple of 32 stays on the bf16 ``gemm``, as ``patch(quantize="mxfp4")`` keeps it dense; a
projection's bias, added after the GEMM, is not costed). Sliding windows are not modelled (every
key is read). In a mixture of experts the routed layers replace the dense MLP with

    router GEMM → moe_topk → fused_moe (align, gate_up, silu_and_mul, down, weighted sum,
    and the shared expert if the model has one)

(``fused_moe_w4a16`` under the w4a16 recipe, ``fused_moe_fp8`` — block-scaled e4m3 experts,
activations quantized per 128 columns inside it — under fp8, where the norm before a routed
block writes bf16 for the router and the op, ``fused_moe_mxfp4`` under mxfp4 — bf16 on experts
whose H or I is not a multiple of 32; kernelab has no int8 MoE op, so w8a16 is refused
for an MoE config, and w4a16 and mxfp4 are refused with a shared expert), costed by those
ops' own models: an expert's weights are read once if any token routes to it, so decode at a
small batch reads only the experts hit.
The memory footprint counts every expert. Multi-head latent attention (DeepSeek-V2/V3) is
refused: it is not the grouped-query attention modelled here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

from kernelab.core.contract import Cost
from kernelab.workloads.model_config import (
    ACTIVATIONS,
    WORKLOAD_KEYS,
    CostError,
    ModelConfig,
    _int_text,
    _positive_int,
    load_config,
)

#: GEMM precision recipes: the op each runs on, and the dtype whose peak bounds its FLOPs.
RECIPES = ("bf16", "fp8", "w4a16", "w8a16", "mxfp4")
KV_DTYPES = ("bf16", "fp8")
_GEMM_OP = {"bf16": "gemm", "fp8": "fp8_gemm", "w4a16": "w4a16_gemm", "w8a16": "w8a16_gemm",
            "mxfp4": "mx_gemm"}  # fmt: skip
#: Inputs of the ops that are weights (read from memory at every call, stored once).
_WEIGHT_ARGS = ("b", "qweight", "scales", "zeros", "scale_b", "weight", "bias", "w1", "w2",
                "shared_w1", "shared_w2", "w1_qweight", "w1_scales", "w1_zeros", "w2_qweight",
                "w2_scales", "w2_zeros", "w1_scale", "w2_scale", "shared_w1_scale",
                "shared_w2_scale", "b_scale")  # fmt: skip
#: The MoE op of each GEMM recipe (None: kernelab has none).
_MOE_OP = {
    "bf16": "fused_moe",
    "w4a16": "fused_moe_w4a16",
    "fp8": "fused_moe_fp8",
    "w8a16": None,
    "mxfp4": "fused_moe_mxfp4",
}
#: The scale block of mxfp4 (K of its GEMMs and H, I of its experts are multiples of it).
MX_BLOCK = 32
#: The ops of a step that run once per model, not once per layer.
MODEL_OPS = ("embedding", "final_norm", "lm_head", "sampling")
#: A KV-cache block, in tokens (vLLM's default).
BLOCK_SIZE = 16
ACT_DTYPE = torch.bfloat16


# --- the workload and the device -------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A prefill of ``prefill`` tokens (one sequence) and a decode step of ``batch`` sequences
    at ``context`` keys each (the new one included); GEMMs in ``recipe``, the KV cache in
    ``kv``."""

    batch: int = 1
    context: int = 8192
    prefill: int = 2048
    recipe: str = "bf16"
    kv: str = "bf16"

    def __post_init__(self):
        for name in ("batch", "context", "prefill"):
            _positive_int(f"workload: {name}", getattr(self, name))
        if self.recipe not in RECIPES:
            raise CostError(f"recipe: expected one of {', '.join(RECIPES)}, got {self.recipe!r}")
        if self.kv not in KV_DTYPES:
            raise CostError(f"kv: expected one of {', '.join(KV_DTYPES)}, got {self.kv!r}")

    def with_values(self, changes: Mapping[str, str]) -> Workload:
        out: dict = {}
        for key, text in changes.items():
            out[key] = _int_text(key, text) if key in ("batch", "context", "prefill") else text
        try:
            return replace(self, **out)
        except CostError as exc:
            raise CostError(f"set: {exc}") from None


def device_spec(name):
    """The hardware table's entry for ``name`` (any device of the table), or a clear error."""
    from kernelab.hardware import DEVICES, DeviceSpec, lookup

    if isinstance(name, DeviceSpec):
        return name
    spec = lookup(name) if isinstance(name, str) and name.strip() else None
    if spec is None:
        known = ", ".join(s.aliases[0] if s.aliases else s.name for s in DEVICES)
        raise CostError(f"device: expected a device of the hardware table ({known}), got {name!r}")
    return spec


# --- one op of a step ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OpCost:
    """One op of a step: per call, and how many calls the step makes."""

    name: str  # its role: qkv_proj, attention, ...
    op: str  # the kernelab op that runs it ("" for the steps kernelab has no op for)
    calls: int  # per step: num_hidden_layers for a layer op, 1 for a model op
    flops: float  # per call
    bytes: float  # per call
    floor_s: float  # per call
    bound: str
    weight_bytes: float = 0.0  # per call: the part of ``bytes`` that is weights
    kv_bytes: float = 0.0  # per call: the part of ``bytes`` that is the KV cache
    #: the op's shape for this row (``op.inputs(shape, dtype, device)`` makes real inputs)
    shape: Any = field(default=None, compare=False, repr=False)

    @property
    def total_s(self) -> float:
        return self.calls * self.floor_s


@dataclass
class Step:
    """A prefill or a decode step: its ops in order and their sum."""

    phase: str  # "prefill" | "decode"
    batch: int
    tokens: int  # new tokens in the step
    context: int
    ops: list[OpCost] = field(default_factory=list)

    @property
    def floor_s(self) -> float:
        return sum(o.total_s for o in self.ops)

    @property
    def flops(self) -> float:
        return sum(o.calls * o.flops for o in self.ops)

    @property
    def bytes(self) -> float:
        return sum(o.calls * o.bytes for o in self.ops)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second at this floor (decode: one per sequence per step)."""
        out = self.batch if self.phase == "decode" else self.tokens
        return out / self.floor_s if self.floor_s else math.inf

    def as_dict(self) -> dict:
        return {
            "phase": self.phase,
            "batch": self.batch,
            "tokens": self.tokens,
            "context": self.context,
            "floor_s": self.floor_s,
            "flops": self.flops,
            "bytes": self.bytes,
            "tokens_per_s": self.tokens_per_s,
            "ops": [_op_dict(o) for o in self.ops],
        }


def _op_dict(o: OpCost) -> dict:
    out = {f.name: getattr(o, f.name) for f in fields(o) if f.name != "shape"}
    out["shape"] = None if o.shape is None else o.shape.as_dict()
    return {**out, "total_s": o.total_s}


@dataclass
class ModelCost:
    config: ModelConfig
    workload: Workload
    device: str
    ceiling_source: str
    prefill: Step
    decode: Step
    weight_bytes: float
    kv_bytes_per_token: float
    fit: dict

    def as_dict(self) -> dict:
        return {
            "config": asdict(self.config),
            "workload": asdict(self.workload),
            "device": self.device,
            "ceiling_source": self.ceiling_source,
            "weight_bytes": self.weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "fit": self.fit,
            "prefill": self.prefill.as_dict(),
            "decode": self.decode.as_dict(),
        }


# --- costing ------------------------------------------------------------------------------


def _shape(label, dims, params=None):
    from kernelab.core import Shape

    return Shape(label, dims, params or {})


def _op_cost(op_name: str, shape, dtype, host=None) -> tuple[Cost, dict]:
    """The op's own cost model on the inputs it makes for ``shape`` (meta tensors), with
    ``host`` replacing inputs a cost model reads values of (sequence lengths)."""
    from kernelab import ops as _ops  # noqa: F401 (registers the ops)
    from kernelab.core.op import get

    op = get(op_name)
    inputs = op.inputs(shape, dtype, "meta")
    inputs.update(host or {})
    return op.cost(inputs), inputs


def _nbytes(t) -> float:
    return float(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0.0


def _row(name, op_name, calls, cost: Cost, ceilings, dtype, inputs=None, shape=None) -> OpCost:
    from kernelab.bench.roofline import roofline

    r = roofline(cost, 1.0, ceilings, dtype)
    weights = sum(_nbytes((inputs or {}).get(k)) for k in _WEIGHT_ARGS)
    return OpCost(
        name,
        op_name,
        calls,
        float(cost.flops),
        float(cost.bytes),
        float(r["floor_s"] or 0.0),
        r["bound"] or "memory",
        weights,
        0.0,
        shape,
    )


def embedding_cost(tokens: int, hidden: int, element_size: int) -> Cost:
    """Gather ``tokens`` rows of the embedding table: read each row and its int64 id once,
    write the row into the hidden states; no arithmetic."""
    return Cost(flops=0.0, bytes=float(tokens * (2 * hidden * element_size + 8)))


def sampling_cost(rows: int, vocab: int, element_size: int) -> Cost:
    """Draw one token per row from its logits (temperature, softmax, a draw): read the logits
    once, write one int64 token; per logit a scale, a max, an exponential and a sum (4)."""
    return Cost(flops=float(4 * rows * vocab), bytes=float(rows * (vocab * element_size + 8)))


def _gemm(name, m, n, k, recipe, ceilings, calls, bias: bool = False) -> OpCost:
    if recipe == "mxfp4" and k % MX_BLOCK:
        recipe = "bf16"  # kept dense, as the patch keeps it
    op_name = _GEMM_OP[recipe]
    params = {"layout": "nk", "bias": bias, "residual": False}
    if recipe == "w4a16":
        params["group_size"] = 128
    if recipe == "fp8":
        params = {"bias": bias, "scaling": "row"}
    if recipe == "mxfp4":
        params = {"fmt": "mxfp4", "quantize_a": False}
    shape = _shape(name, {"M": m, "N": n, "K": k}, params)
    cost, inputs = _op_cost(op_name, shape, ACT_DTYPE)
    peak_dtype = torch.float8_e4m3fn if recipe == "fp8" else ACT_DTYPE
    return _row(name, op_name, calls, cost, ceilings, peak_dtype, inputs, shape)


def _norm(name, rows, cols, fp8: bool, ceilings, calls) -> OpCost:
    op_name = "rmsnorm_fp8_quant" if fp8 else "rmsnorm"
    shape = _shape(name, {"rows": rows, "cols": cols}, {"residual": True})
    cost, inputs = _op_cost(op_name, shape, ACT_DTYPE)
    return _row(name, op_name, calls, cost, ceilings, ACT_DTYPE, inputs, shape)


def _simple(name, op_name, dims, params, ceilings, calls, host=None) -> OpCost:
    shape = _shape(name, dims, params)
    cost, inputs = _op_cost(op_name, shape, ACT_DTYPE, host)
    return _row(name, op_name, calls, cost, ceilings, ACT_DTYPE, inputs, shape)


def _block_of(config: ModelConfig, recipe: str = "bf16") -> str:
    """Which decoder block costs this config: "dense", or "moe" (its routed layers run the
    router, moe_topk and the recipe's MoE op in place of the dense MLP)."""
    if not config.num_local_experts or not config.moe_layers:
        return "dense"
    if _MOE_OP[recipe] is None:
        raise CostError(
            f"config {config.name}: recipe {recipe}: kernelab has no {recipe} MoE op (the "
            "experts run on fused_moe in bf16, fused_moe_w4a16, fused_moe_fp8 or "
            "fused_moe_mxfp4); use recipe bf16, w4a16, fp8 or mxfp4"
        )
    if config.shared_expert_intermediate_size and recipe in ("w4a16", "mxfp4"):
        raise CostError(
            f"config {config.name}: recipe {recipe}: {_MOE_OP[recipe]} has no shared expert; "
            "use recipe bf16"
        )
    return "moe"


def _mlp_rows(config: ModelConfig, w: Workload, tokens: int, ceilings, layers: int) -> list:
    """The dense MLP of ``layers`` layers: gate_up GEMM, the activation, down GEMM (fp8:
    the down GEMM's input quantized)."""
    c, fp8 = config, w.recipe == "fp8"
    act = ACTIVATIONS[c.hidden_act]
    params = {"approximate": "tanh"} if act == "gelu_and_mul" else {}
    i, h = c.intermediate_size, c.hidden_size
    rows = [
        _gemm("gate_up", tokens, 2 * i, h, w.recipe, ceilings, layers),
        _simple("act_mul", act, {"rows": tokens, "d": i}, params, ceilings, layers),
    ]
    if fp8:
        rows.append(
            _simple("down_quant", "fp8_quant", {"rows": tokens, "cols": i},
                    {"per_token": True}, ceilings, layers)
        )  # fmt: skip
    rows.append(_gemm("down", tokens, h, i, w.recipe, ceilings, layers))
    return rows


def _moe_rows(config: ModelConfig, w: Workload, tokens: int, ceilings, layers: int) -> list:
    """The routed MLP of ``layers`` layers: router GEMM (bf16: routers are not quantized),
    top-k, and the experts through the recipe's MoE op."""
    c = config
    e, k, h = c.num_local_experts, c.num_experts_per_tok, c.hidden_size
    rows = [
        _gemm("router", tokens, e, h, "bf16", ceilings, layers),
        _simple("topk", "moe_topk", {"tokens": tokens, "experts": e},
                {"top_k": k, "scoring": c.moe_scoring, "renormalize": c.moe_renormalize},
                ceilings, layers),
    ]  # fmt: skip
    dims = {"tokens": tokens, "experts": e, "topk": k, "hidden": h,
            "intermediate": c.moe_intermediate_size or c.intermediate_size}  # fmt: skip
    params: dict = {}
    if c.shared_expert_intermediate_size:
        dims["shared_intermediate"] = c.shared_expert_intermediate_size
        params["shared"] = True
    if w.recipe == "w4a16":
        params["group_size"] = 128
    op_name = _MOE_OP[w.recipe]
    if op_name == "fused_moe_mxfp4" and (h % MX_BLOCK or dims["intermediate"] % MX_BLOCK):
        op_name = "fused_moe"  # the experts stay 16-bit, as the patch keeps them
    rows.append(_simple("experts", op_name, dims, params, ceilings, layers))
    return rows


def _step(config: ModelConfig, w: Workload, phase: str, ceilings) -> Step:
    c = config
    hq, hkv, d, h = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
    layers = c.num_hidden_layers
    if phase == "decode":
        seqs, tokens, context = w.batch, w.batch, w.context
    else:
        seqs, tokens, context = 1, w.prefill, w.prefill
    fp8 = w.recipe == "fp8"
    kv_fp8 = w.kv == "fp8"
    L = layers
    es = torch.finfo(ACT_DTYPE).bits // 8
    embed = _row("embedding", "", 1, embedding_cost(tokens, h, es), ceilings, ACT_DTYPE)
    ops = [
        embed,
        _norm("in_norm", tokens, h, fp8, ceilings, L),
        _gemm("qkv", tokens, (hq + 2 * hkv) * d, h, w.recipe, ceilings, L, c.qkv_bias),
        _simple(
            "rope",
            "rope",
            {"tokens": tokens, "heads_q": hq, "heads_k": hkv, "head_dim": d, "rot": d},
            {"is_neox": True},
            ceilings,
            L,
        ),
        _simple(
            "kv_write",
            "kv_cache_write",
            {
                "tokens": tokens,
                "heads_kv": hkv,
                "head_dim": d,
                "block_size": BLOCK_SIZE,
                "num_blocks": -(-tokens // BLOCK_SIZE) + 1,
            },
            {"fp8": kv_fp8},
            ceilings,
            L,
        ),
    ]
    if phase == "decode":
        att = _simple(
            "attention",
            "paged_attention",
            {
                "batch": seqs,
                "heads_q": hq,
                "heads_kv": hkv,
                "head_dim": d,
                "block_size": BLOCK_SIZE,
                "context": context,
                "window": 0,
                "chunk": 0,
            },
            {"softcap": None, "sinks": False, "fp8": kv_fp8},
            ceilings,
            L,
            # The cost model reads the lengths' values: give them on the host.
            host={
                "seq_lens": torch.full((seqs,), context, dtype=torch.int32),
                "cu_seqlens_q": torch.arange(seqs + 1, dtype=torch.int32),
            },
        )
        kv_read = 2 * seqs * context * hkv * d * (1 if kv_fp8 else 2)
        att = replace(att, kv_bytes=float(kv_read))
    else:
        att = _simple(
            "attention",
            "attention_prefill",
            {"seqs": 1, "ctx": tokens, "heads_q": hq, "heads_kv": hkv, "head_dim": d},
            {"q_lens": (tokens,), "k_lens": (tokens,)},
            ceilings,
            L,
        )
    ops.append(att)
    if fp8:
        ops.append(
            _simple(
                "o_quant",
                "fp8_quant",
                {"rows": tokens, "cols": hq * d},
                {"per_token": True},
                ceilings,
                L,
            )
        )
    ops.append(_gemm("o_proj", tokens, h, hq * d, w.recipe, ceilings, L, c.o_bias))
    routed = c.moe_layers if _block_of(c, w.recipe) == "moe" else 0
    if fp8 and routed:
        # fused_moe_fp8 quantizes its own input (per 128 columns) and the router reads bf16:
        # the norm before a routed block writes bf16 (the dense layers' norm quantizes)
        ops.append(_norm("post_norm", tokens, h, False, ceilings, routed))
        if L - routed:
            ops.append(_norm("dense_post_norm", tokens, h, True, ceilings, L - routed))
    else:
        ops.append(_norm("post_norm", tokens, h, fp8, ceilings, L))
    if L - routed:
        ops.extend(_mlp_rows(c, w, tokens, ceilings, L - routed))
    if routed:
        ops.extend(_moe_rows(c, w, tokens, ceilings, routed))
    # The model's own ops: final norm, lm head (bf16, last tokens only), sampling.
    ops.append(_norm("final_norm", tokens, h, False, ceilings, 1))
    ops.append(_gemm("lm_head", seqs, c.vocab_size, h, "bf16", ceilings, 1))
    ops.append(_row("sampling", "", 1, sampling_cost(seqs, c.vocab_size, es), ceilings, ACT_DTYPE))
    return Step(phase, seqs, tokens, context, ops)


def _weights(config: ModelConfig, decode: Step, element_size: int) -> float:
    """Bytes of the weights: every layer op's weights once per layer, the embedding table and
    the lm head (once if tied), the final norm."""
    layers = sum(o.calls * o.weight_bytes for o in decode.ops if o.name not in MODEL_OPS)
    table = config.vocab_size * config.hidden_size * element_size
    head = next(o.weight_bytes for o in decode.ops if o.name == "lm_head")
    final = next(o.weight_bytes for o in decode.ops if o.name == "final_norm")
    return (
        layers  # each layer op's weights times the layers it runs in
        + table
        + (0 if config.tie_word_embeddings else head)
        + final
    )


def kv_bytes_per_token(config: ModelConfig, kv: str = "bf16") -> int:
    """Bytes of KV cache one token holds: a key and a value per KV head and layer."""
    es = 1 if kv == "fp8" else 2
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * es


def cost(config, device="h200", workload: Workload | None = None) -> ModelCost:
    """Cost ``config`` (a preset, a config.json path, a dict, a transformers config) for
    ``workload`` on ``device`` (any device of the hardware table)."""
    from kernelab.bench.roofline import datasheet

    config = load_config(config)
    workload = workload or Workload()
    spec = device_spec(device)
    _block_of(config, workload.recipe)
    ceilings = datasheet(spec)
    prefill = _step(config, workload, "prefill", ceilings)
    decode = _step(config, workload, "decode", ceilings)
    es = torch.finfo(ACT_DTYPE).bits // 8
    weights = _weights(config, decode, es)
    per_token = kv_bytes_per_token(config, workload.kv)
    # The table's memory size is read as GiB, as device detection measures it (an H200:
    # 141, against the 143771 MiB its driver reports).
    memory = spec.memory_gb * 2**30
    free = memory - weights
    tokens = int(free // per_token) if free > 0 else 0
    fit = {
        "memory_bytes": memory,
        "weights_fit": free > 0,
        "free_bytes": max(free, 0.0),
        "kv_tokens": tokens,
        "max_batch_at_context": tokens // workload.context,
        "max_context_at_batch": tokens // workload.batch,
        "note": "beside the weights only: activations, workspace and fragmentation not counted",
    }
    return ModelCost(
        config,
        workload,
        spec.name,
        ceilings.source(ACT_DTYPE),
        prefill,
        decode,
        weights,
        float(per_token),
        fit,
    )


# --- side by side --------------------------------------------------------------------------


def diff(a: ModelCost, b: ModelCost, phase: str = "decode") -> dict:
    """Per op and in total, ``b`` against ``a`` for one phase: floors, bytes, ratios, and a
    sentence naming the op that moved the most."""
    sa, sb = getattr(a, phase), getattr(b, phase)
    rows = []
    by_name = {o.name: o for o in sa.ops}
    for ob in sb.ops:
        oa = by_name.get(ob.name)
        rows.append(
            {
                "name": ob.name,
                "op_a": oa.op if oa else None,
                "op_b": ob.op,
                "a_s": oa.total_s if oa else 0.0,
                "b_s": ob.total_s,
                "a_bytes": oa.calls * oa.bytes if oa else 0.0,
                "b_bytes": ob.calls * ob.bytes,
                "a_flops": oa.calls * oa.flops if oa else 0.0,
                "b_flops": ob.calls * ob.flops,
                "ratio": ob.total_s / oa.total_s if oa and oa.total_s else None,
                "delta_s": ob.total_s - (oa.total_s if oa else 0.0),
            }
        )
    for oa in sa.ops:
        if oa.name not in {r["name"] for r in rows}:
            rows.append(
                {
                    "name": oa.name,
                    "op_a": oa.op,
                    "op_b": None,
                    "a_s": oa.total_s,
                    "b_s": 0.0,
                    "a_bytes": oa.calls * oa.bytes,
                    "b_bytes": 0.0,
                    "a_flops": oa.calls * oa.flops,
                    "b_flops": 0.0,
                    "ratio": 0.0,
                    "delta_s": -oa.total_s,
                }
            )
    total_a, total_b = sa.floor_s, sb.floor_s
    top = max(rows, key=lambda r: abs(r["delta_s"]))
    what = "decode step floor" if phase == "decode" else "prefill floor"
    change = (total_b / total_a - 1) if total_a else 0.0
    line = f"{what} {_ms(total_a)} → {_ms(total_b)} ms ({_signed_pct(change)})"
    if abs(top["delta_s"]) > 0:
        line += f", of which {top['name']} {_signed_ms(top['delta_s'])} ms"
    return {
        "phase": phase,
        "a": a.config.name,
        "b": b.config.name,
        "a_floor_s": total_a,
        "b_floor_s": total_b,
        "ratio": total_b / total_a if total_a else None,
        "summary": line,
        "ops": rows,
    }


def _ms(s: float) -> str:
    """Milliseconds to three significant digits, trailing zeros kept (2.00, 17.6, 301)."""
    ms = s * 1e3
    return f"{ms:.0f}" if abs(ms) >= 100 else f"{ms:#.3g}"


def _signed_ms(s: float) -> str:
    return ("+" if s > 0 else "−") + _ms(abs(s))


def _signed_pct(x: float) -> str:
    return ("+" if x > 0 else "−" if x < 0 else "±") + f"{abs(x) * 100:.0f}%"


__all__ = [
    "WORKLOAD_KEYS",
    "CostError",
    "ModelConfig",
    "ModelCost",
    "OpCost",
    "Step",
    "Workload",
    "cost",
    "diff",
    "kv_bytes_per_token",
    "load_config",
]
