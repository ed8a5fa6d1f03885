"""What the mixture-of-experts ops' launches share: the launch config, argument checks and the
launches of the family's kernels (each bound in one place here). The per-expert reference loop,
shapes, inputs and cost are in ``_spec``.

Layouts (vLLM's and transformers' ``MixtralExperts`` / ``Qwen3MoeExperts``):

- ``x`` [T, H]; the routing ``topk_weights`` [T, k] (float) and ``topk_ids`` [T, k] (int32 or
  int64); the pair (t, j) has the flat index i = t·k + j.
- dense expert weights: ``w1`` [E, 2I, H] (gate rows 0..I−1, then up), ``w2`` [E, H, I];
- int4 expert weights, per expert the layout of ``kernelab.ops.packing`` for x·W with W [K, N]:
  ``w1_qweight`` [E, H/2, 2I], ``w1_scales`` / ``w1_zeros`` [E, H/G, 2I], and ``w2_*`` with
  K = I, N = H.
- mxfp4 expert weights, the dense layout along K packed two per byte: ``w1`` uint8
  [E, 2I, H/2] with ue8m0 ``w1_scale`` [E, 2I, H/32], ``w2`` [E, H, I/2] / [E, H, I/32].

The fused path (``fused_moe``, ``fused_moe_w4a16``, ``fused_moe_mxfp4``): align the pairs by
expert (``moe_align``'s kernel), the gate+up grouped GEMM with silu(gate)·up fused into its
epilogue (one [T·k, I] intermediate in x's dtype: the second GEMM's 16-bit operand, where
float16 overflows past 65504 as every such implementation does; the references round it there
too), the down grouped GEMM with each pair's routing weight applied in float32 and the part
stored in float32, and the sum over the k parts of each token (plus the shared expert's
output, float32 too) with one rounding to x's dtype. The routing weight multiplies the down
projection's output, where vLLM's fused MoE (``mul_routed_weight`` on the second GEMM) and
transformers' experts (``current_hidden_states * top_k_weights``) apply it: the down
projection is linear, so this is the same product, and it keeps the intermediate independent
of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core.runtime import check as _check
from kernelab.core.runtime.launch import KernelCall, LaunchPlan, cdiv
from kernelab.core.runtime.triton import next_pow2
from kernelab.ops.moe._kernels import _fused_moe_kernel, _moe_align_kernel, _moe_sum_kernel

INDEX_DTYPES = (torch.int32, torch.int64)
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# --- launch heuristics as data ----------------------------------------------------------------


@dataclass(frozen=True)
class MoEConfig:
    """The grouped GEMM's tile: ``block_m`` aligned pairs (the ``moe_align`` block) ×
    ``block_n`` output columns, ``block_k`` deep; the gate+up GEMM holds two such accumulators.
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    @staticmethod
    def default_for(
        pairs: int, experts: int, w4: bool = False, fp8: bool = False, mx4: bool = False
    ) -> MoEConfig:
        # Rows per expert hit decide the tile: at decode (a few pairs per expert) the weight
        # read bounds the time and a 16-row tile (the smallest tensor-core M) wastes least on
        # padding; at prefill the tile grows to reuse each weight tile over more rows.
        per_expert = pairs / max(1, min(experts, pairs))
        if fp8:
            # e4m3: 64-row tiles even at decode, wgmma on sm_90 (a 16-row tile compiles to
            # mma.sync; the idle rows cost no memory traffic); K steps of 128, one scale block,
            # and 64 at prefill, where the B tiles of 3 stages must fit gfx942's 64 KB of LDS.
            # 32 columns: at 64x64 each K step's two scaled products beside the two
            # accumulators took 255 registers and spilled 16 bytes on sm_100 with 4 warps, and
            # with 8 warps spilled on gfx942 (256 VGPRs a thread there) (triton 3.9).
            if per_expert <= 64:
                return MoEConfig(64, 32, 128, 4, 3)
            return MoEConfig(64, 128, 64, 8, 3)
        if mx4:
            # mxfp4 decodes the bytes of both weight tiles to 16-bit values per K step beside
            # the two accumulators, like int4
            return MX4_CONFIGS[min(2, (per_expert > 16) + (per_expert > 64))]
        if per_expert <= 16:
            # K steps of 64: with 128, bf16 needed 72 KB of shared memory (gfx942 has 64) and
            # spilled on sm_90 in the shared expert's launches.
            return MoEConfig(16, 64, 64, 4, 3)
        if per_expert <= 64:
            return MoEConfig(32, 64, 64, 4, 3)
        # int4 holds the codes, their 16-bit conversions and two accumulators: at 64x128 it
        # spilled 8 bytes on sm_90 (triton 3.9); 64x64 does not. bf16 at 64x128: K steps of 32,
        # so that three stages of the A tile and both B tiles (60 KB) fit gfx942's 64 KB of LDS
        # (block_k 64 needed 72 KB there and could not launch).
        return MoEConfig(64, 64, 64, 8, 3) if w4 else MoEConfig(64, 128, 32, 8, 3)

    @staticmethod
    def tuning_space(
        pairs: int, experts: int, w4: bool = False, fp8: bool = False
    ) -> list[MoEConfig]:
        space = [
            MoEConfig(bm, bn, bk, w, s)
            for bm in (16, 32, 64, 128)
            for bn in (32, 64, 128)
            for bk in (32, 64, 128)
            for w in (4, 8)
            for s in (2, 3, 4)
        ]

        def keep(c: MoEConfig) -> bool:
            if w4 and 64 % c.block_k:
                return False  # a K step must lie in one int4 group (64 or 128)
            if c.block_m > max(16 if not fp8 else 64, next_pow2(max(1, pairs))):
                return False
            return 8 <= c.block_m * c.block_n // (32 * c.num_warps) <= 128

        return [c for c in space if keep(c)] or [MoEConfig.default_for(pairs, experts, w4, fp8)]


#: mxfp4 experts' default tiles, by aligned pairs per expert hit: ≤ 16, ≤ 64, more. No spills
#: on sm_80/sm_90/sm_100/gfx942 (triton 3.9); at prefill, K steps of 64 spilled on sm_80 (the
#: gate+up launch: 3384 bytes a thread at 64x64/8 warps, 2736 at 4 warps), 32 do not; 32x64x64
#: spilled 16 bytes there too.
MX4_CONFIGS = (
    MoEConfig(16, 64, 64, 4, 3),
    MoEConfig(32, 64, 32, 4, 3),
    MoEConfig(64, 64, 32, 8, 3),
)


# --- argument checks ------------------------------------------------------------------------


def validate_routing(x, topk_weights, topk_ids, experts: int, check: bool) -> int:
    """The routing of ``x``'s T tokens; returns top-k. With ``check`` (a host sync), every id
    must name an expert; without, an id outside [0, E) is masked (the pair contributes
    nothing), never used as an address."""
    t = x.shape[0]
    _check.tensor("topk_ids", topk_ids, dtypes=INDEX_DTYPES, ndim=2, device=x.device)
    _check.tensor("topk_weights", topk_weights, dtypes=WEIGHT_DTYPES, ndim=2, device=x.device)
    if topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids: expected {t} rows (one per token of x), got {topk_ids.shape}")
    _check.same_shape("topk_weights", topk_weights, topk_ids.shape, "the shape of topk_ids")
    k = topk_ids.shape[1]
    if k < 1 or k > experts:
        raise ValueError(f"topk_ids: expected 1 to {experts} columns (top-k <= experts), got {k}")
    _check.boolean("check", check)
    if check and topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= experts:
            raise ValueError(
                f"topk_ids: expected expert ids in [0, {experts}), got values in [{lo}, {hi}]"
            )
    return k


def validate_out(out, x, hidden):
    if out is not None:
        _check.tensor("out", out, dtypes=(x.dtype,), ndim=2, device=x.device)
        _check.same_shape("out", out, (x.shape[0], hidden), "(T, H)")


# --- the launches ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Aligned:
    """``moe_align``'s outputs and the sizes the grouped GEMM is launched with."""

    sorted_ids: torch.Tensor  # int32 [num_blocks · block_size]
    expert_ids: torch.Tensor  # int32 [num_blocks]
    num_post_padded: torch.Tensor  # int32 [1]
    numel: int
    num_blocks: int


def align_sizes(numel: int, experts: int, block_size: int) -> tuple[int, int]:
    """(blocks, entries) the aligned list may need: every pair, plus at most block_size − 1
    padding for each expert hit (at most min(E, pairs) of them)."""
    most = numel + min(experts, numel) * (block_size - 1)
    blocks = cdiv(most, block_size)
    return blocks, blocks * block_size


def align_call(topk_ids: torch.Tensor, experts: int, block_size: int) -> tuple[KernelCall, Aligned]:
    """The launch of ``_moe_align_kernel`` (one program) and the tensors it fills."""
    ids = topk_ids.contiguous()
    numel = ids.numel()
    blocks, entries = align_sizes(numel, experts, block_size)
    dev = ids.device
    aligned = Aligned(
        torch.empty((entries,), dtype=torch.int32, device=dev),
        torch.empty((blocks,), dtype=torch.int32, device=dev),
        torch.empty((1,), dtype=torch.int32, device=dev),
        numel,
        blocks,
    )
    block_e = next_pow2(experts)
    call = KernelCall(
        _moe_align_kernel,
        (1,),
        dict(
            SortedIds=aligned.sorted_ids,
            ExpertIds=aligned.expert_ids,
            NumPostPadded=aligned.num_post_padded,
            TopkIds=ids,
            numel=numel,
            E=experts,
            padded_len=entries,
            num_blocks=blocks,
            BLOCK_SIZE=block_size,
            BLOCK_E=block_e,
            # The one-hot tile [CHUNK, BLOCK_E] of int32 stays at 16K elements.
            CHUNK=max(16, min(1024, 16384 // block_e)),
        ),
        8,
        1,
    )
    return call, aligned


@dataclass(frozen=True)
class ExpertWeights:
    """One projection of every expert, dense ([E, N, K] as nn.Linear), int4 (codes
    [E, K/2, N], scales and zeros [E, K/G, N]), block-scaled e4m3 (values [E, N, K], float32
    scales [E, ⌈N/128⌉, ⌈K/128⌉], no zeros) or mxfp4 (``mx4``: bytes [E, N, K/2], ue8m0
    scales [E, N, K/32])."""

    b: torch.Tensor
    scales: torch.Tensor | None = None
    zeros: torch.Tensor | None = None
    group_size: int = 0
    mx4: bool = False

    @property
    def w4(self) -> bool:
        return self.zeros is not None

    @property
    def fp8(self) -> bool:
        return self.scales is not None and self.zeros is None and not self.mx4

    def strides(self) -> dict:
        b, s, z = self.b, self.scales, self.zeros
        if self.fp8 or self.mx4:
            return dict(
                stride_be=b.stride(0),
                stride_bn=b.stride(1),
                stride_bk=b.stride(2),
                S=s,
                stride_se=s.stride(0),
                stride_sk=s.stride(2),
                stride_sn=s.stride(1),
                Z=b,
                stride_ze=0,
                stride_zk=0,
                stride_zn=0,
            )
        if self.w4:
            return dict(
                stride_be=b.stride(0),
                stride_bn=b.stride(2),
                stride_bk=b.stride(1),
                S=s,
                stride_se=s.stride(0),
                stride_sk=s.stride(1),
                stride_sn=s.stride(2),
                Z=z,
                stride_ze=z.stride(0),
                stride_zk=z.stride(1),
                stride_zn=z.stride(2),
            )
        return dict(
            stride_be=b.stride(0),
            stride_bn=b.stride(1),
            stride_bk=b.stride(2),
            S=b,
            stride_se=0,
            stride_sk=0,
            stride_sn=0,
            Z=b,
            stride_ze=0,
            stride_zk=0,
            stride_zn=0,
        )


def gemm_call(
    c,
    a,
    w: ExpertWeights,
    topk_weights,
    aligned: Aligned | None,
    *,
    n,
    k,
    experts,
    top_k,
    gate_up,
    cfg: MoEConfig,
    a_scales=None,
) -> KernelCall:
    """The grouped GEMM into ``c``: routed over ``aligned`` blocks (gate+up reads x row
    t = i // top_k; down reads the intermediate row i and applies the weight), or, without
    ``aligned``, every row of ``a`` through expert 0 of ``w`` (the shared expert). Block-scaled
    e4m3 weights take e4m3 ``a`` with its group scales ``a_scales`` [rows, ⌈k/128⌉]."""
    sa = a_scales if a_scales is not None else a
    if aligned is not None:
        numel, blocks = aligned.numel, aligned.num_blocks
        sorted_ids, expert_ids, npp = (
            aligned.sorted_ids,
            aligned.expert_ids,
            aligned.num_post_padded,
        )
    else:
        numel, blocks = a.shape[0], cdiv(a.shape[0], cfg.block_m)
        sorted_ids = expert_ids = npp = topk_weights  # never read
    return KernelCall(
        _fused_moe_kernel,
        (blocks * cdiv(n, cfg.block_n),),
        dict(
            C=c,
            stride_cm=c.stride(0),
            stride_cn=c.stride(1),
            A=a,
            stride_am=a.stride(0),
            stride_ak=a.stride(1),
            SA=sa,
            stride_sam=sa.stride(0) if a_scales is not None else 0,
            stride_sak=sa.stride(1) if a_scales is not None else 0,
            B=w.b,
            **w.strides(),
            TopkWeights=topk_weights,
            SortedIds=sorted_ids,
            ExpertIds=expert_ids,
            NumPostPadded=npp,
            N=n,
            K=k,
            numel=numel,
            E=experts,
            num_blocks=blocks,
            up_offset=n if gate_up else 0,
            A_ROW_DIV=top_k if (gate_up and aligned is not None) else 1,
            ROUTED=aligned is not None,
            GATE_UP=gate_up,
            MUL_WEIGHT=aligned is not None and not gate_up,
            W4=w.w4,
            FP8=w.fp8,
            MX4=w.mx4,
            GROUP_SIZE=max(1, w.group_size),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )


#: The sum kernel's tile: 4 tokens × 512 columns over 4 warps (16 values a thread).
SUM_BLOCK = (4, 512)


def sum_call(out, parts, shared, topk_ids, experts, top_k) -> KernelCall:
    t, h = out.shape
    bt, bh = SUM_BLOCK
    return KernelCall(
        _moe_sum_kernel,
        (cdiv(t, bt), cdiv(h, bh)),
        dict(
            Out=out,
            stride_ot=out.stride(0),
            Parts=parts,
            stride_pt=top_k * parts.stride(0),
            stride_pj=parts.stride(0),
            Shared=shared if shared is not None else out,
            stride_st=shared.stride(0) if shared is not None else 0,
            TopkIds=topk_ids,
            stride_it=topk_ids.stride(0),
            T=t,
            H=h,
            E=experts,
            TOPK=top_k,
            HAS_SHARED=shared is not None,
            BLOCK_T=bt,
            BLOCK_H=bh,
        ),
        4,
        1,
    )


def plan(
    x,
    w1: ExpertWeights,
    w2: ExpertWeights,
    topk_weights,
    topk_ids,
    *,
    experts,
    intermediate,
    shared=None,
    out=None,
    config=None,
    quantize=None,
) -> LaunchPlan:
    """align → gate+up (fused activation) → down (× routing weight) → [shared expert] → sum.
    ``shared``: (gate+up, down) ExpertWeights of one shared expert, or None. ``quantize``
    (block-scaled e4m3 weights): a -> (its launches, values, group scales), applied to x
    before gate+up and to the float32 intermediates before down."""
    t, h = x.shape
    result = out if out is not None else torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0 or h == 0:
        return LaunchPlan(result=result)
    top_k = topk_ids.shape[1]
    numel = t * top_k
    cfg = config or MoEConfig.default_for(numel, experts, w1.w4, w1.fp8, w1.mx4)
    for w in (w1, w2):
        if w.mx4 and cfg.block_k % w.group_size:
            raise ValueError(f"config: block_k={cfg.block_k} must be a multiple of 32 for mxfp4")
        if w.group_size % cfg.block_k and (w.w4 or w.fp8):
            raise ValueError(
                f"config: block_k={cfg.block_k} must divide group_size={w.group_size} for "
                + ("int4" if w.w4 else "the fp8 scale block")
            )
    weights = topk_weights.contiguous()
    ids = topk_ids.contiguous()
    align, aligned = align_call(ids, experts, cfg.block_m)
    # The intermediate is the down GEMM's 16-bit tensor-core operand, stored in x's dtype (as
    # vLLM and transformers hold it; the references round it there too), or, with quantized
    # activations, in float32 (one rounding, to e4m3). The weighted parts stay float32 (one
    # rounding, of the sum): a part rounded to float16 can overflow, or fall to subnormals,
    # where the sum does not (a part of 1.1e5 beside one of -4e4, say).
    inter_dtype = torch.float32 if quantize is not None else x.dtype
    inter = torch.empty((numel, intermediate), dtype=inter_dtype, device=x.device)
    parts = torch.empty((numel, h), dtype=torch.float32, device=x.device)
    opts = dict(experts=experts, top_k=top_k, cfg=cfg)
    calls, a, sa = [align], x, None
    if quantize is not None:
        q_calls, a, sa = quantize(x)
        calls[:0] = q_calls
    calls.append(
        gemm_call(inter, a, w1, weights, aligned, n=intermediate, k=h, gate_up=True, a_scales=sa,
                  **opts)
    )  # fmt: skip
    calls += _down(parts, inter, w2, weights, aligned, h, intermediate, quantize, opts)
    shared_out = None
    if shared is not None:
        sw1, sw2 = shared
        si = sw2.b.shape[2]
        s_inter = torch.empty((t, si), dtype=inter_dtype, device=x.device)
        shared_out = torch.empty((t, h), dtype=torch.float32, device=x.device)
        calls.append(
            gemm_call(s_inter, a, sw1, weights, None, n=si, k=h, gate_up=True, a_scales=sa,
                      **opts)
        )  # fmt: skip
        calls += _down(shared_out, s_inter, sw2, weights, None, h, si, quantize, opts)
    calls.append(sum_call(result, parts, shared_out, ids, experts, top_k))
    return LaunchPlan(tuple(calls), result)


def _down(c, inter, w, weights, aligned, n, k, quantize, opts) -> list[KernelCall]:
    """The down projection's launches: [quantize the intermediate,] the grouped GEMM."""
    calls, sa = [], None
    if quantize is not None:
        calls, inter, sa = quantize(inter)
        calls = list(calls)
    calls.append(gemm_call(c, inter, w, weights, aligned, n=n, k=k, gate_up=False, a_scales=sa,
                           **opts))  # fmt: skip
    return calls
