"""Writes the new keys and values of a step into the paged KV caches, in place.

    for each token t with slot s = slot_mapping[t] ≥ 0:
        k_cache[s // block_size, s % block_size] = k[t]        (all heads_kv × head_dim)
        v_cache[s // block_size, s % block_size] = v[t]
    a negative slot is padding (CUDA-graph batches padded to a captured size): nothing written.
    A slot past the caches (≥ num_blocks × block_size) is refused with ``check``; unchecked,
    it writes nothing either: no write ever lands outside the caches.

With a float8 e4m3 cache the values are quantized with the given per-tensor float32 scales:
``fp8(clamp(k / k_scale, ±FP8_MAX))``, rounded to nearest even (FP8_MAX = 448 for
float8_e4m3fn, 240 for float8_e4m3fnuz; the float64 reference saturates at 448).

The ladder: ``_kv_cache_write_kernel`` (``attention/_kernels.py``) → ``kv_cache_write_triton``
(validate, plan, launch) → ``kv_cache_write`` (public) with ``kv_cache_write_ref`` (float64)
and ``kv_cache_write_torch`` (eager indexing) beside it. Cache layout: ``attention/_paged.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core import Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan, cdiv
from kernelab.core.runtime.triton import next_pow2, use_triton
from kernelab.ops.attention import _paged
from kernelab.ops.attention._kernels import _kv_cache_write_kernel

# --- launch heuristics as data ----------------------------------------------------------------


@dataclass(frozen=True)
class KVWriteConfig:
    """``block_h`` heads of one token per program (both k and v), ``num_warps`` warps."""

    block_h: int
    num_warps: int

    #: Elements of k (and as many of v) a program should hold: 16 per thread over 4 warps,
    #: two 128-bit vectors of 16-bit data per tensor.
    TILE_ELEMENTS = 2048

    @classmethod
    def default_for(cls, heads: int, head_dim: int) -> KVWriteConfig:
        block_d = next_pow2(head_dim)
        block_h = max(1, min(next_pow2(heads), cls.TILE_ELEMENTS // block_d))
        return cls(block_h, max(1, min(8, block_h * block_d // 512)))

    @classmethod
    def tuning_space(cls, heads: int, head_dim: int) -> list[KVWriteConfig]:
        block_d = next_pow2(head_dim)
        space = [cls(h, w) for h in (1, 2, 4, 8, 16) if h <= next_pow2(heads) for w in (1, 2, 4, 8)]
        return [c for c in space if 4 <= c.block_h * block_d // (32 * c.num_warps) <= 64] or [
            cls.default_for(heads, head_dim)
        ]


# --- reference, eager, launcher, public function ----------------------------------------------


def _quantized(x, scale, fp8_max, dtype):
    if scale is None:
        return x.to(dtype)
    return (x.to(scale.dtype) / scale).clamp(-fp8_max, fp8_max).to(dtype)


def _written(slot_mapping, k_cache) -> torch.Tensor:
    """Which tokens write: a slot in [0, num_blocks × block_size) (padding and, unchecked, a
    slot past the caches write nothing)."""
    return (slot_mapping >= 0) & (slot_mapping < k_cache.shape[0] * k_cache.shape[1])


def kv_cache_write_ref(
    k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, check=True
):
    """Plain PyTorch in the inputs' dtype (exact in float64; a float8 cache then holds the
    exact quotient, saturated at ±448); updates the caches in place, returns them."""
    block_size = k_cache.shape[1]
    keep = _written(slot_mapping, k_cache)
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    for src, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        cache[blocks, offsets] = _quantized(src[keep], scale, _paged.REF_FP8_MAX, cache.dtype)
    return k_cache, v_cache


def kv_cache_write_torch(
    k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, check=True
):
    """Eager PyTorch: index_put at the non-padding slots (a host synchronisation, to select
    them); float8 by float32 division and one cast, as the kernel."""
    _validate(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, check)
    block_size = k_cache.shape[1]
    keep = _written(slot_mapping, k_cache)
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    for src, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        fp8_max = torch.finfo(cache.dtype).max if _paged.is_fp8(cache) else None
        cache[blocks, offsets] = _quantized(src[keep].float(), scale, fp8_max, cache.dtype)
    return k_cache, v_cache


def _validate(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, check) -> None:
    """Shapes and dtypes from metadata; with ``check``, the slot values too (a host sync)."""
    _check.tensor("k", k, dtypes=_check.FLOATS, ndim=3)
    _check.tensor("v", v, dtypes=(k.dtype,), ndim=3, device=k.device)
    _check.same_shape("v", v, k.shape, "the shape of k")
    _paged.unit_last("k", k)
    _paged.unit_last("v", v)
    _paged.validate_caches(k_cache, v_cache, k.dtype, k.device)
    tokens, heads, head_dim = k.shape
    if tuple(k_cache.shape[2:]) != (heads, head_dim):
        raise ValueError(
            f"k_cache: expected (num_blocks, block_size, {heads}, {head_dim}) to match k's "
            f"heads and head_dim, got {tuple(k_cache.shape)}"
        )
    _check.boolean("check", check)
    _paged.validate_scales(k_cache, k_scale, v_scale, check)
    _check.tensor(
        "slot_mapping", slot_mapping, dtypes=(torch.int64, torch.int32), ndim=1, device=k.device
    )
    _check.same_shape("slot_mapping", slot_mapping, (tokens,), "one slot per token of k")
    if check and tokens:
        n_slots = k_cache.shape[0] * k_cache.shape[1]
        top = int(slot_mapping.max())
        if top >= n_slots:
            raise ValueError(
                f"slot_mapping: slot {top} is past the cache (num_blocks × block_size = "
                f"{k_cache.shape[0]} × {k_cache.shape[1]} = {n_slots} slots)"
            )
        # Two tokens into one slot: which one lands depends on the order the writes happen in
        # (the kernel's programs, torch's index_put), so neither path defines it.
        kept = slot_mapping[slot_mapping >= 0]
        values, counts = torch.unique(kept, return_counts=True)
        if bool((counts > 1).any()):
            slot = int(values[counts > 1][0])
            tokens_at = (slot_mapping == slot).nonzero().flatten().tolist()
            raise ValueError(
                f"slot_mapping: slot {slot} is given to more than one token (tokens "
                f"{tokens_at[:4]}); each slot takes at most one token per call"
            )


def _plan(
    k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, check=True, config=None
) -> LaunchPlan:
    """The launch of ``_kv_cache_write_kernel`` (looked up at call time, so tests can replace
    it) for these (validated) arguments; nothing is launched without tokens."""
    tokens, heads, head_dim = k.shape
    if tokens == 0 or heads == 0:
        return LaunchPlan(result=(k_cache, v_cache))
    cfg = config or KVWriteConfig.default_for(heads, head_dim)
    fp8 = _paged.is_fp8(k_cache)
    call = KernelCall(
        _kv_cache_write_kernel,
        (tokens, cdiv(heads, cfg.block_h)),
        dict(
            KCache=k_cache,
            stride_kc_b=k_cache.stride(0),
            stride_kc_s=k_cache.stride(1),
            stride_kc_h=k_cache.stride(2),
            VCache=v_cache,
            stride_vc_b=v_cache.stride(0),
            stride_vc_s=v_cache.stride(1),
            stride_vc_h=v_cache.stride(2),
            K=k,
            stride_k_t=k.stride(0),
            stride_k_h=k.stride(1),
            V=v,
            stride_v_t=v.stride(0),
            stride_v_h=v.stride(1),
            Slots=slot_mapping,
            stride_slot=slot_mapping.stride(0),
            KScale=k_scale if fp8 else slot_mapping,
            VScale=v_scale if fp8 else slot_mapping,
            heads=heads,
            n_slots=k_cache.shape[0] * k_cache.shape[1],
            BLOCK_SIZE=k_cache.shape[1],
            HEAD_DIM=head_dim,
            BLOCK_H=cfg.block_h,
            BLOCK_D=next_pow2(head_dim),
            FP8=fp8,
            FP8_MAX=float(torch.finfo(k_cache.dtype).max) if fp8 else 1.0,
        ),
        cfg.num_warps,
        config=cfg,
    )
    return LaunchPlan((call,), result=(k_cache, v_cache))


def kv_cache_write_triton(
    k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, check=True, config=None
):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, check)
    return _plan(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, check, config).run()


def kv_cache_write(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``k`` and ``v`` into the paged caches at ``slot_mapping``, in place.

    Parameters
    ----------
    k, v : tensors (num_tokens, heads_kv, head_dim) of float32, float16 or bfloat16; any token
        and head strides (views of a fused qkv projection), unit stride within a head.
    k_cache, v_cache : tensors (num_blocks, block_size, heads_kv, head_dim) of k's dtype or
        float8 e4m3 (float8_e4m3fn, float8_e4m3fnuz); unit stride within a head.
    slot_mapping : int64 or int32 tensor (num_tokens,): slot = block × block_size + offset;
        negative for padding tokens, which write nothing.
    k_scale, v_scale : float32 tensors (1,), the per-tensor scales of a float8 cache (required
        then, refused otherwise); finite and positive.
    check : check on the host that no slot is past the cache, that no slot is given to two
        tokens, and that the scales are finite and positive (a device synchronisation); a
        serving loop whose slots are known good turns it off. Unchecked, a slot past the
        cache writes nothing (as padding does): no write lands outside ``k_cache`` and
        ``v_cache``, whatever ``slot_mapping`` holds; the only reads are of ``k``, ``v``,
        ``slot_mapping`` and the scales; two tokens with one slot leave that slot holding one
        of them, which one undefined.

    Returns ``(k_cache, v_cache)``. Safe for CUDA-graph capture with ``check=False``. Triton
    on CUDA/ROCm; torch on CPU (the interpreter with KERNELAB_INTERPRET=1).
    """
    if isinstance(k, torch.Tensor) and use_triton(k):
        return kv_cache_write_triton(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, check)
    return kv_cache_write_torch(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, check)


# --- the declaration ---------------------------------------------------------------------------

#: Blocks of the caches in generated inputs: the cache of a real server is gigabytes, but a
#: write touches only its slots; the interpreter gets 64.
NUM_BLOCKS = 1024
INTERPRETER_BLOCKS = 64


def _shape(label, tokens, heads, head_dim, block_size, num_blocks=NUM_BLOCKS, **params) -> Shape:
    fp8 = " fp8" if params.get("fp8") else ""
    return Shape(
        f"{label} {tokens}x{heads}x{head_dim} bs{block_size}{fp8}",
        {
            "tokens": tokens,
            "heads_kv": heads,
            "head_dim": head_dim,
            "block_size": block_size,
            "num_blocks": num_blocks,
        },
        params,
        batch_dim="tokens",
        reduce_to={"num_blocks": INTERPRETER_BLOCKS},
    )


def _representative() -> list[Shape]:
    # A decode step at batch 1, 8 and 64, and a 4096-token prefill, per distinct (heads_kv,
    # head_dim) of the models; block sizes 16 (vLLM's default) and 64; the float8 cache at both.
    seen, shapes = set(), []
    for m in _paged.MODELS.values():
        if (m.heads_kv, m.head_dim) in seen:
            continue
        seen.add((m.heads_kv, m.head_dim))
        for tokens, phase in ((1, "decode"), (8, "decode"), (64, "decode"), (4096, "prefill")):
            shapes.append(_shape(f"{m.name} {phase}", tokens, m.heads_kv, m.head_dim, 16))
    for block_size in (16, 64):
        shapes.append(_shape("llama3-8b decode", 64, 8, 128, block_size, fp8=True))
    shapes.append(_shape("llama3-8b prefill", 4096, 8, 128, 64))
    return shapes


def _edge() -> list[Shape]:
    return [
        _shape("one token", 1, 1, 64, 16, 4),
        _shape("padding slots", 13, 2, 64, 16, 8, padding=True),
        _shape("all padding", 4, 2, 64, 16, 4, all_padding=True),
        _shape("first and last slot", 2, 2, 64, 16, 4, ends=True),
        _shape("int32 slots", 9, 2, 128, 64, 4, int32=True),
        _shape("k, v views of a fused qkv", 7, 2, 64, 16, 4, fused=True),
        _shape("cache a view of one kv tensor", 5, 3, 64, 16, 4, kv_view=True),
        _shape("head_dim 96", 6, 4, 96, 16, 4),
        _shape("fp8 with padding", 11, 2, 128, 16, 8, fp8=True, padding=True),
        _shape("no tokens", 0, 2, 64, 16, 4),
    ]


def _slots(shape: Shape, n_slots: int, device, gen) -> torch.Tensor:
    """Distinct slots in random order (so block and offset both vary), with padding as asked."""
    tokens, p = shape.dims["tokens"], shape.params
    dtype = torch.int32 if p.get("int32") else torch.int64
    slots = torch.randperm(n_slots, generator=gen, device=gen.device)[:tokens]
    if p.get("ends") and tokens >= 2:
        slots[0], slots[-1] = 0, n_slots - 1
    if p.get("padding"):
        slots[1::4] = -1  # scattered padding...
        slots[-2:] = -1  # ...and the tail a CUDA-graph batch is padded with
    if p.get("all_padding"):
        slots[:] = -1
    if torch.device(device).type == "meta":  # static analysis, floors: the cost model reads
        return slots.to(dtype=dtype)  # which slots are padding, so they stay on the CPU
    return slots.to(device=device, dtype=dtype)


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    d, p = shape.dims, shape.params
    tokens, heads, head_dim = d["tokens"], d["heads_kv"], d["head_dim"]
    if p.get("fused"):
        # k and v as the server's views into one (tokens, (hq + 2·hkv)·head_dim) qkv output.
        qkv = _inputs.randn((tokens, 4 * heads * head_dim), dtype, device, gen, dist)
        k = qkv[:, 2 * heads * head_dim : 3 * heads * head_dim].view(tokens, heads, head_dim)
        v = qkv[:, 3 * heads * head_dim :].view(tokens, heads, head_dim)
    else:
        k = _inputs.randn((tokens, heads, head_dim), dtype, device, gen, dist)
        v = _inputs.randn((tokens, heads, head_dim), dtype, device, gen, dist)
    fp8 = bool(p.get("fp8"))
    cache = _paged.caches(
        d["num_blocks"], d["block_size"], heads, head_dim, dtype, fp8, device, gen, "normal"
    )
    k_cache, v_cache = cache["k_cache"], cache["v_cache"]
    if p.get("kv_view"):
        # k and v as the two halves of one (num_blocks, 2, block_size, ...) tensor: caches
        # whose block stride is twice their size (not contiguous).
        both = torch.stack([k_cache, v_cache], dim=1)
        k_cache, v_cache = both[:, 0], both[:, 1]
    n_slots = d["num_blocks"] * d["block_size"]
    return {
        "k": k,
        "v": v,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "slot_mapping": _slots(shape, n_slots, device, gen),
        "k_scale": _paged.fp8_scale(k) if fp8 else None,
        "v_scale": _paged.fp8_scale(v) if fp8 else None,
        "check": True,
    }


def _region(name: str):
    def written(inputs: dict) -> torch.Tensor:
        return _paged.slot_mask(inputs[name].shape, inputs["slot_mapping"])

    return written


def _cost(inputs: dict) -> Cost:
    """Read the slots and the k and v rows of non-padding tokens, write them into the caches
    (float8: one division per element)."""
    k, cache, slots = inputs["k"], inputs["k_cache"], inputs["slot_mapping"]
    tokens = k.shape[0]
    written = int((slots >= 0).sum())
    per_token = k.shape[1] * k.shape[2]
    nbytes = 2 * written * per_token * (k.element_size() + cache.element_size())
    nbytes += tokens * slots.element_size()
    flops = 2 * written * per_token if _paged.is_fp8(cache) else 0
    return Cost(flops=flops, bytes=nbytes)


KV_CACHE_WRITE = register(
    Op(
        "kv_cache_write",
        description="new k and v into paged KV caches at slot_mapping, in place (fp8 optional)",
        reference=kv_cache_write_ref,
        make_inputs=_make_inputs,
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # A copy is exact and the float8 cast is eager torch's bit for bit, so the error is
        # eager's (derived); the floors, for a copy whose eager error is 0, are far below one
        # 16-bit rounding, so a value passed through a narrower format cannot slip under them.
        contract=Contract(
            floors={"float32": 1e-7, "float16": 1e-6, "bfloat16": 1e-6},
            inplace=("k_cache", "v_cache"),
            regions={"k_cache": _region("k_cache"), "v_cache": _region("v_cache")},
            special_inputs=("k", "v"),
            # the fp8 cache's per-tensor scales are calibrated once: not a step's data
            data_inputs=("k", "v", "k_cache", "v_cache"),
        ),
        outputs=("k_cache", "v_cache"),
        out_arg=None,
        kernels=(_kv_cache_write_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: KVWriteConfig.tuning_space(
            shape.dims["heads_kv"], shape.dims["head_dim"]
        ),
    )
)
KV_CACHE_WRITE.add_variant(
    Variant(
        "kernelab",
        kv_cache_write_triton,
        "triton",
        description="Triton, one token's heads per program, padding slots skipped",
    )
)
KV_CACHE_WRITE.add_torch(kv_cache_write_torch)
KV_CACHE_WRITE.add_external(
    "vllm",
    "vllm",
    lambda: _vllm_write(),
    description="vLLM reshape_and_cache_flash (same cache layout)",
)


def _vllm_write():
    from vllm import _custom_ops

    def call(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None, check=True):
        one = torch.ones(1, dtype=torch.float32, device=k.device)
        dtype = "fp8" if _paged.is_fp8(k_cache) else "auto"
        kc, vc = k_cache, v_cache
        if dtype == "fp8":  # vLLM takes the fp8 cache as bytes
            kc, vc = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        _custom_ops.reshape_and_cache_flash(
            k,
            v,
            kc,
            vc,
            slot_mapping.long(),
            dtype,
            one if k_scale is None else k_scale,
            one if v_scale is None else v_scale,
        )
        return k_cache, v_cache

    return call
