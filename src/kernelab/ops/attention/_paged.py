"""What the paged-KV ops share (kv_cache_write, merge_attention_states, paged_attention): the
cache layout and its checks, float8 scales, the models whose attention the shapes follow, and
the generation of caches, block tables and slot mappings consistent with each other.

The cache layout (vLLM's "flash" layout, FlashInfer's NHD):

    k_cache, v_cache : [num_blocks, block_size, heads_kv, head_dim]
    key j of sequence b : block block_tables[b, j // block_size], offset j % block_size
    slot                : block × block_size + offset (negative: padding, nothing written)

A float8 e4m3 cache holds ``fp8(clamp(x / scale, ±FP8_MAX))`` with one float32 scale per
tensor (``k_scale``, ``v_scale``, shape (1,)); readers dequantize as ``value × scale``.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import torch

from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.fp8 import FP8_DTYPES
from kernelab.core.runtime.launch import KernelCall, cdiv
from kernelab.core.runtime.triton import next_pow2

#: Float8 formats a cache may hold (e4m3: NVIDIA's OCP format, AMD gfx942's fnuz).
CACHE_FP8 = FP8_DTYPES
#: What a reference saturates float8 values to: float8_e4m3fn's largest finite value (the
#: float64 reference no longer knows the cache's format; the shapes use e4m3fn).
REF_FP8_MAX = 448.0
#: Head dimensions the attention kernels take (96 runs in 128-wide tiles, masked).
HEAD_DIMS = (64, 96, 128, 256)


@dataclass(frozen=True)
class AttentionModel:
    """The attention of one model, from its published config.json."""

    name: str
    heads_q: int
    heads_kv: int
    head_dim: int
    window: int | None = None
    softcap: float | None = None
    sinks: bool = False


MODELS = {
    m.name: m
    for m in (
        AttentionModel("llama3-8b", 32, 8, 128),
        AttentionModel("llama3-70b", 64, 8, 128),
        AttentionModel("qwen2.5-7b", 28, 4, 128),
        AttentionModel("mistral-7b", 32, 8, 128, window=4096),
        AttentionModel("gemma2-9b", 16, 8, 256, window=4096, softcap=50.0),
        # gpt-oss-20b's sliding-window layers: 128-token window, a learned sink per head.
        AttentionModel("gpt-oss-20b", 64, 8, 64, window=128, sinks=True),
    )
}


# --- checks ----------------------------------------------------------------------------------


def is_fp8(t: torch.Tensor) -> bool:
    return t.dtype in CACHE_FP8


def unit_last(name: str, t: torch.Tensor) -> None:
    if t.numel() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: expected unit stride in the last dimension (head_dim)")


def validate_caches(k_cache, v_cache, value_dtype: torch.dtype, device) -> None:
    """Both caches [num_blocks, block_size, heads_kv, head_dim] of one dtype: ``value_dtype``
    or a float8 e4m3 format, on ``device``, unit stride within a head."""
    allowed = (value_dtype, *CACHE_FP8)
    _check.tensor("k_cache", k_cache, dtypes=allowed, ndim=4, device=device)
    _check.tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), ndim=4, device=device)
    _check.same_shape("v_cache", v_cache, k_cache.shape, "the shape of k_cache")
    unit_last("k_cache", k_cache)
    unit_last("v_cache", v_cache)
    if k_cache.shape[1] < 1:
        raise ValueError(f"k_cache: expected a block size of at least 1, got {k_cache.shape[1]}")


def positive_int(name: str, value, what: str) -> None:
    """None, or a positive int: a bool or a float is a TypeError (the repository's rule, see
    ``kernelab/core/runtime/check.py``), zero or less a ValueError."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected a positive int ({what}) or None, got {value!r}")
    if value < 1:
        raise ValueError(f"{name}: expected a positive int ({what}) or None, got {value!r}")


def window_left(name: str, value) -> int:
    """A left window: an int ≥ 0 (a query at position p sees keys j ≥ p − value), or −1 for
    none. The one convention of every attention op."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name}: expected an int ≥ 0 (sliding window W − 1), or −1 for none, got {value!r}"
        )
    if value < -1:
        raise ValueError(
            f"{name}: expected an int ≥ 0 (sliding window W − 1), or −1 for none, got {value!r}"
        )
    return int(value)


def softcap(name: str, value) -> float:
    """A logit soft cap: a finite float ≥ 0, 0 (or None) for none."""
    if value is None:
        return 0.0
    x = _check.finite(name, value)
    if x < 0:
        raise ValueError(f"{name}: expected a finite float ≥ 0 (0: none), got {value!r}")
    return x


def window_of(window_left: int) -> int | None:
    """The number of keys a windowed query sees (W = window_left + 1), None for no window."""
    return window_left + 1 if window_left >= 0 else None


#: Old spellings kept for one release: name -> (new name, conversion).
DEPRECATED = {
    "scale": ("softmax_scale", lambda v: v),
    "window": ("window_left", lambda v: -1 if v is None else (v - 1 if _is_int(v) else v)),
}


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def renamed(args: dict) -> dict:
    """``args`` (a function's locals, with its ``**deprecated`` catch-all) with the old names
    ``scale=`` and ``window=`` (W keys seen; ``window_left`` = W − 1) mapped to the new ones,
    with a DeprecationWarning; an unknown keyword, or both spellings at once, is refused."""
    args = dict(args)
    extra = args.pop("deprecated", None) or {}
    for old, value in extra.items():
        if old not in DEPRECATED:
            raise TypeError(f"{old}: unexpected keyword argument")
        new, convert = DEPRECATED[old]
        if old == "window" and _is_int(value) and value < 1:
            raise ValueError(f"window: expected a positive int (keys a query sees), got {value!r}")
        default = -1 if new == "window_left" else None
        if args.get(new, default) != default:
            raise ValueError(f"{old}: given with {new}; pass {new} only")
        warnings.warn(
            f"{old}= is deprecated: pass {new}= "
            + ("(W − 1 for a sliding window of W keys)" if old == "window" else "(same meaning)"),
            DeprecationWarning,
            stacklevel=3,
        )
        args[new] = convert(value)
    return args


def validate_scales(k_cache, k_scale, v_scale, check: bool = True) -> None:
    """float32 per-tensor scales, shape (1,), exactly when the cache is float8; with ``check``
    (a device sync) their values too: finite and positive (a zero, negative, infinite or NaN
    scale turns every cached value into ±FP8_MAX, flips its sign, or makes it NaN)."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not is_fp8(k_cache):
            if scale is not None:
                raise ValueError(
                    f"{name}: given for a {str(k_cache.dtype).removeprefix('torch.')} cache; "
                    "scales apply to float8 caches only"
                )
            continue
        if scale is None:
            raise ValueError(f"{name}: required for a float8 cache (one float32 scale)")
        _check.tensor(name, scale, dtypes=(torch.float32,), device=k_cache.device)
        if scale.numel() != 1:
            raise ValueError(
                f"{name}: expected one per-tensor scale, got shape {tuple(scale.shape)}"
            )
        if check:
            value = float(scale.reshape(()))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected a finite positive scale, got {value!r}")


# --- generated inputs ------------------------------------------------------------------------


def caches(
    num_blocks: int,
    block_size: int,
    heads_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    fp8: bool,
    device,
    gen,
    dist: str,
) -> dict:
    """Random k and v caches (every slot filled: stale entries of other sequences are never
    zeros) and, for float8, the per-tensor scales they were quantized with."""
    shape = (num_blocks, block_size, heads_kv, head_dim)
    out = {}
    for name in ("k", "v"):
        x = _inputs.randn(shape, dtype, device, gen, dist)
        if not fp8:
            out[f"{name}_cache"], out[f"{name}_scale"] = x, None
            continue
        f8 = CACHE_FP8[0]
        if torch.device(device).type == "meta":
            scale = torch.empty(1, dtype=torch.float32, device=device)
            out[f"{name}_cache"], out[f"{name}_scale"] = x.to(f8), scale
            continue
        amax = x.float().abs().amax() if x.numel() else torch.ones((), device=x.device)
        scale = (amax.clamp_min(1e-30) / torch.finfo(f8).max).reshape(1).to(torch.float32)
        out[f"{name}_cache"] = (x.float() / scale).clamp(-REF_FP8_MAX, REF_FP8_MAX).to(f8)
        out[f"{name}_scale"] = scale
    return out


def fp8_scale(x: torch.Tensor, margin: float = 1.25) -> torch.Tensor:
    """A per-tensor float32 scale for quantizing ``x`` to e4m3 with ``margin`` of headroom."""
    if x.device.type == "meta":
        return torch.empty(1, dtype=torch.float32, device=x.device)
    amax = x.float().abs().amax() if x.numel() else torch.ones((), device=x.device)
    return (amax.clamp_min(1e-30) * margin / REF_FP8_MAX).reshape(1).to(torch.float32)


def slot_mask(cache_shape, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Bool mask of a cache's shape: True at every element of the slots written (slot ≥ 0)."""
    num_blocks, block_size = cache_shape[0], cache_shape[1]
    slots = slot_mapping.detach().cpu().long()
    flat = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    flat[slots[slots >= 0]] = True
    return flat.view(num_blocks, block_size, 1, 1).expand(*cache_shape).contiguous()


# --- merging partial attention states (merge_attention_states, paged_attention's reduce) ------


@dataclass(frozen=True)
class MergeConfig:
    """``block_h`` heads of one token per program, ``num_warps`` warps."""

    block_h: int
    num_warps: int

    #: Elements of one state a program holds: 8 float32 per thread over 8 warps at D = 128.
    TILE_ELEMENTS = 2048

    @classmethod
    def default_for(cls, heads: int, head_dim: int) -> MergeConfig:
        block_d = next_pow2(head_dim)
        block_h = max(1, min(next_pow2(heads), cls.TILE_ELEMENTS // block_d))
        return cls(block_h, max(1, min(8, block_h * block_d // 256)))

    @classmethod
    def tuning_space(cls, heads: int, head_dim: int) -> list[MergeConfig]:
        block_d = next_pow2(head_dim)
        space = [
            cls(h, w) for h in (1, 2, 4, 8, 16, 32) if h <= next_pow2(heads) for w in (1, 2, 4, 8)
        ]
        return [c for c in space if 4 <= c.block_h * block_d // (32 * c.num_warps) <= 64] or [
            cls.default_for(heads, head_dim)
        ]


def merge_call(kern, out, out_lse, states, lse, config: MergeConfig | None = None) -> KernelCall:
    """The launch of the merge kernel ``kern`` (the family's, or a planted-defect copy): states
    [S, T, H, D] with lse [S, T, H] into out [T, H, D] and, when ``out_lse`` is given, its lse
    [T, H]. The one place the merge kernel's arguments are bound."""
    n_states, tokens, heads, head_dim = states.shape
    cfg = config or MergeConfig.default_for(heads, head_dim)
    lse_out = out_lse if out_lse is not None else lse
    return KernelCall(
        kern,
        (tokens, cdiv(heads, cfg.block_h)),
        dict(
            Out=out,
            stride_o_t=out.stride(0),
            stride_o_h=out.stride(1),
            OutLse=lse_out,
            stride_ol_t=lse_out.stride(-2),
            stride_ol_h=lse_out.stride(-1),
            States=states,
            stride_s_s=states.stride(0),
            stride_s_t=states.stride(1),
            stride_s_h=states.stride(2),
            Lse=lse,
            stride_l_s=lse.stride(0),
            stride_l_t=lse.stride(1),
            stride_l_h=lse.stride(2),
            n_states=n_states,
            heads=heads,
            HEAD_DIM=head_dim,
            BLOCK_H=cfg.block_h,
            BLOCK_D=next_pow2(head_dim),
            WRITE_LSE=out_lse is not None,
        ),
        cfg.num_warps,
        config=cfg,
    )


# --- batches of sequences: lengths, block tables, cumulative query counts ---------------------


def lengths(shape) -> tuple[list[int], list[int]]:
    """Queries and keys (cached, the new ones included) per sequence of a shape: its
    ``q_lens``/``kv_lens`` parameters, or ``batch`` sequences of ``context`` keys with
    ``queries`` queries each, the last one a prefill chunk of ``chunk`` queries when given."""
    p, d = shape.params, shape.dims
    if "kv_lens" in p:
        kv = list(p["kv_lens"])
        return list(p.get("q_lens", [1] * len(kv))), kv
    batch, context = d["batch"], d["context"]
    q = [d.get("queries", 1)] * batch
    if d.get("chunk") and batch:
        q[-1] = min(d["chunk"], context)
    return q, [context] * batch


def block_tables(kv_lens, block_size: int, order: str, device, gen) -> tuple[torch.Tensor, int]:
    """An int32 table [batch, max_blocks] with one spare column, and the number of blocks of the
    cache: each sequence's blocks distinct and in random order (``order`` "descending": each
    row's blocks in decreasing order); spare entries point at other sequences' blocks, so a read
    past a sequence's end gets real, wrong keys, never zeros."""
    batch = len(kv_lens)
    need = [-(-n // block_size) for n in kv_lens]
    max_blocks = max(need, default=0) + 1
    num_blocks = sum(need) + 2
    if torch.device(device).type == "meta":
        return torch.empty((batch, max_blocks), dtype=torch.int32, device=device), num_blocks
    perm = torch.randperm(num_blocks, generator=gen, device=gen.device).cpu()
    filler = torch.randint(0, num_blocks, (batch, max_blocks), generator=gen, device=gen.device)
    table = filler.cpu().clone()
    at = 0
    for b, n in enumerate(need):
        row = perm[at : at + n]
        table[b, :n] = row.sort(descending=True).values if order == "descending" else row
        at += n
    return table.to(device=device, dtype=torch.int32), num_blocks


def cumulative(counts, device) -> torch.Tensor:
    """int32 [len + 1]: 0, then the running sums of ``counts``."""
    out = torch.zeros(len(counts) + 1, dtype=torch.int32)
    if counts:
        out[1:] = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return out.to(device) if torch.device(device).type != "meta" else out.to("meta")


def visible_keys(q_len: int, kv_len: int, window: int | None) -> tuple[int, int, int]:
    """For one sequence: scores left unmasked (Σ over queries of the keys each sees), and the
    first and one-past-last key any query sees."""
    total, lo, hi = 0, kv_len, 0
    for i in range(q_len):
        pos = kv_len - q_len + i
        first = max(0, pos - window + 1) if window else 0
        last = min(pos, kv_len - 1)
        if last >= first:
            total += last - first + 1
            lo, hi = min(lo, first), max(hi, last + 1)
    return total, lo, max(hi, lo)


# --- the plain attention of each sequence (the references and eager variants) -----------------


def gather(cache, table_row, kv_len, scale):
    """A sequence's keys (or values) [kv_len, heads_kv, head_dim], through its table row."""
    block_size = cache.shape[1]
    pages = table_row[: cdiv(kv_len, block_size)].long()
    x = cache[pages].reshape(-1, *cache.shape[2:])[:kv_len]
    return x if scale is None else x.to(scale.dtype) * scale


def visible_mask(q_len, kv_len, window, device):
    pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    key = torch.arange(kv_len, device=device)[None, :]
    visible = key <= pos
    if window:
        visible &= pos - key < window
    return visible  # [q_len, kv_len]


def softmax_attention(q, k, v, visible, scale, softcap, sinks, dtype):
    """The plain formula in ``dtype``: out [q_len, Hq, D] and lse [Hq, q_len]."""
    group = q.shape[1] // k.shape[1]
    k = k.to(dtype).repeat_interleave(group, dim=1)
    v = v.to(dtype).repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.to(dtype), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible, -math.inf)
    m = s.amax(dim=-1) if s.shape[-1] else s.new_full(s.shape[:2], -math.inf)
    if sinks is not None:
        m = torch.maximum(m, sinks.to(dtype)[:, None])
    m_safe = torch.where(m == -math.inf, torch.zeros_like(m), m)
    p = torch.exp(s - m_safe[..., None])
    total = p.sum(dim=-1)
    if sinks is not None:
        total = total + torch.exp(sinks.to(dtype)[:, None] - m_safe)
    empty = total == 0
    safe = torch.where(empty, torch.ones_like(total), total)
    out = torch.einsum("hqk,khd->qhd", p, v) / safe.transpose(0, 1)[..., None]
    out = torch.where(empty.transpose(0, 1)[..., None], torch.zeros_like(out), out)
    lse = torch.where(empty, -math.inf, m + torch.log(safe))
    return out, lse


#: float32's unit roundoff.
F32_UNIT = 2.0**-24


def score_spread(q, k, v, visible, scale, softcap, sinks):
    """How far float32 scores move this sequence's outputs (float64, [q_len, Hq, D]).

    A float32 dot product of D terms rounds each partial sum by at most a unit roundoff of
    it; the errors walk randomly and a partial sum's expected square is at most
    ‖q ∘ k_j‖₂², so score j errs by e_j = u·(√D·scale·‖q ∘ k_j‖₂ + 3|s_j|), the second term
    the roundings of the score itself (the scale, the base-2 exponent, the subtraction of the
    maximum); a softcap passes the first through its slope 1 − tanh². The softmax carries an
    error δs_j into the output as p_j·(v_j − o)·δs_j; independent over j:

        σ = √(Σ_j p_j² e_j² (v_j − o)²)

    Negligible for scores of order one; for scores of order 10⁴ (float16 inputs near 10²) a
    near tie between two keys makes it larger than the output's own rounding.
    """
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    q = q.double()
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    e = torch.einsum("qhd,khd->hqk", q * q, k * k).sqrt() * (scale * math.sqrt(q.shape[-1]))
    if softcap:
        t = torch.tanh(s / softcap)
        s, e = softcap * t, e * (1 - t * t)
    e = F32_UNIT * (e + 3 * s.abs())
    s = s.masked_fill(~visible, -math.inf)
    m = s.amax(dim=-1) if s.shape[-1] else s.new_full(s.shape[:2], -math.inf)
    if sinks is not None:
        m = torch.maximum(m, sinks.double()[:, None])
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)
    p = torch.exp(s - m[..., None])
    total = p.sum(dim=-1)
    if sinks is not None:
        total = total + torch.exp(sinks.double()[:, None] - m)
    p = p / torch.where(total == 0, torch.ones_like(total), total)[..., None]
    o = torch.einsum("hqk,khd->hqd", p, v)
    w = torch.where(visible, p * e, torch.zeros_like(e)).square()  # NaN scores stay NaN
    # Σ_j w_j (v_j − o)², expanded: one product per moment instead of a [q, k, D] tensor
    var = (
        torch.einsum("hqk,khd->hqd", w, v * v)
        - 2 * o * torch.einsum("hqk,khd->hqd", w, v)
        + o * o * w.sum(dim=-1, keepdim=True)
    )
    return var.clamp_min(0).sqrt().nan_to_num(0.0).transpose(0, 1)


def per_sequence(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, window, k_scale, v_scale, attend
):
    """Run ``attend(q_b, k_b, v_b, visible) -> (out_b, lse_b)`` per sequence; fill the rest."""
    tokens, heads, _ = q.shape
    outs, lses = [], []
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b, kv_len in enumerate(lens):
        q_b = q[cu[b] : cu[b + 1]]
        if q_b.shape[0] == 0:
            continue
        k = gather(k_cache, block_tables[b], kv_len, k_scale)
        v = gather(v_cache, block_tables[b], kv_len, v_scale)
        o, l_ = attend(q_b, k, v, visible_mask(q_b.shape[0], kv_len, window, q.device))
        outs.append(o)
        lses.append(l_.transpose(0, 1))
    if not outs:
        return q.new_zeros(q.shape), q.new_full((tokens, heads), -math.inf, dtype=torch.float32)
    return torch.cat(outs), torch.cat(lses)


def spread(inputs: dict) -> torch.Tensor:
    """paged_attention's ``Contract.amplified``: the output's spread from its float32 scores
    per element (``score_spread``), float64 of q's shape."""
    q = inputs["q"]
    scale = inputs.get("softmax_scale") or q.shape[-1] ** -0.5
    softcap, sinks = inputs.get("softcap") or 0.0, inputs.get("sinks")

    def attend(q_b, k, v, visible):
        s = score_spread(q_b, k, v, visible, scale, softcap, sinks)
        return s, s.new_zeros(s.shape[1], s.shape[0])

    o, _ = per_sequence(
        q, inputs["k_cache"], inputs["v_cache"], inputs["block_tables"], inputs["seq_lens"],
        inputs["cu_seqlens_q"], window_of(inputs.get("window_left", -1)), inputs.get("k_scale"),
        inputs.get("v_scale"), attend,
    )  # fmt: skip
    return o.to(torch.float64)


# --- content checks (behind check=True: they read device values) -------------------------------


def check_batch(tokens, num_blocks, block_size, block_tables, seq_lens, cu_seqlens_q):
    """cu_seqlens_q from 0 to num_tokens, non-decreasing; lengths within the block table; the
    table entries a sequence uses within the cache."""
    cu = cu_seqlens_q.cpu().long()
    if cu.numel() and (cu[0] != 0 or cu[-1] != tokens):
        raise ValueError(
            f"cu_seqlens_q: expected to start at 0 and end at num_tokens = {tokens}, "
            f"got {cu[0].item()} ... {cu[-1].item()}"
        )
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError("cu_seqlens_q: expected non-decreasing offsets")
    lens = seq_lens.cpu().long()
    top = block_tables.shape[1] * block_size
    if bool((lens < 0).any()) or bool((lens > top).any()):
        raise ValueError(
            f"seq_lens: expected lengths in [0, max_blocks × block_size = {top}], "
            f"got {lens.min().item()} ... {lens.max().item()}"
        )
    table = block_tables.cpu().long()
    used = torch.arange(table.shape[1])[None, :] < ((lens + block_size - 1) // block_size)[:, None]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bool(bad.any()):
        b, j = (int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(
            f"block_tables: entry [{b}, {j}] = {table[b, j].item()} is not a block of the cache "
            f"(num_blocks = {num_blocks})"
        )
