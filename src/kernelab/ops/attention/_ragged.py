"""What attention over ragged batches shares: cumulative-length checks, which keys a query may
see (bottom-right causal alignment, sliding window, block mask), the count of visible scores
for the cost model, and the ragged shapes with their interpreter reduce rule.

A ragged batch packs its sequences along tokens: sequence b holds query rows
[cu_seqlens_q[b], cu_seqlens_q[b + 1]) and key rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]).
Query row r of a sequence with len_q queries and len_k keys sits at key position
pos = r + len_k − len_q (its queries are the sequence's last tokens: chunked prefill, a cached
prefix), and sees key j when

    causal:  j ≤ pos                    window_left ≥ 0:  j ≥ pos − window_left
    block mask:  block_mask[b, h, r // mask_block, j // mask_block]  (blocks counted from the
                 sequence's first query and first key)

A row that sees no key (more queries than keys under causal alignment, a window or a block mask
that covers none) has output zeros and log-sum-exp −inf.
"""

from __future__ import annotations

import itertools
import math

import torch

from kernelab.core import Shape
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs

#: Head dimensions the kernels support (96 is padded to 128 inside, with masking).
HEAD_DIMS = (64, 96, 128, 256)
FLOATS16 = (torch.float16, torch.bfloat16)
#: what the attention kernels accept: the 16-bit types they are tuned and declared for, and
#: float32 (a float32 model served as it is; on NVIDIA GPUs the dots then run in TF32)
FLOATS_IN = (*FLOATS16, torch.float32)
MASK_DTYPES = (torch.bool, torch.uint8, torch.int8)

#: Longest key sequence a representative shape keeps through the interpreter: every length (and
#: the window) is scaled by the same factor, so sequences keep their proportions and the window
#: stays active where it was (the label lists the cut).
INTERPRETER_CTX = 256
#: KV heads kept through the interpreter; query heads are cut in proportion, so each query head
#: still reads the KV head it would (the same GQA group), and each program does what it would.
INTERPRETER_KV_HEADS = 2


# --- target names -----------------------------------------------------------------------------


# --- checks ------------------------------------------------------------------------------------


def check_cu_seqlens(name: str, cu: torch.Tensor, entries: int | None, device) -> None:
    """Shape checks (always): int32, 1-D, ``entries`` values (batch + 1) when given."""
    _check.tensor(name, cu, dtypes=(torch.int32,), ndim=1, device=device)
    if cu.shape[0] < 1:
        raise ValueError(f"{name}: expected batch + 1 ≥ 1 entries, got shape {tuple(cu.shape)}")
    if entries is not None and cu.shape[0] != entries:
        raise ValueError(
            f"{name}: expected {entries} entries (batch + 1, like cu_seqlens_q), "
            f"got shape {tuple(cu.shape)}"
        )


def check_cu_values(name: str, cu: torch.Tensor, total: int) -> list[int]:
    """Content checks (they read the values: a device sync): starts at 0, never decreases,
    ends at ``total`` tokens. Returns the values."""
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}: expected to start at 0, got {values[0]}")
    bad = next((i for i in range(1, len(values)) if values[i] < values[i - 1]), None)
    if bad is not None:
        raise ValueError(
            f"{name}: expected non-decreasing values, got {values[bad - 1]} then "
            f"{values[bad]} at index {bad}"
        )
    if values[-1] != total:
        raise ValueError(f"{name}: expected to end at the {total} tokens packed, got {values[-1]}")
    return values


def lengths_of(cu: list[int]) -> list[int]:
    return [b - a for a, b in itertools.pairwise(cu)]


# --- which keys a query sees ------------------------------------------------------------------


def visible(
    len_q: int,
    len_k: int,
    causal: bool,
    window_left: int,
    block_mask: torch.Tensor | None = None,
    mask_block: int = 128,
    device=None,
) -> torch.Tensor:
    """bool [H, len_q, len_k]: which keys each query row sees (H = the block mask's heads, or
    1 without one)."""
    r = torch.arange(len_q, device=device)[:, None]
    j = torch.arange(len_k, device=device)[None, :]
    pos = r + (len_k - len_q)
    ok = torch.ones((len_q, len_k), dtype=torch.bool, device=device)
    if causal:
        ok &= j <= pos
    if window_left >= 0:
        ok &= j >= pos - window_left
    ok = ok[None]
    if block_mask is not None:
        bm = block_mask.to(device=device, dtype=torch.bool)
        rows = torch.arange(len_q, device=device) // mask_block
        cols = torch.arange(len_k, device=device) // mask_block
        ok = ok & bm[:, rows][:, :, cols]
    return ok


def visible_pairs(
    q_lens: list[int],
    k_lens: list[int],
    heads: int,
    causal: bool,
    window_left: int,
    block_mask: torch.Tensor | None = None,
    mask_block: int = 128,
) -> int:
    """Visible (query, key) pairs over all sequences and query heads: the scores a kernel that
    skips masked work computes. Row-wise closed forms (and block overlaps for a block mask),
    never a dense mask."""
    total = 0
    for b, (lq, lk) in enumerate(zip(q_lens, k_lens, strict=True)):
        if lq == 0 or lk == 0:
            continue
        pos = torch.arange(lq, dtype=torch.int64) + (lk - lq)
        hi = (pos + 1).clamp(max=lk) if causal else torch.full_like(pos, lk)
        lo = (pos - window_left).clamp(min=0) if window_left >= 0 else torch.zeros_like(pos)
        if block_mask is None:
            total += heads * int((hi - lo).clamp(min=0).sum())
            continue
        starts = torch.arange(0, lk, mask_block, dtype=torch.int64)
        overlap = (
            torch.minimum(hi[:, None], starts[None, :] + mask_block)
            - torch.maximum(lo[:, None], starts[None, :])
        ).clamp(min=0)  # [lq, key blocks]
        bm = block_mask[b].to("cpu", torch.int64)  # [H, query blocks, key blocks]
        rows = torch.arange(lq) // mask_block
        per_head = (bm[:, rows, : len(starts)] * overlap[None]).sum()
        total += int(per_head) * (heads // bm.shape[0])
    return total


# --- shapes and inputs -------------------------------------------------------------------------


def ragged_shape(
    label, q_lens, k_lens, heads_q, heads_kv, head_dim, *, cut=INTERPRETER_CTX, **params
) -> Shape:
    """A ragged batch: sequences of ``q_lens`` queries over ``k_lens`` keys. For the
    interpreter, ``seqs`` (the batch dimension) is cut by taking the first sequences, ``ctx``
    (the longest key sequence) to ``cut`` by scaling every length and the window alike
    (:func:`lengths`), and the heads to ``INTERPRETER_KV_HEADS`` KV heads with their query
    heads; ``cut=None``: only the batch is cut."""
    q_lens, k_lens = tuple(q_lens), tuple(k_lens)
    ctx = max(k_lens, default=0)
    cuts = {}
    if cut is not None and ctx > cut:
        cuts["ctx"] = cut
    if cut is not None and heads_kv > INTERPRETER_KV_HEADS:
        group = heads_q // heads_kv
        cuts.update(heads_q=group * INTERPRETER_KV_HEADS, heads_kv=INTERPRETER_KV_HEADS)
    return Shape(
        label,
        {
            "seqs": len(q_lens),
            "ctx": ctx,
            "heads_q": heads_q,
            "heads_kv": heads_kv,
            "head_dim": head_dim,
        },
        {"q_lens": q_lens, "k_lens": k_lens, **params},
        batch_dim="seqs",
        reduce_to=cuts,
    )


def lengths(shape: Shape) -> tuple[list[int], list[int], int]:
    """(query lengths, key lengths, window_left) of ``shape`` as (possibly) reduced: its first
    ``seqs`` sequences, every length scaled by ``ctx`` / the declared longest (rounded up, so
    no sequence vanishes), and the window's width scaled alike."""
    n = shape.dims["seqs"]
    q_lens = list(shape.params["q_lens"][:n])
    k_lens = list(shape.params["k_lens"][:n])
    window = shape.params.get("window_left", -1)
    full = max(shape.params["k_lens"], default=0)
    ctx = shape.dims["ctx"]
    if full and ctx < full:
        f = ctx / full
        q_lens = [math.ceil(x * f) for x in q_lens]
        k_lens = [math.ceil(x * f) for x in k_lens]
        if window >= 0:
            window = max(0, math.ceil((window + 1) * f) - 1)
    return q_lens, k_lens, window


def cumulative(lens: list[int], device) -> torch.Tensor:
    """int32 [len(lens) + 1] cumulative lengths from 0. For meta inputs (static analysis) they
    stay on the CPU, so the cost model can still read them."""
    where = "cpu" if torch.device(device).type == "meta" else device
    cu = [0]
    for x in lens:
        cu.append(cu[-1] + x)
    return torch.tensor(cu, dtype=torch.int32, device=where)


def qkv(shape: Shape, q_lens, k_lens, dtype, device, gen, dist) -> tuple:
    """q [Σ q_lens, Hq, D], k and v [Σ k_lens, Hkv, D] from ``dist``; with the ``fused_qkv``
    parameter (self-attention: equal lengths), views into one [tokens, (Hq + 2·Hkv)·D]
    projection output, as servers pass them (token stride (Hq + 2·Hkv)·D)."""
    d = shape.dims
    hq, hkv, hd = d["heads_q"], d["heads_kv"], d["head_dim"]
    tq, tk = sum(q_lens), sum(k_lens)
    if shape.params.get("fused_qkv"):
        fused = _inputs.randn((tq, (hq + 2 * hkv) * hd), dtype, device, gen, dist)
        q = fused[:, : hq * hd].view(tq, hq, hd)
        k = fused[:, hq * hd : (hq + hkv) * hd].view(tq, hkv, hd)
        v = fused[:, (hq + hkv) * hd :].view(tq, hkv, hd)
        return q, k, v
    q = _inputs.randn((tq, hq, hd), dtype, device, gen, dist)
    k = _inputs.randn((tk, hkv, hd), dtype, device, gen, dist)
    v = _inputs.randn((tk, hkv, hd), dtype, device, gen, dist)
    return q, k, v


def block_mask(batch, heads, q_lens, k_lens, mask_block, device, gen) -> torch.Tensor:
    """A random bool block mask [batch, heads, query blocks, key blocks] with about half the
    blocks kept, and the second query block of the first sequence (when it has one) masked
    entirely: rows that see no key. It is drawn on the CPU from its own stream of ``gen``'s
    seed (not from what the other inputs drew), so meta inputs (static analysis, floors) get
    the same mask, kept on the CPU like the cumulative lengths: the work it skips is data, and
    the cost model reads it (a few bytes per block)."""
    nqb = max(1, -(-max(q_lens, default=0) // mask_block))
    nkb = max(1, -(-max(k_lens, default=0) // mask_block))
    own = _inputs.generator(gen.initial_seed() + _MASK_STREAM if gen is not None else 0, "cpu")
    m = _inputs.randint((batch, heads, nqb, nkb), 0, 2, "cpu", own).to(torch.bool)
    if batch and nqb > 1:
        m[0, :, 1] = False
    return m if torch.device(device).type == "meta" else m.to(device)


#: Offset of the block mask's seed from the inputs' seed (any fixed value: its own stream).
_MASK_STREAM = 0x6D61736B
