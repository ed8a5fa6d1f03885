"""The routed (token, slot) pairs sorted by expert, each expert's run padded to the GEMM block.

    pairs i = t·k + j of topk_ids [T, k]; for each expert e in order, its pairs in order of i,
    then the sentinel T·k up to a multiple of ``block_size``:
    sorted_token_ids [padded]: the list (the sentinel after the last run, too);
    expert_ids [padded / block_size]: the expert of each block (−1 past the runs);
    num_tokens_post_padded [1]: the length of the runs.
    padded = block_size · ⌈(T·k + min(E, T·k)·(block_size − 1)) / block_size⌉.

vLLM's ``moe_align_block_size`` layout, so that each block of the grouped GEMM holds the pairs
of one expert. An id outside [0, E) is never placed (its pair is dropped).

The ladder: ``_moe_align_kernel`` (one program) → ``moe_align_triton`` (validate, plan,
launch) → ``moe_align`` (public), with ``moe_align_ref`` (loops) and ``moe_align_torch``
(a stable sort) beside it.
"""

from __future__ import annotations

import torch

from kernelab.core import DEFAULT_FLOORS, Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime.launch import LaunchPlan
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.moe import _common as mc
from kernelab.ops.moe import _spec as ms
from kernelab.ops.moe._kernels import _moe_align_kernel

# --- reference, eager, launcher, public function ----------------------------------------------


def moe_align_ref(topk_ids, num_experts, block_size):
    """Plain loops over experts and pairs."""
    flat = [int(v) for v in topk_ids.reshape(-1).tolist()]
    numel = len(flat)
    blocks, entries = mc.align_sizes(numel, num_experts, block_size)
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        run = [i for i, v in enumerate(flat) if v == e]
        pad = -len(run) % block_size
        sorted_ids += run + [numel] * pad
        expert_ids += [e] * ((len(run) + pad) // block_size)
    used = len(sorted_ids)
    sorted_ids += [numel] * (entries - used)
    expert_ids += [-1] * (blocks - len(expert_ids))
    i32 = dict(dtype=torch.int32, device=topk_ids.device)
    return (torch.tensor(sorted_ids, **i32), torch.tensor(expert_ids, **i32),
            torch.tensor([used], **i32))  # fmt: skip


def moe_align_torch(topk_ids, num_experts, block_size):
    """Eager PyTorch: a stable sort of the pairs by expert, then a scatter into padded runs."""
    _validate(topk_ids, num_experts, block_size)
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    blocks, entries = mc.align_sizes(numel, num_experts, block_size)
    dev = topk_ids.device
    ok = (flat >= 0) & (flat < num_experts)
    counts = torch.bincount(flat[ok], minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    starts = torch.cumsum(padded, 0) - padded
    order = torch.sort(torch.where(ok, flat, num_experts), stable=True).indices[: int(ok.sum())]
    e_sorted = flat[order]
    rank = torch.arange(order.numel(), device=dev) - (torch.cumsum(counts, 0) - counts)[e_sorted]
    sorted_ids = torch.full((entries,), numel, dtype=torch.int32, device=dev)
    sorted_ids[starts[e_sorted] + rank] = order.to(torch.int32)
    expert_ids = torch.full((blocks,), -1, dtype=torch.int32, device=dev)
    runs = torch.repeat_interleave(torch.arange(num_experts, device=dev), padded // block_size)
    expert_ids[: runs.numel()] = runs.to(torch.int32)
    total = padded.sum().reshape(1).to(torch.int32)
    return sorted_ids, expert_ids, total


def _validate(topk_ids, num_experts, block_size) -> None:
    _check.tensor("topk_ids", topk_ids, dtypes=mc.INDEX_DTYPES, ndim=2)
    _check.integer("num_experts", num_experts, min_value=1)
    _check.integer("block_size", block_size, min_value=1)
    if block_size & (block_size - 1) or block_size < 16:
        raise ValueError(f"block_size: expected a power of two >= 16, got {block_size}")


def _plan(topk_ids, num_experts, block_size, config=None):
    call, aligned = mc.align_call(topk_ids, num_experts, block_size)
    result = (aligned.sorted_ids, aligned.expert_ids, aligned.num_post_padded)
    return LaunchPlan((call,), result)


def moe_align_triton(topk_ids, num_experts, block_size):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(topk_ids, num_experts, block_size)
    return _plan(topk_ids, num_experts, block_size).run()


def moe_align(topk_ids, num_experts, block_size):
    """topk_ids [T, k] → (sorted_token_ids, expert_ids, num_tokens_post_padded), int32, as
    the module docstring says. Triton on CUDA/ROCm; torch on CPU (interpreter with
    KERNELAB_INTERPRET=1)."""
    if isinstance(topk_ids, torch.Tensor) and use_triton(topk_ids):
        return moe_align_triton(topk_ids, num_experts, block_size)
    return moe_align_torch(topk_ids, num_experts, block_size)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    shapes = []
    for name, e, k, *_ in ms.MOE_MODELS:
        for t in ms.MOE_TOKENS:
            bm = mc.MoEConfig.default_for(t * k, e).block_m
            shapes.append(Shape(f"{name} T={t} E={e} k={k} block {bm}",
                                {"tokens": t, "experts": e, "topk": k}, {"block_size": bm},
                                batch_dim="tokens"))  # fmt: skip
    return shapes


def _edge() -> list[Shape]:
    cases = [
        ("an expert gets no tokens", 5, 4, 2, 16, {"idle_expert": 1}),
        ("all tokens to one expert", 40, 4, 2, 16, {"one_expert": 2}),
        ("top-k = experts", 3, 4, 4, 16, {}),
        ("counts not a multiple of the block", 37, 3, 1, 32, {}),
        ("more experts than pairs", 2, 64, 2, 16, {}),
        ("several chunks", 1500, 8, 2, 64, {}),
        ("empty", 0, 4, 2, 16, {}),
    ]
    return [Shape(f"{label} T={t} E={e} k={k} block {b}", {"tokens": t, "experts": e, "topk": k},
                  {"block_size": b, **p}, batch_dim="tokens")
            for label, t, e, k, b, p in cases]  # fmt: skip


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    _, ids = ms.routing(shape, device, gen)
    return {"topk_ids": ids, "num_experts": shape.dims["experts"],
            "block_size": shape.params["block_size"]}  # fmt: skip


def _cost(inputs: dict) -> Cost:
    """Read the ids; write the padded list, the block experts and the count (int32)."""
    ids, e, b = inputs["topk_ids"], inputs["num_experts"], inputs["block_size"]
    blocks, entries = mc.align_sizes(ids.numel(), e, b)
    return Cost(flops=0, bytes=ids.numel() * ids.element_size() + 4 * (entries + blocks + 1))


MOE_ALIGN = register(
    Op(
        "moe_align",
        description="routed pairs sorted by expert, padded to the GEMM block (vLLM's layout)",
        reference=moe_align_ref,
        make_inputs=_make_inputs,
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # Integers only: exact (floor 0).
        # Any id is valid whatever the others hold (one outside [0, E) is dropped): data.
        contract=Contract(
            floors={**DEFAULT_FLOORS, "int32": 0.0}, special_inputs=(), data_inputs=("topk_ids",)
        ),
        dtypes=(torch.bfloat16, torch.float16, torch.float32),
        outputs=("sorted_token_ids", "expert_ids", "num_tokens_post_padded"),
        out_arg=None,
        kernels=(_moe_align_kernel,),
        plan=_plan,
    )
)
MOE_ALIGN.add_variant(
    Variant("kernelab", moe_align_triton, "triton", description="Triton, one program")
)
MOE_ALIGN.add_torch(moe_align_torch)
