"""Attention over a ragged batch packed along tokens (varlen prefill, chunked prefill).

    q [total_q, Hq, D], k and v [total_k, Hkv, D], cu_seqlens_q / cu_seqlens_k int32 [batch + 1]
    out [total_q, Hq, D]  (and lse float32 [total_q, Hq] with ``return_lse``)

Sequence b's queries attend its keys (see ``_ragged`` for which keys a query sees: causal
aligned bottom-right, a left sliding window, a block mask), query head h reading KV head
h // (Hq / Hkv) (GQA, MQA), with logit softcap ``cap · tanh(s / cap)`` and per-head attention
sinks. ``lse`` is the natural log of the softmax denominator, sink included, so that
out = Σ_j exp(s_j − lse) · v_j; a row that sees no key has out = 0 and lse = −inf (the sink's
logit with sinks).

The ladder: ``_attention_prefill_kernel`` (Triton, ``_kernels``) → ``attention_prefill_triton``
(validate, then run ``_plan``) → ``attention_prefill`` (public) with ``attention_prefill_ref``
(float64-exact, plain per sequence) and ``attention_prefill_torch`` (eager SDPA per sequence)
beside it.

No ``compile`` variant: FlexAttention expresses every case (a document mask for the packing,
score_mod for softcap, its lse for sinks), but on the CPU each shape compiles for about 27 s
(one 4×256×64 causal case, measured on the 2-core development machine), and verify would
recompile for every shape and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from kernelab.core import Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan
from kernelab.core.runtime.triton import arch_of, next_pow2, sm_version, use_triton
from kernelab.ops.attention import _paged, _ragged
from kernelab.ops.attention._kernels import _attention_prefill_kernel

# --- launch heuristics as data ----------------------------------------------------------------


#: Defaults per target and head-dim class (64, up to 128, 256): (block_m, block_n, warps,
#: stages). Each was compiled for its target (``kernelab inspect``, triton 3.9) on the
#: representative launch that needs the most registers, with a window (Mistral, Gemma-2 chunked,
#: gpt-oss): none spills, every one uses the target's tensor cores; not yet timed on a GPU.
DEFAULTS = {
    # sm_90: 128 rows over two warpgroups (wgmma M = 64 each); D 64: 128 registers (2 blocks
    # per SM), D 128: 180-223 registers and 128 KB of shared memory (3 stages of K and V); D 256:
    # 243 registers (128 x 64 spilled 24-400 bytes).
    "sm_90": {64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)},
    # sm_80 (mma.sync keeps q's fragments in registers): 128 x 64 over 8 warps spilled 32-56
    # bytes at D 128, 64 x 64 over 4 warps does not (255 registers, 2 blocks per SM); D 64:
    # 181 registers; D 256: 236.
    "sm_80": {64: (128, 64, 8, 2), 128: (64, 64, 4, 2), 256: (64, 32, 8, 2)},
    # gfx942 (64 KB of LDS): 128 x 32 over 4 waves, 162 VGPRs at D 64 and 239 at D 128
    # (128 x 64 spilled); D 256: 64 x 16, 205 VGPRs.
    "gfx942": {64: (128, 32, 4, 2), 128: (128, 32, 4, 2), 256: (64, 16, 4, 2)},
    # Unknown target (meta tensors, static analysis): clean on sm_80, sm_90 and gfx942 alike.
    None: {64: (128, 32, 4, 2), 128: (64, 16, 4, 2), 256: (64, 16, 8, 2)},
}


@dataclass(frozen=True)
class PrefillConfig:
    """BLOCK_M query rows × BLOCK_N keys per step, warps and software-pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    @staticmethod
    def default_for(head_dim: int, dtype=torch.bfloat16, device=None) -> PrefillConfig:
        """The default for ``head_dim`` on ``device`` (a torch device or an arch like "sm_90").
        The CPU (the interpreter) runs sm_90's tiles, so verify on the CPU executes the tiling
        an H100/H200 runs; meta tensors or no device get ``DEFAULTS[None]``."""
        arch = arch_of(device)
        if arch is None and device is not None and torch.device(device).type == "cpu":
            arch = "sm_90"
        if arch is not None and arch.startswith("gfx"):
            table = DEFAULTS["gfx942"]
        elif arch is None:
            table = DEFAULTS[None]
        else:
            table = DEFAULTS["sm_90" if sm_version(arch) >= 90 else "sm_80"]
        width = next_pow2(head_dim)
        return PrefillConfig(*table[64 if width <= 64 else 128 if width <= 128 else 256])

    @staticmethod
    def tuning_space(head_dim: int, dtype=torch.bfloat16, device=None) -> list[PrefillConfig]:
        """Tiles of 32-128 rows and 16-128 keys, 4 or 8 warps, 1-4 stages, kept when the
        accumulator and one score tile fit 256 float32 per thread and the staged K and V tiles
        fit 160 KB; plus every target's default."""
        space = [
            PrefillConfig(bm, bn, w, s)
            for bm in (32, 64, 128)
            for bn in (16, 32, 64, 128)
            for w in (4, 8)
            for s in (1, 2, 3, 4)
        ]
        width = next_pow2(head_dim)

        def keep(c: PrefillConfig) -> bool:
            per_thread = c.block_m * (width + c.block_n) // (32 * c.num_warps)
            staged = 2 * c.block_n * width * 2 * c.num_stages
            return per_thread <= 256 and staged <= 160 * 1024

        kept = [c for c in space if keep(c)]
        defaults = [PrefillConfig.default_for(head_dim, dtype, a) for a in ("sm_90", "sm_80")]
        defaults += [PrefillConfig.default_for(head_dim, dtype, "gfx942")]
        return kept + [c for c in dict.fromkeys(defaults) if c not in kept]


# --- reference, eager, launcher, public function ----------------------------------------------


def _scale(q, softmax_scale):
    return q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)


def _sequences(cu_seqlens_q, cu_seqlens_k):
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [(cq[b], cq[b + 1], ck[b], ck[b + 1]) for b in range(len(cq) - 1)]


def _per_head(x, a, b, heads):
    """Rows [a, b) of x [tokens, H, D] as [heads, b − a, D], KV heads repeated for GQA."""
    t = x[a:b].transpose(0, 1)
    return t.repeat_interleave(heads // t.shape[0], dim=0) if t.shape[0] != heads else t


def _result(o, lse, return_lse, out):
    if out is not None:
        outs = out if isinstance(out, tuple | list) else (out,)
        outs[0].copy_(o)
        if return_lse:
            outs[1].copy_(lse)
        return tuple(outs) if return_lse else outs[0]
    return (o, lse) if return_lse else o


def attention_prefill_ref(
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True, softmax_scale=None, window_left=-1,
    softcap=0.0, sinks=None, block_mask=None, mask_block=128, return_lse=False, out=None,
    check=True,
):  # fmt: skip
    """Plain PyTorch per sequence and head, in the inputs' dtype (exact when given float64)."""
    hq = q.shape[1]
    scale = _scale(q, softmax_scale)
    o = torch.zeros_like(q)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=q.dtype, device=q.device)
    for b, (q0, q1, k0, k1) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k)):
        if q1 == q0:
            continue
        qb, kb, vb = _per_head(q, q0, q1, hq), _per_head(k, k0, k1, hq), _per_head(v, k0, k1, hq)
        s = (qb @ kb.transpose(1, 2)) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        bm = block_mask[b] if block_mask is not None else None
        ok = _ragged.visible(q1 - q0, k1 - k0, causal, window_left, bm, mask_block, q.device)
        s = s.masked_fill(~ok, float("-inf"))
        logits = s
        if sinks is not None:
            sink = sinks.to(s.dtype).view(hq, 1, 1).expand(hq, q1 - q0, 1)
            logits = torch.cat([s, sink], dim=-1)
        lse_b = torch.logsumexp(logits, dim=-1)
        p = torch.exp(s - lse_b[..., None])
        p = torch.where(ok.any(dim=-1, keepdim=True), p, 0.0)  # no visible key: zeros
        o[q0:q1] = (p @ vb).transpose(0, 1)
        lse[q0:q1] = lse_b.transpose(0, 1)
    return _result(o, lse, return_lse, out)


def attention_prefill_torch(
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True, softmax_scale=None, window_left=-1,
    softcap=0.0, sinks=None, block_mask=None, mask_block=128, return_lse=False, out=None,
    check=True,
):  # fmt: skip
    """Eager PyTorch as inference code writes it, per sequence, K/V heads repeated for GQA:
    ``scaled_dot_product_attention`` (with an explicit mask where causal is not top-left
    aligned, or a window or block mask applies); with softcap or sinks, which SDPA cannot
    express, scores in the inputs' dtype and softmax in float32 (as Hugging Face's eager
    attention). The log-sum-exp in float32 from those scores (as the matmul rounds them).
    Rows that see no key get zeros."""
    _validate(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, window_left, softcap,
              sinks, block_mask, mask_block, return_lse, out, check)  # fmt: skip
    hq = q.shape[1]
    scale = _scale(q, softmax_scale)
    o = torch.zeros_like(q, memory_format=torch.contiguous_format)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
    for b, (q0, q1, k0, k1) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k)):
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        qb, kb, vb = _per_head(q, q0, q1, hq), _per_head(k, k0, k1, hq), _per_head(v, k0, k1, hq)
        bm = block_mask[b] if block_mask is not None else None
        ok = _ragged.visible(lq, lk, causal, window_left, bm, mask_block, q.device)
        plain = (not causal or lq == lk) and window_left < 0 and bm is None
        s = None
        if softcap or sinks is not None or return_lse:
            s = (qb * scale) @ kb.transpose(1, 2)
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            s = s.float().masked_fill(~ok, float("-inf"))
            if sinks is not None:
                sink = sinks.float().view(hq, 1, 1).expand(hq, lq, 1)
                s = torch.cat([s, sink], dim=-1)
        if lk == 0:
            ob = torch.zeros_like(qb)
        elif softcap or sinks is not None:
            ob = torch.softmax(s, dim=-1)[..., :lk].to(q.dtype) @ vb
        elif plain:
            ob = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=scale)
        else:
            ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=ok, scale=scale)
        o[q0:q1] = torch.where(ok.any(dim=-1, keepdim=True), ob, 0.0).transpose(0, 1)
        if return_lse:
            lse[q0:q1] = torch.logsumexp(s, dim=-1).transpose(0, 1)
    return _result(o, lse, return_lse, out)


def _validate(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, window_left, softcap,
              sinks, block_mask, mask_block, return_lse, out, check):  # fmt: skip
    """Shape, dtype and option checks always; the cumulative lengths' values (and that the
    block mask covers the longest sequence) only with ``check``: they need a device sync."""
    _check.tensor("q", q, dtypes=_ragged.FLOATS_IN, ndim=3)
    _check.tensor("k", k, dtypes=(q.dtype,), ndim=3, device=q.device)
    _check.tensor("v", v, dtypes=(q.dtype,), ndim=3, device=q.device)
    total_q, hq, d = q.shape
    if d not in _ragged.HEAD_DIMS:
        raise ValueError(
            f"q: expected a head dim in {_ragged.HEAD_DIMS}, got shape {tuple(q.shape)}"
        )
    if k.shape[2] != d:
        raise ValueError(f"k: expected head dim {d} (q's), got shape {tuple(k.shape)}")
    _check.same_shape("v", v, k.shape, "the shape of k")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(
            f"k: expected a KV head count that divides q's {hq} heads, got shape {tuple(k.shape)}"
        )
    _ragged.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, None, q.device)
    batch = cu_seqlens_q.shape[0] - 1
    _ragged.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, batch + 1, q.device)
    _check.boolean("causal", causal)
    _check.boolean("return_lse", return_lse)
    _check.boolean("check", check)
    if softmax_scale is not None:
        _check.finite_positive("softmax_scale", softmax_scale)
    # the conventions shared by every attention op (attention/_paged.py)
    _paged.window_left("window_left", window_left)
    if window_left >= 0 and not causal:
        raise ValueError("window_left: a sliding window needs causal=True")
    _paged.softcap("softcap", softcap)
    if sinks is not None:
        _check.tensor("sinks", sinks, dtypes=_check.FLOATS, ndim=1, device=q.device)
        _check.same_shape("sinks", sinks, (hq,), "one per query head")
    _check.integer("mask_block", mask_block)  # a float or a bool is refused even when unused
    if block_mask is not None:
        _check.tensor("block_mask", block_mask, dtypes=_ragged.MASK_DTYPES, ndim=4, device=q.device)
        if block_mask.shape[0] != batch or block_mask.shape[1] not in (1, hq):
            raise ValueError(
                f"block_mask: expected shape ({batch}, {hq} or 1, query blocks, key blocks), "
                f"got {tuple(block_mask.shape)}"
            )
        if mask_block < 16 or (mask_block & (mask_block - 1)):
            raise ValueError(f"mask_block: expected a power of two ≥ 16, got {mask_block!r}")
    if out is not None:
        outs = out if isinstance(out, tuple | list) else (out,)
        if len(outs) != 1 + bool(return_lse):
            raise ValueError(f"out: expected {'(out, lse)' if return_lse else 'one tensor'}")
        _check.tensor("out", outs[0], dtypes=(q.dtype,), ndim=3, device=q.device)
        _check.same_shape("out", outs[0], q.shape, "the shape of q")
        if return_lse:
            _check.tensor("out", outs[1], dtypes=(torch.float32,), ndim=2, device=q.device)
            _check.same_shape("out", outs[1], q.shape[:2], "lse: (total_q, Hq)")
    if check:
        cq = _ragged.check_cu_values("cu_seqlens_q", cu_seqlens_q, total_q)
        ck = _ragged.check_cu_values("cu_seqlens_k", cu_seqlens_k, k.shape[0])
        if block_mask is not None:
            need = (
                -(-max(_ragged.lengths_of(cq), default=0) // mask_block),
                -(-max(_ragged.lengths_of(ck), default=0) // mask_block),
            )
            if block_mask.shape[2] < need[0] or block_mask.shape[3] < need[1]:
                raise ValueError(
                    f"block_mask: expected at least {need} blocks of {mask_block} (the longest "
                    f"sequences), got shape {tuple(block_mask.shape)}"
                )


def _plan(
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True, softmax_scale=None, window_left=-1,
    softcap=0.0, sinks=None, block_mask=None, mask_block=128, return_lse=False, out=None,
    check=True, config=None,
):  # fmt: skip
    """The launch of ``_attention_prefill_kernel`` for these (validated) arguments. Nothing is
    launched for an empty batch or no queries. Reads shapes only (never values)."""
    total_q, hq, d = q.shape
    if out is None:
        o = torch.empty((total_q, hq, d), dtype=q.dtype, device=q.device)
        lse = torch.empty((total_q, hq), dtype=torch.float32, device=q.device) if return_lse else o
    else:
        outs = out if isinstance(out, tuple | list) else (out,)
        o, lse = outs[0], outs[1] if return_lse else outs[0]
    result = (o, lse) if return_lse else o
    batch = cu_seqlens_q.shape[0] - 1
    if total_q == 0 or batch == 0:
        return LaunchPlan(result=result)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o_run = o if o.stride(-1) == 1 else torch.empty_like(o, memory_format=torch.contiguous_format)
    cfg = config or PrefillConfig.default_for(d, q.dtype, q.device)
    block_m, block_n = cfg.block_m, cfg.block_n
    mask = block_mask
    if mask is not None:
        # Tiles never straddle a mask block: each program reads one mask entry per key tile.
        block_m, block_n = min(block_m, mask_block), min(block_n, mask_block)
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
    m_strides = (mask.stride(0), mask.stride(1) if mask.shape[1] > 1 else 0,
                 mask.stride(2), mask.stride(3)) if mask is not None else (0, 0, 0, 0)  # fmt: skip
    call = KernelCall(
        _attention_prefill_kernel,
        (total_q // block_m + batch, hq),
        dict(
            Out=o_run,
            stride_ot=o_run.stride(0),
            stride_oh=o_run.stride(1),
            Lse=lse,
            stride_lt=lse.stride(0) if return_lse else 0,
            stride_lh=lse.stride(1) if return_lse else 0,
            Q=q,
            stride_qt=q.stride(0),
            stride_qh=q.stride(1),
            K=k,
            stride_kt=k.stride(0),
            stride_kh=k.stride(1),
            V=v,
            stride_vt=v.stride(0),
            stride_vh=v.stride(1),
            CuQ=cu_seqlens_q,
            stride_cq=cu_seqlens_q.stride(0),
            CuK=cu_seqlens_k,
            stride_ck=cu_seqlens_k.stride(0),
            Sinks=sinks if sinks is not None else q,
            stride_sink=sinks.stride(0) if sinks is not None else 0,
            BlockMask=mask if mask is not None else cu_seqlens_q,
            stride_mb=m_strides[0],
            stride_mh=m_strides[1],
            stride_mq=m_strides[2],
            stride_mk=m_strides[3],
            batch=batch,
            total_q=total_q,
            total_k=k.shape[0],
            sm_scale=_scale(q, softmax_scale),
            softcap=float(softcap or 0.0),
            window=max(window_left, 0),
            GROUP=hq // k.shape[1],
            HEAD_DIM=d,
            BLOCK_D=next_pow2(d),
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            MASK_BLOCK=mask_block if mask is not None else block_m,
            IS_CAUSAL=causal,
            HAS_WINDOW=window_left >= 0,
            HAS_SOFTCAP=bool(softcap),
            HAS_SINKS=sinks is not None,
            HAS_BLOCK_MASK=mask is not None,
            RETURN_LSE=bool(return_lse),
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    backs = ((o_run, o),) if o_run is not o else ()
    return LaunchPlan((call,), result, backs)


def attention_prefill_triton(
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True, softmax_scale=None, window_left=-1,
    softcap=0.0, sinks=None, block_mask=None, mask_block=128, return_lse=False, out=None,
    check=True, config=None,
):  # fmt: skip
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, window_left, softcap,
            sinks, block_mask, mask_block, return_lse, out, check)  # fmt: skip
    _validate(*args)
    return _plan(*args, config=config).run()


def _pallas_plan(
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True, softmax_scale=None, window_left=-1,
    softcap=0.0, sinks=None, block_mask=None, mask_block=128, return_lse=False, out=None,
    check=True, config=None, target=None,
):  # fmt: skip
    """The Pallas launch for these (validated) arguments (``attention/_pallas.py``); a block
    mask is not in it (refused, naming the argument)."""
    from kernelab.ops.attention import _pallas

    if block_mask is not None:
        raise ValueError("block_mask: not supported by the Pallas variant")
    outs = out if isinstance(out, tuple | list) else (out, None)
    plan = _pallas.prefill_plan(
        q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, window_left, softcap, sinks,
        outs[0], outs[1] if return_lse else None, config, target,
    )  # fmt: skip
    if return_lse:
        return plan
    finish = plan.finish
    return replace(
        plan,
        finish=None if finish is None else (lambda o: finish(o)[0]),
        result=plan.result[0] if plan.result is not None else None,
    )


def attention_prefill_pallas(
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True, softmax_scale=None, window_left=-1,
    softcap=0.0, sinks=None, block_mask=None, mask_block=128, return_lse=False, out=None,
    check=True, config=None,
):  # fmt: skip
    """The Pallas kernel: natively on a TPU, through the TPU interpreter on CPU tensors."""
    _validate(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, window_left, softcap,
              sinks, block_mask, mask_block, return_lse, out, check)  # fmt: skip
    return _pallas_plan(
        q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, window_left, softcap, sinks,
        block_mask, mask_block, return_lse, out, check, config,
    ).run()  # fmt: skip


def _pallas_supports(shape: Shape) -> str | None:
    if shape.params.get("block_sparse"):
        return "block-sparse mask: not in the Pallas variant"
    return None


def attention_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = True,
    softmax_scale: float | None = None,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    block_mask: torch.Tensor | None = None,
    mask_block: int = 128,
    return_lse: bool = False,
    out=None,
    check: bool = True,
):
    """Attention over a ragged batch of sequences packed along tokens.

    Parameters
    ----------
    q : [total_q, Hq, D] float16 or bfloat16; D in 64, 96, 128, 256; any token and head
        strides (a view of a fused qkv projection), unit stride within a head.
    k, v : [total_k, Hkv, D] in q's dtype; Hq a multiple of Hkv (GQA; Hkv = 1 is MQA).
    cu_seqlens_q, cu_seqlens_k : int32 [batch + 1], from 0 to total_q / total_k, non-decreasing
        (sequence b: query rows cu_seqlens_q[b]:cu_seqlens_q[b + 1], key rows likewise).
    causal : queries are the sequence's last tokens (bottom-right alignment): row r sees keys
        j ≤ r + len_k − len_q. Rows with no visible key (len_q > len_k) get zeros.
    softmax_scale : multiplies q·k (default 1/sqrt(D)).
    window_left : with causal, row r also needs j ≥ its position − window_left (−1: no
        window; a model's "sliding_window" W is window_left = W − 1).
    softcap : logits become softcap · tanh(logit / softcap) (0: none).
    sinks : optional [Hq] float logits, one per head, added to each row's softmax denominator
        (attention sinks); they attend no value.
    block_mask : optional bool/uint8 [batch, Hq or 1, query blocks, key blocks]: entry
        [b, h, i, j] lets rows [i·mask_block, (i + 1)·mask_block) of sequence b attend its keys
        [j·mask_block, (j + 1)·mask_block), both counted from the sequence's start.
    mask_block : the block mask's block size, a power of two ≥ 16.
    return_lse : also return the natural-log log-sum-exp per (token, head), float32 [total_q,
        Hq] (sink included; −inf for a row that sees no key).
    out : optional preallocated output, or (output, lse) with ``return_lse``.
    check : validate the cumulative lengths' values (a device sync); a serving loop whose
        metadata is known good can turn it off. Shapes and dtypes are always checked.
        Unchecked, the Triton kernel writes nothing outside ``out`` (and the lse) and reads
        nothing outside q, k and v whatever the offsets hold: a sequence's rows are clamped
        to [0, total_q) and its keys to [0, total_k) (wrong offsets give wrong rows). A block
        mask smaller than the unchecked lengths need is read past its end.

    Returns out, or (out, lse). Triton on CUDA/ROCm; torch on CPU (the interpreter with
    KERNELAB_INTERPRET=1).
    """
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, window_left, softcap,
            sinks, block_mask, mask_block, return_lse, out, check)  # fmt: skip
    if isinstance(q, torch.Tensor) and use_triton(q):
        return attention_prefill_triton(*args)
    return attention_prefill_torch(*args)


# --- the declaration ---------------------------------------------------------------------------

#: The ragged batch of the representative set: 8 sequences of 64 to 2048 tokens (6336 in all).
RAGGED = (64, 1536, 256, 2048, 128, 768, 1024, 512)
#: Chunked prefill: 512 new queries per sequence over cached prefixes of 0 to 3584 tokens.
CHUNK_Q = (512, 512, 512, 512)
CHUNK_K = (512, 1536, 3072, 4096)
#: Longer contexts for the sliding-window models, where the window (4096) is shorter.
LONG_Q, LONG_K = (1024, 1024), (6144, 8192)


def _representative() -> list[Shape]:
    llama, gemma = (32, 8, 128), (16, 8, 256)
    gemma_opts = {"softcap": 50.0, "window_left": 4095}
    cases = [
        ("llama3-8b prefill 1x4096", [4096], [4096], llama, {}),
        ("llama3-8b ragged 8x(64..2048)", RAGGED, RAGGED, llama, {}),
        ("llama3-8b chunked 4x512 over 512..4096", CHUNK_Q, CHUNK_K, llama, {}),
        ("llama3-70b prefill 1x4096", [4096], [4096], (64, 8, 128), {}),
        ("qwen2.5-7b ragged 8x(64..2048)", RAGGED, RAGGED, (28, 4, 128), {}),
        ("mistral-7b window 4096 chunked 2x1024 over 6144/8192", LONG_Q, LONG_K, llama,
         {"window_left": 4095}),
        ("gemma2-9b softcap 50 window 4096 prefill 1x4096", [4096], [4096], gemma, gemma_opts),
        ("gemma2-9b softcap 50 window 4096 chunked 2x1024 over 6144/8192", LONG_Q, LONG_K, gemma,
         gemma_opts),
        ("gpt-oss sinks window 128 prefill 1x4096", [4096], [4096], (64, 8, 64),
         {"window_left": 127, "sinks": True}),
    ]  # fmt: skip
    return [_ragged.ragged_shape(label, q, k, *h, **p) for label, q, k, h, p in cases]


def _edge() -> list[Shape]:
    cases = [
        ("one token", [1], [1], (4, 2, 64), {}),
        ("prime lengths, D 96, softcap", [37, 101, 13], [37, 101, 13], (6, 2, 96),
         {"softcap": 30.0}),
        ("zero-length sequence inside, window", [17, 0, 45], [17, 0, 45], (4, 4, 128),
         {"window_left": 20}),
        ("lengths 1 and 700 in one batch", [1, 700], [1, 700], (2, 1, 64), {}),
        ("block size and block size + 1", [64, 65, 128, 129], [64, 65, 128, 129], (2, 1, 128), {}),
        ("window longer than the sequence, sinks", [50, 70], [50, 70], (4, 2, 64),
         {"window_left": 500, "sinks": True}),
        ("q, k, v views of a fused qkv, MQA", [30, 47], [30, 47], (4, 1, 64), {"fused_qkv": True}),
        ("chunked prefill over a cached prefix, GQA 4:1", [40, 1, 9], [150, 77, 9], (8, 2, 128),
         {}),
        ("more queries than keys", [20], [5], (2, 2, 64), {}),
        ("D 256, softcap, window", [70], [70], (2, 1, 256), {"softcap": 50.0, "window_left": 33}),
        ("not causal", [30, 50], [45, 20], (2, 1, 64), {"causal": False}),
        ("block-sparse mask masking whole rows", [130, 64], [130, 100], (4, 2, 64),
         {"block_sparse": True}),
        ("empty batch", [], [], (4, 2, 64), {}),
    ]  # fmt: skip
    # Small already: the interpreter runs them whole (only the batch is capped).
    return [_ragged.ragged_shape(label, q, k, *h, cut=None, **p) for label, q, k, h, p in cases]


#: The block size of the edge block masks: smaller than the default tiles, so the launch
#: shrinks its tiles to the mask's.
EDGE_MASK_BLOCK = 32


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    q_lens, k_lens, window = _ragged.lengths(shape)
    p = shape.params
    q, k, v = _ragged.qkv(shape, q_lens, k_lens, dtype, device, gen, dist)
    hq = shape.dims["heads_q"]
    sinks = None
    if p.get("sinks"):
        # Per-head sink logits, float32, about as large as typical scores.
        sinks = _inputs.randn((hq,), torch.float32, device, gen, "normal", mean=1.0)
    mask = None
    if p.get("block_sparse"):
        mask = _ragged.block_mask(len(q_lens), hq, q_lens, k_lens, EDGE_MASK_BLOCK, device, gen)
    return {
        "q": q,
        "k": k,
        "v": v,
        "cu_seqlens_q": _ragged.cumulative(q_lens, device),
        "cu_seqlens_k": _ragged.cumulative(k_lens, device),
        "causal": p.get("causal", True),
        "softmax_scale": shape.dims["head_dim"] ** -0.5,
        "window_left": window,
        "softcap": p.get("softcap", 0.0),
        "sinks": sinks,
        "block_mask": mask,
        "mask_block": EDGE_MASK_BLOCK if mask is not None else 128,
        "return_lse": True,
    }


def _cost(inputs: dict) -> Cost:
    """FLOPs: 4·D per visible score (2·D for q·k, 2·D for p·v). Bytes: q, k and v read once,
    the output (and lse, sinks, block mask, cumulative lengths) written or read once."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    cq, ck = inputs["cu_seqlens_q"].tolist(), inputs["cu_seqlens_k"].tolist()
    pairs = _ragged.visible_pairs(
        _ragged.lengths_of(cq),
        _ragged.lengths_of(ck),
        q.shape[1],
        inputs.get("causal", True),
        inputs.get("window_left", -1),
        inputs.get("block_mask"),
        inputs.get("mask_block", 128),
    )
    es = q.element_size()
    nbytes = (2 * q.numel() + k.numel() + v.numel()) * es + 8 * len(cq)
    if inputs.get("return_lse"):
        nbytes += 4 * q.shape[0] * q.shape[1]
    for extra in (inputs.get("sinks"), inputs.get("block_mask")):
        if extra is not None:
            nbytes += extra.numel() * extra.element_size()
    return Cost(flops=4 * q.shape[2] * pairs, bytes=nbytes)


ATTENTION_PREFILL = register(
    Op(
        "attention_prefill",
        description="attention over ragged sequences: causal (bottom-right), GQA, window, "
        "softcap, sinks, block mask; lse",
        reference=attention_prefill_ref,
        make_inputs=_make_inputs,
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # Special values only in q: a NaN or Inf in a key's v that a query cannot see poisons a
        # dense P·V (the reference, SDPA) but not a kernel that never reads that key. lse is
        # float32 from the hardware's exp2/log2 approximations: its floor is 1e-5.
        contract=Contract(
            floors={"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-5},
            special_inputs=("q",),
        ),
        dtypes=_ragged.FLOATS16,
        outputs=("out", "lse"),
        out_arg="out",
        kernels=(_attention_prefill_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: PrefillConfig.tuning_space(shape.dims["head_dim"], dtype),
    )
)
ATTENTION_PREFILL.add_variant(
    Variant(
        "kernelab",
        attention_prefill_triton,
        "triton",
        description="Triton: one program per query block and head, masked tiles skipped",
    )
)
ATTENTION_PREFILL.add_variant(
    Variant(
        "pallas",
        attention_prefill_pallas,
        "pallas",
        plan=_pallas_plan,
        supports=_pallas_supports,
        description="Pallas TPU flash prefill: packed query blocks, per-row key ranges",
    )
)
ATTENTION_PREFILL.add_torch(attention_prefill_torch, compile=False)
