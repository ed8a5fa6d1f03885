"""What the mixture-of-experts ops' declarations share: the per-expert reference loop, the
model shapes and edge cases, inputs (routing, activations, weights) and the cost model. Layouts
as ``_common`` describes them.
"""

from __future__ import annotations

import math

import torch

from kernelab.core import Cost, Shape
from kernelab.core.runtime import inputs as _inputs

# --- the reference loop -----------------------------------------------------------------------


def silu_mul(h: torch.Tensor, n: int, held=None) -> torch.Tensor:
    """silu(gate) · up of h = [gate | up] (n columns each), in h's dtype, rounded once to
    ``held`` and back when given: the intermediate as a kernel that stores it in ``held``
    holds it (values past that format's range become ±Inf)."""
    g, u = h[:, :n], h[:, n:]
    inner = g * torch.sigmoid(g) * u
    return inner if held is None else inner.to(held).to(h.dtype)


def expert_loop(x, topk_weights, topk_ids, experts, w1_of, w2_of, out=None, held=None):
    """Σ over each token's top-k of weight · down(silu(gate(x)) · up(x)), one expert at a time:
    ``w1_of(e)`` [H, 2I] and ``w2_of(e)`` [I, H] (x·W layouts), in x's dtype; the
    intermediate rounded to ``held`` when given (see ``silu_mul``)."""
    t, h = x.shape
    y = torch.zeros((t, h), dtype=x.dtype, device=x.device)
    for e in range(experts):
        tok, slot = torch.where(topk_ids == e)
        if tok.numel() == 0:
            continue
        w1, w2 = w1_of(e), w2_of(e)
        inner = silu_mul(x[tok] @ w1, w1.shape[1] // 2, held)
        part = (inner @ w2) * topk_weights[tok, slot, None].to(x.dtype)
        y.index_add_(0, tok, part)
    return y if out is None else out.copy_(y)


# --- shapes, inputs, cost -------------------------------------------------------------------

#: Mixture-of-experts layers of public models (experts, top-k, hidden, expert intermediate,
#: shared-expert intermediate), from each model's config.json on the Hugging Face hub
#: (mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B, deepseek-ai/DeepSeek-V3:
#: n_routed_experts 256, num_experts_per_tok 8, moe_intermediate_size 2048, n_shared_experts 1).
MOE_MODELS = (
    ("mixtral-8x7b", 8, 2, 4096, 14336, 0),
    ("qwen3-30b-a3b", 128, 8, 2048, 768, 0),
    ("deepseek-v3", 256, 8, 7168, 2048, 2048),
)
#: Tokens per step: decode at 1, 16 and 64 sequences, a 4096-token prefill.
MOE_TOKENS = (1, 16, 64, 4096)
#: Sizes a representative shape is cut to through the interpreter: 16 experts (top-k stays),
#: K multiples of both int4 group sizes.
INTERPRETER_DIMS = {"experts": 16, "hidden": 128, "intermediate": 128, "shared_intermediate": 64}


def representative(models=MOE_MODELS, **params) -> list[Shape]:
    shapes = []
    for name, e, k, h, i, si in models:
        for t in MOE_TOKENS:
            phase = "decode" if t <= 64 else "prefill"
            dims = {"tokens": t, "experts": e, "topk": k, "hidden": h, "intermediate": i}
            p = dict(params)
            if si:
                dims["shared_intermediate"] = si
                p["shared"] = True
            shapes.append(
                Shape(
                    f"{name} {phase} T={t} E={e} k={k} {h}x{i}",
                    dims,
                    p,
                    batch_dim="tokens",
                    reduce_to={n: v for n, v in INTERPRETER_DIMS.items() if n in dims},
                )
            )
    return shapes


def edge(multiple: int = 16, **params) -> list[Shape]:
    """Small cases at the regime boundaries; ``multiple``: what H and I must be multiples of
    (64 for int4 groups)."""
    m = multiple

    def r(v):
        return max(m, v // m * m)

    cases = [
        ("an expert gets no tokens", 5, 4, 2, 64, 32, {"idle_expert": 1}),
        ("all tokens to one expert", 7, 4, 2, 64, 48, {"one_expert": 2}),
        ("top-k = experts", 3, 4, 4, 32, 32, {}),
        ("counts not a multiple of the block", 37, 3, 1, 96, 80, {}),
        ("one token", 1, 8, 2, 64, 64, {}),
        ("shared expert", 6, 4, 2, 64, 32, {"shared": True}),
        ("non-contiguous x", 9, 4, 2, 64, 32, {"x_pad": 7}),
        ("empty", 0, 4, 2, 64, 32, {}),
    ]
    shapes = []
    for label, t, e, k, h, i, p in cases:
        dims = {"tokens": t, "experts": e, "topk": k, "hidden": r(h), "intermediate": r(i)}
        if p.get("shared"):
            dims["shared_intermediate"] = r(48)
        lab = f"{label} T={t} E={e} k={k} {dims['hidden']}x{dims['intermediate']}"
        shapes.append(Shape(lab, dims, {**p, **params}, batch_dim="tokens"))
    return shapes


def topk_select(logits: torch.Tensor, k: int, eligible: torch.Tensor | None = None) -> torch.Tensor:
    """The k largest per row, ties to the lower index (a stable sort), as int64. A NaN ranks
    as −inf (tied with it). With ``eligible`` (bool, the logits' shape), every eligible entry
    ranks above every other, whatever the values (an eligible −inf above an ineligible one)."""
    key = torch.where(torch.isnan(logits), float("-inf"), logits)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    if eligible is not None:
        shut = (~eligible.gather(1, order)).to(torch.int8)
        order = order.gather(1, torch.sort(shut, dim=-1, stable=True).indices)
    return order[:, :k]


def routing(shape: Shape, device, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_weights (float32) and topk_ids (int32) as a softmax router with renormalisation
    gives them: the top-k of random logits, and the softmax over the chosen logits (softmax
    over all experts renormalised over the top-k is exactly that). ``idle_expert`` never
    chosen, ``one_expert`` always chosen (the selection sees a biased logit; the weights the
    unbiased one, so every expert's part keeps its weight)."""
    d, p = shape.dims, shape.params
    t, e, k = d["tokens"], d["experts"], d["topk"]
    logits = _inputs.randn((t, e), torch.float32, gen.device, gen).cpu()
    select = logits.clone()
    if "idle_expert" in p:
        select[:, p["idle_expert"]] = -1e4
    if "one_expert" in p:
        select[:, p["one_expert"]] = 1e4
    ids = topk_select(select, k)
    weights = torch.softmax(logits.gather(1, ids), dim=-1)
    if torch.device(device).type == "meta":  # static analysis, floors: the ids stay on the
        # CPU, where the cost model counts the experts they reach
        return torch.empty((t, k), dtype=torch.float32, device=device), ids.to(torch.int32)
    return weights.to(device), ids.to(device=device, dtype=torch.int32)


def activations(shape: Shape, dtype, device, gen, dist) -> torch.Tensor:
    x = _inputs.randn((shape.dims["tokens"], shape.dims["hidden"]), dtype, device, gen, dist)
    if shape.params.get("x_pad"):
        x = _inputs.strided_rows(x, shape.params["x_pad"])
    return x


def dense_weight(e, n, k, dtype, device, gen) -> torch.Tensor:
    """[E, N, K] as an nn.Linear's, scaled by 1/sqrt(K) as trained layers are."""
    return _inputs.randn((e, n, k), dtype, device, gen, "normal", scale=1.0 / math.sqrt(k))


def experts_hit(topk_ids: torch.Tensor, experts: int) -> int:
    """Distinct experts the routing reaches (min(E, T·k) when the ids are not known: meta)."""
    if topk_ids.device.type == "meta":  # a caller's own meta ids
        return min(experts, topk_ids.numel())
    ids = topk_ids[(topk_ids >= 0) & (topk_ids < experts)]
    return int(torch.unique(ids).numel())


def cost(
    x,
    topk_ids,
    experts,
    intermediate,
    bytes_per_expert,
    shared_intermediate=0,
    shared_bytes=0,
    extra_bytes=0,
) -> Cost:
    """FLOPs of the routed pairs only (2·T·k·3·H·I for gate, up and down, plus the shared
    expert's 6·T·H·Is); bytes: the weights of the experts the routing hits (each read once),
    x, the routing, and out. The [T·k, I] intermediate is not counted: a kernel could keep it
    on chip, so it is not part of the floor."""
    t, h = x.shape
    pairs = topk_ids.numel()
    flops = 6 * pairs * h * intermediate + 6 * t * h * shared_intermediate
    nbytes = experts_hit(topk_ids, experts) * bytes_per_expert + shared_bytes + extra_bytes
    nbytes += 2 * t * h * x.element_size() + pairs * (topk_ids.element_size() + 4)
    return Cost(flops=flops, bytes=nbytes)
