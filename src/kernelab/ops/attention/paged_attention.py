"""Attention of a batch of queries to their sequences' keys in a paged KV cache: decode (one
query per sequence) and mixed batches (some sequences carry a chunk of prefill), in one kernel.

For sequence b with queries q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]] (q_len of them) and
kv_len = seq_lens[b] keys in the cache (the new tokens' keys written there already, by
``kv_cache_write``), query i sits at position kv_len − q_len + i (causal, aligned
bottom-right) and attends key j when j ≤ its position and, with ``window_left`` ≥ 0,
position − j ≤ window_left (the window_left + 1 = W most recent keys, itself included). For
query head h and KV head h // (Hq / Hkv):

    s_j = softmax_scale · q·k_j,  s_j ← cap · tanh(s_j / cap)        (``softcap``)
    out = Σ_j exp(s_j − m) v_j / (Σ_j exp(s_j − m) + exp(sink_h − m))    (``sinks``: a learned
    lse = m + log(Σ_j exp(s_j − m) + exp(sink_h − m))                      logit per head)

Keys are gathered through ``block_tables`` (layout in ``attention/_paged.py``). A query row that
sees no key returns zeros and lse −inf (lse = sink with sinks: the sink is a key of value 0). A
float8 cache is dequantized as value × scale (per tensor).

Roundings an honest kernel makes, declared in the contract: scores are float32 dot products
(the softmax turns their absolute error into a relative error of the weights: at scores near
10⁴ a near tie carries it into the output, ``_paged.score_spread``), P is rounded to the 16-bit
format before P·V (one narrowing), and the output once.

Split-KV (flash-decoding): when batch × KV heads cannot fill the device, each program's keys
are split ``num_splits`` ways; the splits write float32 partial outputs and log-sum-exps to a
workspace sized from shapes only, and ``merge_attention_states``' kernel reduces them. No host
synchronisation and no allocation sized from tensor contents: safe for CUDA-graph capture with
``check=False``.

The ladder: ``_paged_attention_kernel`` (``attention/_kernels.py``) → ``paged_attention_triton``
→ ``paged_attention`` (public), with ``paged_attention_ref`` (float64, plainly per sequence)
and ``paged_attention_torch`` (eager, ``scaled_dot_product_attention`` per sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernelab.core import Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan, cdiv
from kernelab.core.runtime.triton import next_pow2, num_sms, use_triton
from kernelab.ops.attention import _paged, _ragged
from kernelab.ops.attention._kernels import (
    _merge_attention_states_kernel,
    _paged_attention_kernel,
)

# --- launch heuristics as data ----------------------------------------------------------------


@dataclass(frozen=True)
class PagedConfig:
    """``block_q`` queries × the group's heads per program (M = block_q · next_pow2(group)
    rows), ``block_n`` keys per tile."""

    block_q: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    #: Rows of a decode program: tl.dot's smallest M on tensor cores (mma m16).
    DECODE_ROWS = 16
    #: Rows of a program when sequences carry prefill chunks (compute-bound).
    PREFILL_ROWS = 64
    #: Split-KV: at most this many splits, each of at least this many keys, until the grid has
    #: two programs per SM.
    MAX_SPLITS = 32
    MIN_KEYS_PER_SPLIT = 512

    @classmethod
    def default_for(
        cls, group: int, head_dim: int, tokens: int, batch: int, fp8: bool = False
    ) -> PagedConfig:
        rows = cls.DECODE_ROWS if tokens <= batch else cls.PREFILL_ROWS
        block_q = max(1, rows // next_pow2(group))
        # Measured with kernelab inspect (triton 3.9), spills are what the choice avoids:
        # 32 keys a tile (64 spill on gfx942 at decode, 12 SGPRs, and on sm_80 with 64-row
        # prefill tiles, 152 bytes); 8 warps at head_dim 256 (147 registers at 4 warps);
        # a float8 cache: 64 keys over 8 warps, the one tile no e4m3 conversion spilled on
        # sm_90 in float16 and bfloat16 at block sizes 16 and 64 (8 bytes otherwise).
        if fp8 and rows == cls.DECODE_ROWS:
            return cls(block_q, 64, 8)
        return cls(block_q, 32, 8 if rows == cls.DECODE_ROWS and head_dim > 128 else 4)

    @classmethod
    def splits_for(
        cls, tokens: int, batch: int, heads_kv: int, max_keys: int, block_q: int, device=None
    ) -> int:
        """Splits for a launch, from shapes only: the programs (query blocks × KV heads) against
        two per SM, capped by the keys a sequence may hold (the block table's width)."""
        programs = (tokens // block_q + batch) * heads_kv
        target = 2 * num_sms(device)
        if programs >= target or max_keys <= cls.MIN_KEYS_PER_SPLIT:
            return 1
        return max(
            1, min(cls.MAX_SPLITS, cdiv(target, programs), max_keys // cls.MIN_KEYS_PER_SPLIT)
        )

    @classmethod
    def tuning_space(cls, group: int, head_dim: int) -> list[PagedConfig]:
        pad = next_pow2(group)
        space = [
            cls(max(1, rows // pad), n, w, st)
            for rows in (16, 32, 64, 128)
            for n in (16, 32, 64, 128)
            for w in (2, 4, 8)
            for st in (1, 2, 3)
        ]

        def keep(c: PagedConfig) -> bool:
            m = c.block_q * pad
            # fp32 scores and accumulator per thread: past ~128 registers they spill
            per_thread = (m * c.block_n + m * next_pow2(head_dim)) // (32 * c.num_warps)
            return m <= 128 and per_thread <= 128

        return list(dict.fromkeys(c for c in space if keep(c)))


# --- reference, eager, launcher, public function ----------------------------------------------


def _finish(o, lse_v, out, lse, return_lse, dtype):
    o = o.to(dtype) if out is None else out.copy_(o)
    if not (return_lse or lse is not None):
        return o
    lse_v = lse_v.to(torch.float32 if dtype != torch.float64 else dtype)
    return o, (lse_v if lse is None else lse.copy_(lse_v))


def paged_attention_ref(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
    window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
    return_lse=False,
    out=None, lse=None, check=True,
):  # fmt: skip
    """Plain PyTorch per sequence in the inputs' dtype (exact in float64): pages gathered
    through the block table, the cache dequantized, scores masked, one softmax."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    window = _paged.window_of(window_left)

    def attend(q_b, k, v, visible):
        return _paged.softmax_attention(q_b, k, v, visible, scale, softcap, sinks, q.dtype)

    o, l_ = _paged.per_sequence(
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, window, k_scale, v_scale, attend
    )
    return _finish(o, l_, out, lse, return_lse, q.dtype)


def paged_attention_torch(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
    window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
    return_lse=False, out=None, lse=None, check=True, **deprecated,
):  # fmt: skip
    """Eager PyTorch per sequence (host loop; not graph-safe): gathered K/V in q's dtype and
    ``scaled_dot_product_attention`` with a boolean mask; softcap, sinks or a requested lse
    take the plain formula in float32 (SDPA expresses none of them)."""
    args = _paged.renamed(dict(locals()))  # the arguments, as named
    _validate(**args)
    return _eager(**args)


def _eager(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
    window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
    return_lse=False, out=None, lse=None, check=True,
):  # fmt: skip
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    plain = softcap or sinks is not None or return_lse or lse is not None

    def attend(q_b, k, v, visible):
        if plain:
            return _paged.softmax_attention(
                q_b, k, v, visible, scale, softcap, sinks, torch.float32
            )
        o = F.scaled_dot_product_attention(
            q_b.transpose(0, 1)[None],
            k.to(q.dtype).transpose(0, 1)[None],
            v.to(q.dtype).transpose(0, 1)[None],
            attn_mask=visible,
            scale=scale,
            enable_gqa=True,
        )[0].transpose(0, 1)
        seen = visible.any(dim=-1)[:, None, None]  # rows without keys: SDPA gives NaN
        return torch.where(seen, o, torch.zeros_like(o)), o.new_zeros(o.shape[1], o.shape[0])

    window = _paged.window_of(window_left)
    o, l_ = _paged.per_sequence(
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, window, k_scale, v_scale, attend
    )
    return _finish(o, l_, out, lse, return_lse, q.dtype)


def _validate(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
    window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
    return_lse=False,
    out=None, lse=None, check=True,
) -> None:  # fmt: skip
    """Dtypes and shapes from metadata; with ``check``, the contents of the integer inputs
    (a host synchronisation)."""
    _check.tensor("q", q, dtypes=_ragged.FLOATS_IN, ndim=3)
    _paged.unit_last("q", q)
    _paged.validate_caches(k_cache, v_cache, q.dtype, q.device)
    tokens, heads_q, head_dim = q.shape
    num_blocks, block_size, heads_kv, cache_dim = k_cache.shape
    if head_dim not in _paged.HEAD_DIMS:
        raise ValueError(f"q: expected head_dim in {_paged.HEAD_DIMS}, got {head_dim}")
    if cache_dim != head_dim:
        raise ValueError(f"k_cache: expected head_dim {head_dim} like q, got {cache_dim}")
    if heads_kv < 1 or heads_q % heads_kv:
        raise ValueError(
            f"k_cache: expected a number of KV heads dividing q's {heads_q} heads, got {heads_kv}"
        )
    _check.tensor("block_tables", block_tables, dtypes=(torch.int32,), ndim=2, device=q.device)
    batch = block_tables.shape[0]
    _check.tensor("seq_lens", seq_lens, dtypes=(torch.int32,), ndim=1, device=q.device)
    _check.same_shape("seq_lens", seq_lens, (batch,), "one length per block-table row")
    _check.tensor("cu_seqlens_q", cu_seqlens_q, dtypes=(torch.int32,), ndim=1, device=q.device)
    _check.same_shape("cu_seqlens_q", cu_seqlens_q, (batch + 1,), "batch + 1 offsets")
    if softmax_scale is not None:
        _check.finite_positive("softmax_scale", softmax_scale)
    _paged.window_left("window_left", window_left)
    _paged.softcap("softcap", softcap)
    _paged.positive_int("num_splits", num_splits, "split-KV parts")
    _check.boolean("return_lse", return_lse)
    _check.boolean("check", check)
    _paged.validate_scales(k_cache, k_scale, v_scale, check)
    if sinks is not None:
        _check.tensor("sinks", sinks, dtypes=(torch.float32,), ndim=1, device=q.device)
        _check.same_shape("sinks", sinks, (heads_q,), "one logit per query head")
    if out is not None:
        _check.tensor("out", out, dtypes=(q.dtype,), device=q.device)
        _check.same_shape("out", out, q.shape, "the shape of q")
        _paged.unit_last("out", out)
    if lse is not None:
        _check.tensor("lse", lse, dtypes=(torch.float32,), device=q.device)
        _check.same_shape("lse", lse, (tokens, heads_q), "(num_tokens, heads_q)")
    if check:
        _paged.check_batch(tokens, num_blocks, block_size, block_tables, seq_lens, cu_seqlens_q)


def _plan(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
    window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
    return_lse=False,
    out=None, lse=None, check=True,
    config=None,
) -> LaunchPlan:  # fmt: skip
    """The launches for these (validated) arguments: the attention kernel, and with more than
    one split the merge of the splits' partial results (kernels looked up at call time, so
    tests can replace them). Nothing is launched without tokens."""
    tokens, heads_q, head_dim = q.shape
    batch, max_blocks = block_tables.shape
    _, block_size, heads_kv, _ = k_cache.shape
    group = heads_q // heads_kv
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    want_lse = bool(return_lse) or lse is not None
    if want_lse and lse is None:
        lse = torch.empty((tokens, heads_q), dtype=torch.float32, device=q.device)
    result = (out, lse) if want_lse else out
    if tokens == 0 or batch == 0:
        return LaunchPlan(result=result)
    fp8 = _paged.is_fp8(k_cache)
    cfg = config or PagedConfig.default_for(group, head_dim, tokens, batch, fp8)
    splits = num_splits or PagedConfig.splits_for(
        tokens, batch, heads_kv, max_blocks * block_size, cfg.block_q, q.device
    )
    if splits > 1:
        o = torch.empty((splits, tokens, heads_q, head_dim), dtype=torch.float32, device=q.device)
        l_ = torch.empty((splits, tokens, heads_q), dtype=torch.float32, device=q.device)
        o_strides, l_strides = o.stride(), l_.stride()
    else:  # the kernel writes the output (and lse) itself
        o, o_strides = out, (0, *out.stride()[:2])
        l_, l_strides = (lse, (0, *lse.stride())) if want_lse else (out, (0, 0, 0))
    call = KernelCall(
        _paged_attention_kernel,
        (tokens // cfg.block_q + batch, heads_kv, splits),
        dict(
            O=o,
            stride_o_s=o_strides[0],
            stride_o_t=o_strides[1],
            stride_o_h=o_strides[2],
            L=l_,
            stride_l_s=l_strides[0],
            stride_l_t=l_strides[1],
            stride_l_h=l_strides[2],
            Q=q,
            stride_q_t=q.stride(0),
            stride_q_h=q.stride(1),
            KCache=k_cache,
            stride_k_b=k_cache.stride(0),
            stride_k_s=k_cache.stride(1),
            stride_k_h=k_cache.stride(2),
            VCache=v_cache,
            stride_v_b=v_cache.stride(0),
            stride_v_s=v_cache.stride(1),
            stride_v_h=v_cache.stride(2),
            BlockTables=block_tables,
            stride_bt=block_tables.stride(0),
            stride_bt_j=block_tables.stride(1),
            SeqLens=seq_lens,
            stride_sl=seq_lens.stride(0),
            CuSeqlensQ=cu_seqlens_q,
            stride_cq=cu_seqlens_q.stride(0),
            Sinks=sinks if sinks is not None else seq_lens,
            stride_sink=sinks.stride(0) if sinks is not None else 0,
            KScale=k_scale if fp8 else seq_lens,
            VScale=v_scale if fp8 else seq_lens,
            batch=batch,
            tokens=tokens,
            max_blocks=max_blocks,
            scale=float(head_dim**-0.5 if softmax_scale is None else softmax_scale),
            softcap=float(softcap or 0.0),
            window=window_left + 1 if window_left >= 0 else 0,  # the kernel's W: keys seen
            GROUP=group,
            GROUP_PAD=next_pow2(group),
            BLOCK_Q=cfg.block_q,
            BLOCK_N=cfg.block_n,
            BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim,
            BLOCK_D=next_pow2(head_dim),
            NUM_SPLITS=splits,
            HAS_WINDOW=window_left >= 0,
            HAS_SOFTCAP=bool(softcap),
            HAS_SINKS=sinks is not None,
            FP8=fp8,
            WRITE_LSE=splits > 1 or want_lse,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    if splits == 1:
        return LaunchPlan((call,), result)
    reduce = _paged.merge_call(
        _merge_attention_states_kernel, out, lse if want_lse else None, o, l_
    )
    return LaunchPlan((call, reduce), result)


def paged_attention_triton(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
    window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
    return_lse=False,
    out=None, lse=None, check=True,
    config=None, **deprecated,
):  # fmt: skip
    """Launch the Triton kernels (natively on GPUs, through the interpreter on CPU tensors)."""
    args = dict(locals())  # the arguments, as named
    del args["config"]
    args = _paged.renamed(args)
    _validate(**args)
    return _plan(**args, config=config).run()


def _pallas_plan(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
    window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
    return_lse=False, out=None, lse=None, check=True, config=None, target=None,
):  # fmt: skip
    """The Pallas launch for these (validated) arguments (``attention/_pallas.py``): fp8
    caches and the log-sum-exp are not in it (refused, naming the argument); ``num_splits``
    is a split-KV hint of the Triton kernel, not used."""
    from kernelab.ops.attention import _pallas

    if _paged.is_fp8(k_cache):
        raise ValueError("k_cache: a float8 cache is not supported by the Pallas variant")
    if return_lse or lse is not None:
        raise ValueError("return_lse, lse: the Pallas variant does not return the log-sum-exp")
    window = window_left + 1 if window_left >= 0 else 0  # the kernel's W: keys seen
    return _pallas.paged_decode_plan(
        q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, softmax_scale, window,
        softcap, sinks, out, config, target,
    )  # fmt: skip


def paged_attention_pallas(
    q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, *, softmax_scale=None,
    window_left=-1, softcap=0.0, sinks=None, k_scale=None, v_scale=None, num_splits=None,
    return_lse=False, out=None, lse=None, check=True,
    config=None, **deprecated,
):  # fmt: skip
    """The Pallas kernel: natively on a TPU, through the TPU interpreter on CPU tensors."""
    args = dict(locals())  # the arguments, as named
    del args["config"]
    args = _paged.renamed(args)
    _validate(**args)
    return _pallas_plan(**args, config=config).run()


def _pallas_supports(shape: Shape) -> str | None:
    return "fp8 KV cache: not in the Pallas variant" if shape.params.get("fp8") else None


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    check: bool = True,
    **deprecated,
):
    """Attention of ``q`` to the paged KV cache (module docstring for the conventions).

    Parameters
    ----------
    q : tensor (num_tokens, heads_q, head_dim) of float16 or bfloat16, the sequences' queries
        one after the other; any token and head strides (a view of a fused qkv projection),
        unit stride within a head. head_dim 64, 96, 128 or 256.
    k_cache, v_cache : tensors (num_blocks, block_size, heads_kv, head_dim) of q's dtype or
        float8 e4m3; heads_q a multiple of heads_kv (GQA, MQA).
    block_tables : int32 (batch, max_blocks): each sequence's blocks in key order.
    seq_lens : int32 (batch,): keys per sequence in the cache (this step's included).
    cu_seqlens_q : int32 (batch + 1,): offsets of each sequence's queries in ``q``; a sequence
        may have none. One query per sequence is decode.
    softmax_scale : multiplies q·k (default head_dim ** −0.5).
    window_left : a query at position p sees keys j ≥ p − window_left (sliding window; −1:
        none). A model's ``sliding_window`` W is window_left = W − 1 (FlashAttention's
        ``window_size[0]``, FlashInfer's ``window_left``), as in ``attention_prefill``.
    softcap : logit soft cap (scores become cap · tanh(score / cap)); 0 for none.
    sinks : float32 (heads_q,): a learned logit per query head added to the softmax
        denominator (a key of value 0).
    k_scale, v_scale : float32 (1,): the per-tensor scales of a float8 cache.
    num_splits : split-KV parts (None: chosen from shapes; 1: no split).
    return_lse : also return the float32 log-sum-exp (num_tokens, heads_q), natural log.
    out, lse : optional preallocated outputs.
    check : check cumulative lengths, lengths, block-table entries and the float8 scales
        (finite, positive) on the host (a device synchronisation); off in a serving loop, and
        for CUDA-graph capture. Unchecked, the Triton kernel writes nothing outside ``out``
        (and ``lse``) whatever the metadata: a sequence's query rows are clamped to
        [0, num_tokens) and its length to its block-table row (max_blocks × block_size keys),
        so it reads only its own row; wrong metadata gives wrong rows, never a write
        elsewhere. Block-table entries are used as they are: an entry outside the cache reads
        outside it (garbage, or a fault).

    Returns ``out`` (q's shape and dtype), or ``(out, lse)``. Triton on CUDA/ROCm; torch on CPU
    (the interpreter with KERNELAB_INTERPRET=1). The names ``scale=`` and ``window=`` (W, keys
    seen) of earlier versions are accepted with a DeprecationWarning for one release.
    """
    args = _paged.renamed(dict(locals()))  # the arguments, as named
    if isinstance(q, torch.Tensor) and use_triton(q):
        return paged_attention_triton(**args)
    return paged_attention_torch(**args)


# --- the declaration ---------------------------------------------------------------------------

#: Decode (batch, context) points of Llama-3 8B's heads; others take a few of them.
LLAMA_DECODE = (
    (1, 512),
    (1, 4096),
    (1, 32768),
    (1, 131072),
    (8, 512),
    (8, 4096),
    (8, 32768),
    (64, 512),
    (64, 4096),
    (64, 8192),
)
#: Other models at a few decode points (the windowed ones at contexts past their window).
OTHERS = (
    ("llama3-70b", ((8, 4096), (1, 32768))),
    ("qwen2.5-7b", ((8, 4096), (64, 4096))),
    ("mistral-7b", ((8, 32768), (1, 131072))),
    ("gemma2-9b", ((8, 8192), (1, 32768))),
    ("gpt-oss-20b", ((8, 4096), (64, 8192))),
)


def _declared(dims, fp8: bool, device=None) -> tuple[PagedConfig, int]:
    """The config and split count the plan picks for a batch of these (declared) sizes."""
    batch, chunk, block_size = dims["batch"], dims["chunk"], dims["block_size"]
    tokens = batch + max(chunk - 1, 0)  # the decodes, and the chunk's queries
    cfg = PagedConfig.default_for(
        dims["heads_q"] // dims["heads_kv"], dims["head_dim"], tokens, batch, fp8
    )
    max_keys = (cdiv(dims["context"], block_size) + 1) * block_size  # a spare table column
    return cfg, PagedConfig.splits_for(
        tokens, batch, dims["heads_kv"], max_keys, cfg.block_q, device
    )


def _shape(label, model, batch, context, block_size=16, chunk=0, fp8=False) -> Shape:
    """A batch of ``batch`` sequences of ``context`` keys at decode (the last one a prefill
    chunk of ``chunk`` queries when given). Through the interpreter the batch is cut to the
    cap, and the context (and window, and chunk) to a few tiles per split: the split count
    stays the one the full shape gets (``Shape.full_dims``), so each program runs the same
    code over fewer tiles."""
    m = _paged.MODELS[model]
    dims = {
        "batch": batch,
        "heads_q": m.heads_q,
        "heads_kv": m.heads_kv,
        "head_dim": m.head_dim,
        "block_size": block_size,
        "context": context,
        "window": m.window or 0,
        "chunk": chunk,
    }
    cfg, splits = _declared(dims, fp8)
    keep = splits * cfg.block_n + cfg.block_n // 2 + 3  # every split a tile, a partial tile
    cut = {"context": keep, "window": max(3, keep // 3), "chunk": min(chunk, 21)}
    extras = [
        f"window {m.window}" if m.window else "",
        f"softcap {m.softcap:g}" if m.softcap else "",
    ]
    extras += ["sinks" if m.sinks else "", "fp8" if fp8 else "", f"chunk {chunk}" if chunk else ""]
    return Shape(
        f"{model} {label} b{batch} ctx{context} bs{block_size}"
        + "".join(f" {e}" for e in extras if e),
        dims,
        {"softcap": m.softcap, "sinks": m.sinks, "fp8": fp8},
        batch_dim="batch",
        reduce_to={k: v for k, v in cut.items() if dims[k]},
    )


def _representative() -> list[Shape]:
    shapes = [_shape("decode", "llama3-8b", b, c) for b, c in LLAMA_DECODE]
    shapes += [_shape("decode", "llama3-8b", 64, 8192, block_size=64)]
    shapes += [_shape("decode", "llama3-8b", 8, 4096, fp8=True)]
    shapes += [_shape("decode", "llama3-8b", 64, 8192, block_size=64, fp8=True)]
    shapes += [_shape("decode", name, b, c) for name, points in OTHERS for b, c in points]
    # 8 decodes at 4096 and a 512-query chunk of prefill closing a 2048-key sequence... as one
    # batch of 9 whose last sequence carries the chunk (its keys: the same context).
    shapes += [_shape("mixed", "llama3-8b", 9, 4096, chunk=512)]
    return shapes


def _edge_shape(label, kv_lens, q_lens=None, heads=(8, 2), head_dim=64, block_size=16, **p):
    q_lens = [1] * len(kv_lens) if q_lens is None else list(q_lens)
    dims = {
        "batch": len(kv_lens),
        "heads_q": heads[0],
        "heads_kv": heads[1],
        "head_dim": head_dim,
        "block_size": block_size,
    }
    return Shape(
        f"{label} ({'/'.join(map(str, q_lens))} q, {'/'.join(map(str, kv_lens))} kv)",
        dims,
        {"kv_lens": tuple(kv_lens), "q_lens": tuple(q_lens), **p},
    )


def _edge() -> list[Shape]:
    e = _edge_shape
    return [
        e("one token", [1]),
        e("length = block size and block size + 1", [16, 17]),
        e("a zero-length sequence in the batch", [5, 0, 9], [1, 0, 1]),
        e("prime lengths, 3 splits", [7, 13, 31, 97], num_splits=3),
        e("lengths 1 and 32k in one batch", [1, 32768], heads=(4, 1), block_size=64),
        e("window longer than the sequence", [100, 37], window=4096),
        e("window at a block edge", [40, 33], [3, 1], window=16),
        e("mixed: decodes and chunked prefill", [10, 40, 3, 19], [1, 5, 1, 19]),
        e("more queries than keys: first rows see nothing", [2], [4]),
        e("q a strided view of a fused qkv", [20, 9], fused=True),
        e("block table in descending order", [50, 33], order="descending"),
        e("empty batch", []),
        e("GQA 7:1 head_dim 128", [30, 65], heads=(14, 2), head_dim=128),
        e(
            "softcap 50 window 32 head_dim 256",
            [70, 5],
            heads=(4, 2),
            head_dim=256,
            window=32,
            softcap=50.0,
        ),
        e("sinks window 8", [20, 3], [2, 1], window=8, sinks=True),
        e("fp8 e4m3 cache block 64", [100, 65], block_size=64, fp8=True),
        e("head_dim 96", [20, 33], head_dim=96),
        e("MQA", [17, 40], heads=(8, 1)),
        e("one query head per KV head", [17, 40], heads=(4, 4)),
        e("split-KV with empty splits", [70, 200], num_splits=6),
    ]


def meta_or(device):
    """Where the integer metadata goes: the CPU for meta inputs, else ``device``."""
    return "cpu" if torch.device(device).type == "meta" else device


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    d, p = shape.dims, shape.params
    q_lens, kv_lens = _paged.lengths(shape)
    hq, hkv, head_dim, block_size = d["heads_q"], d["heads_kv"], d["head_dim"], d["block_size"]
    tokens = sum(q_lens)
    if p.get("fused"):
        qkv = _inputs.randn((tokens, (hq + 2 * hkv) * head_dim), dtype, device, gen, dist)
        q = qkv[:, : hq * head_dim].view(tokens, hq, head_dim)
    else:
        q = _inputs.randn((tokens, hq, head_dim), dtype, device, gen, dist)
    table, num_blocks = _paged.block_tables(kv_lens, block_size, p.get("order", ""), device, gen)
    cache = _paged.caches(
        num_blocks, block_size, hkv, head_dim, dtype, bool(p.get("fp8")), device, gen, dist
    )
    sinks = None
    if p.get("sinks"):
        sinks = _inputs.randn((hq,), torch.float32, device, gen, "normal", scale=2.0)
    window = d.get("window") or p.get("window") or None
    num_splits = p.get("num_splits")
    if num_splits is None and "kv_lens" not in p:
        num_splits = _declared(shape.full_dims, bool(p.get("fp8")), device)[
            1
        ]  # as at full size (see _shape)
    return {
        "q": q,
        "k_cache": cache["k_cache"],
        "v_cache": cache["v_cache"],
        "block_tables": table,
        # for meta inputs (static analysis, floors) the lengths stay on the CPU, where the
        # cost model reads them, as attention_prefill's cumulative lengths do
        "seq_lens": torch.tensor(kv_lens, dtype=torch.int32).to(meta_or(device)),
        "cu_seqlens_q": _paged.cumulative(q_lens, meta_or(device)),
        "softmax_scale": head_dim**-0.5,
        "window_left": window - 1 if window else -1,
        "softcap": p.get("softcap") or 0.0,
        "sinks": sinks,
        "k_scale": cache["k_scale"],
        "v_scale": cache["v_scale"],
        "num_splits": num_splits,
        "check": True,
    }


def _keys(inputs: dict) -> int:
    """``Contract.reduction``: the longest sequence's keys."""
    lens = inputs["seq_lens"]
    return int(lens.max()) if lens.numel() else 0


def _cost(inputs: dict) -> Cost:
    """FLOPs of the unmasked scores only (q·k and p·v, 4·D each); bytes: q and out once, and
    the keys and values some query of a sequence sees, once per KV head, with their block-table
    entries (decode is memory-bound: the KV bytes)."""
    q, k_cache = inputs["q"], inputs["k_cache"]
    _, hq, head_dim = q.shape
    _, block_size, hkv, _ = k_cache.shape
    cu, lens = inputs["cu_seqlens_q"].tolist(), inputs["seq_lens"].tolist()
    scores, keys, pages = 0, 0, 0
    for b, kv_len in enumerate(lens):
        n, lo, hi = _paged.visible_keys(
            cu[b + 1] - cu[b], kv_len, _paged.window_of(inputs.get("window_left", -1))
        )
        scores += n
        keys += hi - lo
        pages += cdiv(hi, block_size) - lo // block_size if hi > lo else 0
    kv_bytes = 2 * keys * hkv * head_dim * k_cache.element_size()
    nbytes = 2 * q.numel() * q.element_size() + kv_bytes + 4 * pages + 4 * (2 * len(lens) + 1)
    return Cost(flops=float(4 * scores * hq * head_dim), bytes=float(nbytes))


PAGED_ATTENTION = register(
    Op(
        "paged_attention",
        description="queries against a paged KV cache: decode and mixed batches, GQA, split-KV, "
        "window, softcap, sinks, fp8 KV",
        reference=paged_attention_ref,
        make_inputs=_make_inputs,
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # NaN and ±Inf go into the queries: a cache's non-finite entries are not attention's to
        # reproduce (and the sinks are learned parameters).
        # The tolerance is derived from the output's rounding (about 2e-4 in float16 and 2e-3
        # in bfloat16) and the keys: the kernel rounds P to the cache's format once before
        # P·V, so one narrowing is declared; one more (partial outputs of a split rounded to
        # 16 bits, say) fails, as one key too many among a few hundred does. The scores are
        # float32 dot products, and the softmax turns their absolute error into a relative
        # error of the weights: declared as the amplified spread (``_paged.score_spread``).
        # the fp8 cache's per-tensor scales are calibrated once: not a step's data
        contract=Contract(
            special_inputs=("q",),
            data_inputs=("q", "k_cache", "v_cache", "sinks"),
            reduction=_keys,
            narrowings=1,
            amplified=_paged.spread,
        ),
        dtypes=(torch.float16, torch.bfloat16),
        kernels=(_paged_attention_kernel, _merge_attention_states_kernel),
        plan=_plan,
        tuning_space=lambda shape, dtype: PagedConfig.tuning_space(
            shape.dims["heads_q"] // shape.dims["heads_kv"], shape.dims["head_dim"]
        ),
    )
)
PAGED_ATTENTION.add_variant(
    Variant(
        "kernelab",
        paged_attention_triton,
        "triton",
        description="Triton, GQA-packed tl.dot tiles, split-KV with a merge when the grid is small",
    )
)
PAGED_ATTENTION.add_variant(
    Variant(
        "pallas",
        paged_attention_pallas,
        "pallas",
        plan=_pallas_plan,
        supports=_pallas_supports,
        description="Pallas TPU kernel: pages by DMA into a two-slot VMEM buffer (no fp8 KV)",
    )
)
PAGED_ATTENTION.add_torch(paged_attention_torch)
