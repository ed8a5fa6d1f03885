"""Rotary position embedding, in place on query and key, from a cos/sin cache.

For each token t at position p = positions[t], each head, and i < R = rotary_dim / 2:

    (x1, x2) = (x[i], x[i + R])        NeoX / Llama layout (halves)
    (x1, x2) = (x[2i], x[2i + 1])      GPT-J layout (interleaved pairs)
    x1 ← x1·cos[p, i] − x2·sin[p, i],  x2 ← x2·cos[p, i] + x1·sin[p, i]

``cos_sin_cache`` is (max_position, rotary_dim): cosines in the first half of each row, sines
in the second. Dimensions past rotary_dim are left as they are (partial rotary embedding).
Query and key may have different head counts (grouped-query attention).

Positions are cache rows: checked to lie in [0, max_position) (see ``rope``'s ``check``).
Unchecked, a position outside the cache reads nothing, in the kernel and in the torch path
alike: cos = sin = 0, so that token's rotated dimensions are written as zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core import Contract, Cost, Op, Sampling, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime import shapes as _shapes
from kernelab.core.runtime.launch import KernelCall, LaunchPlan, cdiv, shrink_to_fill
from kernelab.core.runtime.triton import next_pow2, use_triton
from kernelab.ops.rotary._kernels import _rope_kernel

# --- launch heuristics as data ----------------------------------------------------------------

#: Rotated elements a program should hold (query heads × rotary_dim × tokens) at large shapes.
TILE_ELEMENTS = 4096
#: Smallest tile when shrinking to fill the GPU at decode.
MIN_TILE = 512


@dataclass(frozen=True)
class RopeConfig:
    block_t: int
    block_h: int
    num_warps: int
    num_stages: int = 1

    @staticmethod
    def default_for(
        n_tokens: int, heads: int, rotary_dim: int, device: torch.device | None = None
    ) -> RopeConfig:
        block_r = next_pow2(max(1, rotary_dim // 2))
        block_h = next_pow2(heads)
        block_t = max(1, TILE_ELEMENTS // (2 * block_r * block_h))
        # Decode: split tokens (then heads) until there are two programs per SM.
        block_t, block_h = shrink_to_fill(
            (n_tokens, heads), (block_t, block_h), MIN_TILE, device, unit=2 * block_r
        )
        num_warps = max(1, min(8, block_t * block_h * 2 * block_r // 512))
        return RopeConfig(block_t, block_h, num_warps)

    @staticmethod
    def tuning_space(heads: int, rotary_dim: int) -> list[RopeConfig]:
        per_head = 2 * next_pow2(max(1, rotary_dim // 2))
        space = [
            RopeConfig(t, h, w)
            for t in (1, 2, 4, 8)
            for h in (1, 2, 4, 8, 16, 32, 64)
            if h <= next_pow2(heads)
            for w in (1, 2, 4, 8)
        ]

        def keep(c: RopeConfig) -> bool:
            per_thread = c.block_t * c.block_h * per_head // (32 * c.num_warps)
            return 4 <= per_thread <= 64

        return [c for c in space if keep(c)] or [RopeConfig(1, 1, 1)]


# --- reference, eager, launcher, public function ----------------------------------------------


def _rotate(x, cos, sin, rot, is_neox):
    """x rotated (a new tensor) in x's dtype; cos/sin broadcast as (tokens, 1, rot/2)."""
    half = rot // 2
    if is_neox:
        x1, x2 = x[..., :half], x[..., half:rot]
    else:
        x1, x2 = x[..., 0:rot:2], x[..., 1:rot:2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    y = x.clone()
    if is_neox:
        y[..., :half], y[..., half:rot] = o1, o2
    else:
        y[..., 0:rot:2], y[..., 1:rot:2] = o1, o2
    return y


def rope_ref(positions, query, key, cos_sin_cache, is_neox=True):
    """Plain PyTorch in the inputs' dtype (exact when given float64); rotates in place."""
    rot = cos_sin_cache.shape[1]
    cs = cos_sin_cache[positions.long()]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2 :]
    query.copy_(_rotate(query, cos, sin, rot, is_neox))
    key.copy_(_rotate(key, cos, sin, rot, is_neox))
    return query, key


def _rows(positions, cos_sin_cache, checked: bool) -> torch.Tensor:
    """Each token's cache row (tokens, rotary_dim). Unless the positions were checked, one
    outside the cache gives a row of zeros, as in the kernel, and nothing outside is read."""
    pos = positions.long()
    if checked:
        return cos_sin_cache[pos]
    n_pos, rot = cos_sin_cache.shape
    if n_pos == 0:
        return cos_sin_cache.new_zeros((pos.shape[0], rot))
    rows = cos_sin_cache[pos.clamp(0, n_pos - 1)]
    return torch.where(((pos >= 0) & (pos < n_pos))[:, None], rows, 0.0)


def rope_torch(positions, query, key, cos_sin_cache, is_neox=True, check=None):
    """Eager PyTorch: float32 arithmetic, one rounding to the inputs' dtype; in place.
    ``check``: as for ``rope_triton``."""
    checked = _validate(positions, query, key, cos_sin_cache, is_neox, check)
    rot = cos_sin_cache.shape[1]
    cs = _rows(positions, cos_sin_cache, checked).float()
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2 :]
    query.copy_(_rotate(query.float(), cos, sin, rot, is_neox))
    key.copy_(_rotate(key.float(), cos, sin, rot, is_neox))
    return query, key


def _validate(positions, query, key, cos_sin_cache, is_neox=True, check=None) -> bool:
    """Check the arguments; True when the positions were checked against the cache too."""
    _check.tensor("query", query, dtypes=_check.FLOATS, ndim=3)
    _check.tensor("key", key, dtypes=(query.dtype,), ndim=3, device=query.device)
    _check.tensor(
        "positions", positions, dtypes=(torch.int64, torch.int32), ndim=1, device=query.device
    )
    _check.tensor("cos_sin_cache", cos_sin_cache, dtypes=_check.FLOATS, ndim=2)
    if cos_sin_cache.device != query.device:
        raise ValueError(
            f"cos_sin_cache: expected a tensor on {query.device}, got one on {cos_sin_cache.device}"
        )
    tokens, _, head_dim = query.shape
    if key.shape[0] != tokens or key.shape[2] != head_dim:
        raise ValueError(
            f"key: expected shape ({tokens}, heads_k, {head_dim}) like query, "
            f"got {tuple(key.shape)}"
        )
    if positions.shape[0] != tokens:
        raise ValueError(f"positions: expected shape ({tokens},), got {tuple(positions.shape)}")
    rot = cos_sin_cache.shape[1]
    if rot % 2 or not 0 < rot <= head_dim:
        raise ValueError(
            f"cos_sin_cache: expected an even rotary dimension in (0, {head_dim}] as its "
            f"second size, got shape {tuple(cos_sin_cache.shape)}"
        )
    for name, t in (("query", query), ("key", key)):
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"{name}: expected unit stride in the last dimension (in place)")
    _check.boolean("is_neox", is_neox)
    if check is not None:
        _check.boolean("check", check)
    return _positions_checked(positions, cos_sin_cache.shape[0], check)


def _positions_checked(positions, n_pos: int, check: bool | None) -> bool:
    """Check that every position is a row of the cache: ``check`` True always (for positions
    on a device, one synchronisation), None only where it is free (positions on the host),
    False never. Nothing is read back while torch.compile traces or a CUDA graph is captured.
    True when checked (a ValueError naming the first bad position otherwise)."""
    if positions.numel() == 0:
        return True
    on_host = positions.device.type == "cpu"
    if check is False or (check is None and not on_host) or positions.device.type == "meta":
        return False
    if torch.compiler.is_compiling():
        return False
    if positions.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return False
    lo, hi = torch.aminmax(positions)
    if bool(((lo >= 0) & (hi < n_pos)).item()):
        return True
    i = int(((positions < 0) | (positions >= n_pos)).nonzero()[0, 0])
    raise ValueError(
        f"positions: expected values in [0, {n_pos}) (rows of cos_sin_cache), "
        f"got {int(positions[i])} at index {i}"
    )


def _plan(
    positions, query, key, cos_sin_cache, is_neox=True, config=None, check=None
) -> LaunchPlan:
    """The launch of ``_rope_kernel`` (looked up at call time, so tests can replace it) for
    these (validated) arguments; nothing is launched without tokens or heads. ``check`` is
    the launchers' (the kernel masks positions outside the cache whatever it is)."""
    tokens, heads_q, _ = query.shape
    heads_k = key.shape[1]
    if tokens == 0 or heads_q + heads_k == 0:
        return LaunchPlan(result=(query, key))
    rot = cos_sin_cache.shape[1]
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    heads = max(heads_q, heads_k)
    cfg = config or RopeConfig.default_for(tokens, heads, rot, query.device)
    call = KernelCall(
        _rope_kernel,
        (cdiv(tokens, cfg.block_t), cdiv(heads, cfg.block_h)),
        dict(
            Q=query,
            stride_qt=query.stride(0),
            stride_qh=query.stride(1),
            K=key,
            stride_kt=key.stride(0),
            stride_kh=key.stride(1),
            Pos=positions,
            stride_pos=positions.stride(0),
            Cache=cache,
            stride_cache=cache.stride(0),
            n_pos=cache.shape[0],
            n_tokens=tokens,
            heads_q=heads_q,
            heads_k=heads_k,
            HALF=rot // 2,
            BLOCK_T=cfg.block_t,
            BLOCK_H=cfg.block_h,
            BLOCK_R=next_pow2(rot // 2),
            IS_NEOX=bool(is_neox),
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    return LaunchPlan((call,), result=(query, key))


def rope_triton(positions, query, key, cos_sin_cache, is_neox=True, config=None, check=None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors).

    ``check``: check positions against the cache: True always, False never, None (what the
    instruments call) only where it costs no synchronisation (positions on the host)."""
    _validate(positions, query, key, cos_sin_cache, is_neox, check)
    return _plan(positions, query, key, cos_sin_cache, is_neox, config).run()


def rope(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply rotary position embedding to ``query`` and ``key`` in place; returns them.

    Parameters
    ----------
    positions : int64 or int32 tensor (tokens,), each token's position (a cache row).
    query : tensor (tokens, heads_q, head_dim) of float32, float16 or bfloat16; any token and
        head strides, unit stride within a head.
    key : tensor (tokens, heads_k, head_dim) of query's dtype.
    cos_sin_cache : tensor (max_position, rotary_dim), cosines then sines; rotary_dim even and
        at most head_dim (dimensions past it are not rotated).
    is_neox : True for rotated halves (NeoX, Llama), False for interleaved pairs (GPT-J).
    check : check that every position is a row of ``cos_sin_cache`` (a ValueError naming the
        first that is not, before anything is written). Free for positions on the host; for
        positions on a device it reads their range back, one synchronisation: a serving loop
        passes False (inside a CUDA graph capture or torch.compile nothing is read back
        either). Unchecked, a position outside the cache reads nothing and its token's
        rotated dimensions are written as zeros.

    Triton on CUDA/ROCm; torch on CPU (the interpreter with KERNELAB_INTERPRET=1).
    """
    _check.boolean("check", check)
    if isinstance(query, torch.Tensor) and use_triton(query):
        return rope_triton(positions, query, key, cos_sin_cache, is_neox, check=check)
    return rope_torch(positions, query, key, cos_sin_cache, is_neox, check=check)


# --- the declaration ---------------------------------------------------------------------------

#: Rows of the cos/sin cache (positions the model supports) in generated inputs.
MAX_POSITION = 8192


def _shape(label, tokens, hq, hk, head_dim, rot, is_neox, **extra) -> Shape:
    layout = "neox" if is_neox else "gptj"
    return Shape(
        f"{label} {tokens}x({hq}+{hk})x{head_dim} rot{rot} {layout}",
        {"tokens": tokens, "heads_q": hq, "heads_k": hk, "head_dim": head_dim, "rot": rot},
        {"is_neox": is_neox, **extra},
        batch_dim="tokens",
    )


def _representative() -> list[Shape]:
    groups = _shapes.by_width(lambda m: (m.heads, m.kv_heads, m.head_dim))
    return [
        _shape(f"{'/'.join(models)} {_shapes.phase(tokens)}", tokens, hq, hk, hd, hd, is_neox)
        for (hq, hk, hd), models in groups.items()
        for tokens in _shapes.TOKENS
        for is_neox in (True, False)
    ]


def _edge() -> list[Shape]:
    cases = [
        ("one token one head", 1, 1, 1, 2, 2),
        ("prime heads, partial rotary", 5, 7, 3, 80, 32),
        ("rotary half not a power of two", 3, 4, 2, 96, 96),
        ("many tokens, GQA 8:1", 300, 8, 1, 64, 64),
        ("non-contiguous (fused qkv)", 6, 4, 2, 64, 64),
        ("no tokens", 0, 4, 2, 64, 64),
    ]
    return [
        _shape(label, t, hq, hk, hd, rot, is_neox, **({"fused": True} if "fused" in label else {}))
        for label, t, hq, hk, hd, rot in cases
        for is_neox in (True, False)
    ]


def _cache(rot, dtype, device):
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    angles = torch.arange(MAX_POSITION, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device=device, dtype=dtype)


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    d = shape.dims
    tokens, hq, hk, hd = d["tokens"], d["heads_q"], d["heads_k"], d["head_dim"]
    positions = _inputs.randint((tokens,), 0, MAX_POSITION, device, gen)
    if shape.params.get("fused"):
        # Views into one (tokens, (hq + 2·hk)·head_dim) projection output, as servers pass them.
        qkv = _inputs.randn((tokens, (hq + 2 * hk) * hd), dtype, device, gen, dist)
        query = qkv[:, : hq * hd].view(tokens, hq, hd)
        key = qkv[:, hq * hd : (hq + hk) * hd].view(tokens, hk, hd)
    else:
        query = _inputs.randn((tokens, hq, hd), dtype, device, gen, dist)
        key = _inputs.randn((tokens, hk, hd), dtype, device, gen, dist)
    cache = (
        torch.empty((MAX_POSITION, d["rot"]), dtype=dtype, device=device)
        if device.type == "meta"
        else _cache(d["rot"], dtype, device)
    )
    return {
        "positions": positions,
        "query": query,
        "key": key,
        "cos_sin_cache": cache,
        "is_neox": shape.params["is_neox"],
    }


def _cost(inputs: dict) -> Cost:
    q, k, cache = inputs["query"], inputs["key"], inputs["cos_sin_cache"]
    rot = cache.shape[1]
    tokens = q.shape[0]
    rotated = tokens * (q.shape[1] + k.shape[1]) * rot
    # Read and write the rotated part of q and k; read one cache row and a position per token.
    nbytes = 2 * rotated * q.element_size() + tokens * (rot * cache.element_size() + 8)
    return Cost(flops=3 * rotated, bytes=nbytes)  # two multiplies and an add per element


ROPE = register(
    Op(
        "rope",
        description="rotary embedding in place on query and key (NeoX or GPT-J, partial rotary)",
        reference=rope_ref,
        make_inputs=_make_inputs,
        sampling=Sampling(rows={"positions": 0, "query": 0, "key": 0}, tile={"tokens": 32}),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # the cos/sin table is prepared once; any position below its length is valid
        contract=Contract(inplace=("query", "key"), data_inputs=("positions", "query", "key")),
        outputs=("query", "key"),
        out_arg=None,
        kernels=(_rope_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: RopeConfig.tuning_space(
            max(shape.dims["heads_q"], shape.dims["heads_k"]), shape.dims["rot"]
        ),
    )
)
ROPE.add_variant(
    Variant(
        "kernelab", rope_triton, "triton", description="Triton, all heads of a token share cos/sin"
    )
)
ROPE.add_torch(rope_torch)
