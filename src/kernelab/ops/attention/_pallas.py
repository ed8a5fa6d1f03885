"""Pallas (TPU) attention kernels and their declared launches.

Paged decode (``paged_attention``), over the op's own cache layout (vLLM's "flash" layout:
``[num_blocks, block_size, heads_kv, head_dim]``, no conversion): one grid point per query
token and KV head. The token's sequence, the block table, the lengths and the query offsets are
scalar-prefetched into SMEM; the cache stays in HBM (``memory="any"``) and the pages a query
sees are copied into a two-slot VMEM buffer by DMA (``pltpu.make_async_copy``), the next step's
pages in flight while the current ones are used (online softmax in float32, one rounding at the
end). A chunk of prefill in a mixed batch is one query row per token (each row reads its
sequence's keys: decode-shaped work; long prefills belong to ``attention_prefill``).

Flash prefill (``attention_prefill``) over the op's ragged layout (q ``[total_q, Hq, D]``,
k and v ``[total_k, Hkv, D]``, packed along tokens by ``cu_seqlens``): query blocks are blocks
of the packed tokens, so a block may straddle sequences. q, k and v go in head-major
(``[H, tokens, D]``: transposed copies, so that a block's last two dimensions are tokens × D,
the TPU's tiling), the output comes back to ``[tokens, Hq, D]``. Each query row carries its visible
key range [lo, hi) in packed key indices (its sequence's keys, causal aligned bottom-right, the
window), computed on the host from ``cu_seqlens``; each query block's key blocks, from the
first any row sees to the last, are scalar-prefetched as (start, count). The grid is (query
blocks, query heads, key steps): the key axis is "arbitrary", bounded by the key blocks of the
whole batch (static: no shape depends on tensor contents), its steps past a block's count
neither compute nor copy (the index map repeats the last block). GQA: K/V blocks of head
h // G. A row that sees no key returns zeros and lse −inf (lse = sink with sinks).

Imported only when a Pallas variant runs or is described (jax on first use).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core.runtime import pallas as _pl
from kernelab.core.runtime.pallas import Block, Out, PallasCall, PallasPlan, Scratch

#: A running maximum that is finite (exp(m − m') stays a number when nothing was seen yet).
M_INIT = -1e30

# --- paged decode ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PagedSteps:
    """Pages copied per step of the paged decode loop.

    Default: enough pages for the MXU's width of keys per step (128 keys on v5e, 256 on v6e
    and TPU7x), so that q·kᵀ is one full-width matmul; a choice from the MXU geometry, not a
    measurement (no TPU here). ``tuning_space`` lists 1 to 16 pages within VMEM.
    """

    pages_per_step: int

    @classmethod
    def default_for(cls, block_size: int, head_dim: int, dtype=torch.bfloat16, target=None):
        mxu = _pl.CHIPS[_pl.generation(target)].mxu
        return cls(max(1, mxu // block_size))

    @classmethod
    def tuning_space(cls, block_size: int, head_dim: int, dtype=torch.bfloat16, target=None):
        vmem = _pl.CHIPS[_pl.generation(target)].vmem_bytes
        el = torch.empty((), dtype=dtype).element_size()
        return [
            cls(p)
            for p in (1, 2, 4, 8, 16)
            if 4 * p * block_size * head_dim * el <= vmem // 16  # K and V, two slots each
        ] or [cls(1)]


def _decode_bounds(seq_ref, lens_ref, cu_ref, t, window):
    """(sequence, first visible key, end of visible keys) of query token ``t``: its position
    is kv_len − q_len + i (causal, aligned bottom-right); a window keeps the last ``window``."""
    import jax.numpy as jnp

    b = seq_ref[t]
    kv_len = lens_ref[b]
    start = cu_ref[b]
    pos = kv_len - (cu_ref[b + 1] - start) + (t - start)
    hi = jnp.minimum(kv_len, pos + 1)
    lo = jnp.maximum(pos - window + 1, 0) if window else jnp.int32(0)
    return b, lo, jnp.maximum(hi, lo)


def _page_copies(
    k_hbm, v_hbm, kbuf, vbuf, sem, tables_ref, b, h, step, slot, *, pps, bs, max_pages, n_pages
):
    """The DMA descriptors of step ``step``'s pages (those inside the sequence) into ``slot``."""
    from jax.experimental.pallas import tpu as pltpu

    copies = []
    for i in range(pps):
        p = step * pps + i
        page = tables_ref[b * max_pages + p]
        rows = slice(i * bs, (i + 1) * bs)
        copies.append(
            (
                p < n_pages,
                pltpu.make_async_copy(
                    k_hbm.at[page, :, h, :], kbuf.at[slot, rows], sem.at[0, slot, i]
                ),
                pltpu.make_async_copy(
                    v_hbm.at[page, :, h, :], vbuf.at[slot, rows], sem.at[1, slot, i]
                ),
            )
        )
    return copies


def _start(copies):
    from jax.experimental import pallas as pl

    for inside, k, v in copies:

        @pl.when(inside)
        def _(k=k, v=v):
            k.start()
            v.start()


def _wait(copies):
    from jax.experimental import pallas as pl

    for inside, k, v in copies:

        @pl.when(inside)
        def _(k=k, v=v):
            k.wait()
            v.wait()


def _attend(carry, q, k, v, first_key, lo, hi, softcap, scale):
    """One step of online softmax over keys ``first_key`` … of the (keys, D) tiles ``k``, ``v``;
    keys outside [lo, hi) (scalars, or per query row: (rows, 1)) are masked, and the value
    rows no query sees are zeroed (a stale page or a block past the array never reaches the
    sum)."""
    import jax
    import jax.numpy as jnp

    m, l_, acc = carry
    keys = first_key + jax.lax.broadcasted_iota(jnp.int32, (1, k.shape[0]), 1)
    visible = (keys >= lo) & (keys < hi)
    # q·k in float32 from the unrounded operands, then scaled: a pre-scaled, re-rounded q would
    # move large scores by more than their gaps.
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s = s * scale
    if softcap:
        s = softcap * jnp.tanh(s / softcap)
    s = jnp.where(visible, s, -jnp.inf)
    m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new)
    used = visible.any(axis=0).reshape(-1, 1)  # keys some row sees
    v = jnp.where(used, v, jnp.zeros_like(v))
    pv = jax.lax.dot_general(
        p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )
    return m_new, alpha * l_ + p.sum(axis=-1, keepdims=True), alpha * acc + pv


def _finish_rows(m, l_, acc, sink, seen):
    """out = acc / l with the sink's exp(sink − m) in the denominator; 0 where the row sees no
    key (``seen`` False). A row that sees keys whose scores are all −inf gets 0 / 0 = NaN, as
    the reference's softmax does."""
    import jax.numpy as jnp

    if sink is not None:
        m_new = jnp.maximum(m, sink)
        alpha = jnp.exp(m - m_new)
        l_ = alpha * l_ + jnp.exp(sink - m_new)
        acc = alpha * acc
    return jnp.where(seen, acc / l_, 0.0)


def _paged_decode_kernel(
    seq_ref, tables_ref, lens_ref, cu_ref, q_ref, k_hbm, v_hbm, *rest,
    scale, window, softcap, has_sinks, pps, bs, max_pages,
):  # fmt: skip
    """Query token t = program 0 against its sequence's pages for KV head h = program 1, its
    G = Hq / Hkv query heads together (a (G, D) tile): the visible pages stream through a
    two-slot VMEM buffer by DMA, step s + 1's copies started before step s is used. Reads each
    visible page of K and V once per (token, KV head), q once; writes the (G, D) output once."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    sinks_ref = rest[0] if has_sinks else None
    o_ref, kbuf, vbuf, sem = rest[1:] if has_sinks else rest
    t, h = pl.program_id(0), pl.program_id(1)
    b, lo, hi = _decode_bounds(seq_ref, lens_ref, cu_ref, t, window)
    n_pages = (hi + bs - 1) // bs
    first = lo // (bs * pps)
    steps = jnp.where(hi > lo, (n_pages + pps - 1) // pps - first, 0)
    q = q_ref[...]
    g = q.shape[0]

    def copies(step, slot):
        return _page_copies(
            k_hbm, v_hbm, kbuf, vbuf, sem, tables_ref, b, h, step, slot,
            pps=pps, bs=bs, max_pages=max_pages, n_pages=n_pages,
        )  # fmt: skip

    @pl.when(steps > 0)
    def _():
        _start(copies(first, 0))

    def body(i, carry):
        step, slot = first + i, i % 2

        @pl.when(i + 1 < steps)
        def _():
            _start(copies(step + 1, 1 - slot))

        _wait(copies(step, slot))
        return _attend(carry, q, kbuf[slot], vbuf[slot], step * pps * bs, lo, hi, softcap, scale)

    init = (
        jnp.full((g, 1), M_INIT, jnp.float32),
        jnp.zeros((g, 1), jnp.float32),
        jnp.zeros(q.shape, jnp.float32),
    )
    m, l_, acc = jax.lax.fori_loop(0, steps, body, init)
    sink = sinks_ref[...].astype(jnp.float32).reshape(g, 1) if has_sinks else None
    o_ref[...] = _finish_rows(m, l_, acc, sink, hi > lo).astype(o_ref.dtype)


def token_sequences(cu_seqlens_q: torch.Tensor, tokens: int) -> torch.Tensor:
    """The sequence of each query token (int32), from the cumulative query lengths."""
    if cu_seqlens_q.device.type == "meta":
        return torch.empty(tokens, dtype=torch.int32, device="meta")
    ids = torch.arange(tokens, dtype=cu_seqlens_q.dtype, device=cu_seqlens_q.device)
    return (torch.searchsorted(cu_seqlens_q[1:].contiguous(), ids, right=True)).to(torch.int32)


def paged_decode_plan(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, scale=None, window=None,
    softcap=None, sinks=None, out=None, config=None, target=None,
) -> PallasPlan:  # fmt: skip
    """The launch of ``_paged_decode_kernel`` for these (validated) arguments: grid (tokens,
    KV heads), both "parallel"; q viewed as [tokens, Hkv, G, D] and blocked (G, D) per point."""
    tokens, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    g = hq // hkv
    result = out if out is not None else torch.empty_like(q, memory_format=torch.contiguous_format)
    if tokens == 0:
        return PallasPlan(result=result)
    cfg = config or PagedSteps.default_for(bs, d, q.dtype, target)
    pps = cfg.pages_per_step
    batch, max_pages = block_tables.shape
    # Pad the table so that a step's last pages index inside it (they are never copied).
    pad = (-max_pages) % pps
    tables = block_tables
    if pad:
        tables = torch.cat([block_tables, block_tables.new_zeros(batch, pad)], dim=1)
    width = max_pages + pad
    q4 = q.reshape(tokens, hkv, g, d)
    qo = Block((None, None, g, d), lambda t, h, *_: (t, h, 0, 0))
    inputs = [
        token_sequences(cu_seqlens_q, tokens),
        tables.reshape(-1),
        seq_lens,
        cu_seqlens_q,
        q4,
        k_cache,
        v_cache,
    ]
    specs = [qo, Block(memory="any"), Block(memory="any")]
    if sinks is not None:
        # (Hkv, 1, G): a (1, G) block equal to the array's last two dims, which TPU tiling
        # accepts, where a (1, G) block of an (Hkv, G) array does not lower
        inputs.append(sinks.reshape(hkv, 1, g))
        specs.append(Block((None, 1, g), lambda t, h, *_: (h, 0, 0)))
    call = PallasCall(
        _paged_decode_kernel,
        grid=(tokens, hkv),
        inputs=tuple(inputs),
        in_specs=tuple(specs),
        outputs=(Out((tokens, hkv, g, d), result.dtype, qo),),
        scratch=(
            Scratch("vmem", (2, pps * bs, d), k_cache.dtype),
            Scratch("vmem", (2, pps * bs, d), v_cache.dtype),
            Scratch("dma", (2, 2, pps)),
        ),
        semantics=("parallel", "parallel"),
        num_scalar_prefetch=4,
        params=dict(
            scale=float(scale if scale is not None else d**-0.5),
            window=int(window or 0),
            softcap=float(softcap or 0.0),
            has_sinks=sinks is not None,
            pps=pps,
            bs=bs,
            max_pages=width,
        ),
        config=cfg,
    )

    def finish(outs):
        return result.copy_(outs[0][0].view(result.shape))

    return PallasPlan((call,), finish)


# --- flash prefill ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillBlocks:
    """(block_q, block_k) of the flash prefill. Default: 128 queries (the lse block is lane
    dimension) × the MXU's width of keys (128 on v5e, 256 on v6e/TPU7x); fewer queries than a
    block: one block of all. A choice from the MXU geometry, not a measurement."""

    block_q: int
    block_k: int

    @classmethod
    def default_for(
        cls, total_q: int, total_k: int, head_dim: int, dtype=torch.bfloat16, target=None
    ):
        mxu = _pl.CHIPS[_pl.generation(target)].mxu
        bq = 128 if total_q > 128 else max(total_q, 1)
        bk = mxu if total_k > mxu else max(total_k, 1)
        return cls(bq, bk)

    @classmethod
    def tuning_space(
        cls, total_q: int, total_k: int, head_dim: int, dtype=torch.bfloat16, target=None
    ):
        return [cls(q, k) for q in (128, 256, 512) for k in (128, 256, 512)]


def _prefill_kernel(
    kb_start_ref, kb_count_ref, q_ref, k_ref, v_ref, lo_ref, hi_ref, *rest,
    scale, softcap, has_sinks, bk,
):  # fmt: skip
    """Query block i = program 0, query head h = program 1, key step s = program 2: online
    softmax over the block's key blocks into float32 VMEM scratch (m, l, acc), zeroed at
    s == 0, written at the last step. Reads each q block once per head, the K/V blocks its
    rows see; writes the (bq, D) output block and its lse once."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    sinks_ref = rest[0] if has_sinks else None
    o_ref, lse_ref, m_sc, l_sc, acc_sc = rest[1:] if has_sinks else rest
    i, h, s = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    @pl.when(s == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, M_INIT, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @pl.when(s < kb_count_ref[i])
    def _step():
        q = q_ref[...]
        first_key = (kb_start_ref[i] + s) * bk
        carry = (m_sc[...], l_sc[...], acc_sc[...])
        m, l_, acc = _attend(
            carry, q, k_ref[...], v_ref[...], first_key, lo_ref[...], hi_ref[...], softcap, scale
        )
        m_sc[...], l_sc[...], acc_sc[...] = m, l_, acc

    @pl.when(s == pl.num_programs(2) - 1)
    def _write():
        m, l_ = m_sc[...], l_sc[...]
        sink = sinks_ref[0, h].astype(jnp.float32) if has_sinks else None
        seen = hi_ref[...] > lo_ref[...]
        o_ref[...] = _finish_rows(m, l_, acc_sc[...], sink, seen).astype(o_ref.dtype)
        if sink is not None:
            m_new = jnp.maximum(m, sink)
            l_ = jnp.exp(m - m_new) * l_ + jnp.exp(sink - m_new)
            m = m_new
        # An infinite score (an infinite query) makes the log-sum-exp +inf, as logsumexp does.
        lse = jnp.where(m == jnp.inf, jnp.inf, m + jnp.log(l_))
        lse_ref[...] = lse.reshape(1, -1)


def row_bounds(cu_q, cu_k, total_q, causal, window_left):
    """Each query token's visible keys [lo, hi) in packed key indices, as (total_q, 1) int32."""
    if cu_q.device.type == "meta":
        empty = torch.empty(total_q, 1, dtype=torch.int32, device="meta")
        return empty, empty.clone()
    cu_q, cu_k = cu_q.long(), cu_k.long()
    t = torch.arange(total_q, device=cu_q.device)
    b = torch.searchsorted(cu_q[1:].contiguous(), t, right=True)
    q_len, k_len = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
    if causal:
        pos = k_len - q_len + (t - cu_q[b])
        hi = torch.minimum(k_len, pos + 1)
        lo = (pos - window_left).clamp(min=0) if window_left >= 0 else torch.zeros_like(pos)
    else:
        lo, hi = torch.zeros_like(k_len), k_len
    hi = torch.maximum(hi, lo)
    return (lo + cu_k[b]).to(torch.int32)[:, None], (hi + cu_k[b]).to(torch.int32)[:, None]


def key_blocks(lo, hi, total_q, bq, bk):
    """(first key block, key block count) of each query block: the blocks its rows see."""
    n = _pl.cdiv(total_q, bq)
    if lo.device.type == "meta":
        empty = torch.empty(n, dtype=torch.int32, device="meta")
        return empty, empty.clone()
    pad = n * bq - total_q
    lo2 = torch.cat([lo[:, 0], lo.new_full((pad,), 2**30)]).view(n, bq).long()
    hi2 = torch.cat([hi[:, 0], hi.new_zeros(pad)]).view(n, bq).long()
    seen = hi2 > lo2
    first = torch.where(seen, lo2, torch.full_like(lo2, 2**30)).min(dim=1).values
    last = torch.where(seen, hi2, torch.zeros_like(hi2)).max(dim=1).values
    any_seen = seen.any(dim=1)
    start = torch.where(any_seen, first // bk, torch.zeros_like(first))
    count = torch.where(any_seen, (last + bk - 1) // bk - start, torch.zeros_like(first))
    return start.to(torch.int32), count.to(torch.int32)


def prefill_plan(
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True, softmax_scale=None, window_left=-1,
    softcap=0.0, sinks=None, out=None, lse_out=None, config=None, target=None,
) -> PallasPlan:  # fmt: skip
    """The launch of ``_prefill_kernel`` for these (validated) arguments; returns (out, lse)
    through ``finish`` (lse computed [Hq, 1, total_q], tokens along the lanes, and
    transposed back)."""
    total_q, hq, d = q.shape
    total_k, hkv, _ = k.shape
    g = hq // hkv
    result = out if out is not None else torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = (
        lse_out
        if lse_out is not None
        else torch.empty(total_q, hq, dtype=torch.float32, device=q.device)
    )
    if total_q == 0:
        return PallasPlan(result=(result, lse))
    if total_k == 0:
        raise ValueError("k: no keys at all is not supported by the Pallas prefill")
    cfg = config or PrefillBlocks.default_for(total_q, total_k, d, q.dtype, target)
    bq, bk = cfg.block_q, cfg.block_k
    lo, hi = row_bounds(cu_seqlens_q, cu_seqlens_k, total_q, causal, window_left)
    start, count = key_blocks(lo, hi, total_q, bq, bk)
    steps = _pl.cdiv(total_k, bk)

    def kv_map(i, h, s, start_ref, count_ref):
        return (h // g, start_ref[i] + _clamp_step(s, count_ref[i]), 0)

    # Head-major for the TPU's tiling (the last two block dimensions are tokens × D): a
    # transposed copy of q, k and v on the way in, of the output on the way out.
    q_t, k_t, v_t = (x.transpose(0, 1).contiguous() for x in (q, k, v))
    inputs = [start, count, q_t, k_t, v_t, lo, hi]
    specs = [
        Block((None, bq, d), lambda i, h, s, *_: (h, i, 0)),
        Block((None, bk, d), kv_map),
        Block((None, bk, d), kv_map),
        Block((bq, 1), lambda i, h, s, *_: (i, 0)),
        Block((bq, 1), lambda i, h, s, *_: (i, 0)),
    ]
    if sinks is not None:
        inputs.append(sinks.to(torch.float32).reshape(1, hq))
        specs.append(Block((1, hq), lambda i, h, s, *_: (0, 0), memory="smem"))
    call = PallasCall(
        _prefill_kernel,
        grid=(_pl.cdiv(total_q, bq), hq, steps),
        inputs=tuple(inputs),
        in_specs=tuple(specs),
        outputs=(
            Out(
                (hq, total_q, d), result.dtype, Block((None, bq, d), lambda i, h, s, *_: (h, i, 0))
            ),
            Out(
                (hq, 1, total_q), torch.float32, Block((None, 1, bq), lambda i, h, s, *_: (h, 0, i))
            ),
        ),
        scratch=(
            Scratch("vmem", (bq, 1), torch.float32),
            Scratch("vmem", (bq, 1), torch.float32),
            Scratch("vmem", (bq, d), torch.float32),
        ),
        semantics=("parallel", "parallel", "arbitrary"),
        num_scalar_prefetch=2,
        params=dict(
            scale=float(softmax_scale if softmax_scale is not None else d**-0.5),
            softcap=float(softcap or 0.0),
            has_sinks=sinks is not None,
            bk=bk,
        ),
        config=cfg,
    )

    def finish(outs):
        o, l_t = outs[0]
        result.copy_(o.transpose(0, 1))
        lse.copy_(l_t[:, 0, :].t())
        return result, lse

    return PallasPlan((call,), finish)


def _clamp_step(s, count):
    """Step ``s`` of a block with ``count`` key blocks, the last one repeated past the count
    (no new copy), 0 when there is none."""
    import jax.numpy as jnp

    return jnp.maximum(jnp.minimum(s, count - 1), 0)
