"""What the mixture-of-experts ops share: the launch config, argument checks, the launches of
the family's kernels (each bound in one place here), the per-expert reference loop, inputs,
shapes and cost.

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
epilogue (one [T·k, I] intermediate in x's dtype), the down grouped GEMM with each pair's
routing weight applied in float32 before its rounding, and the sum over the k parts of each
token (plus the shared expert's output). The routing weight multiplies the down projection's
output, where vLLM's fused MoE (``mul_routed_weight`` on the second GEMM) and transformers'
experts (``current_hidden_states * top_k_weights``) apply it: the down projection is linear, so
this is the same product, and it keeps the intermediate independent of the weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernelab.ops._model import Cost, Shape
from kernelab.ops._runtime import check as _check
from kernelab.ops._runtime import inputs as _inputs
from kernelab.ops._runtime.launch import KernelCall, LaunchPlan, cdiv
from kernelab.ops._runtime.triton import next_pow2
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
    # With quantized activations, float32 intermediates (one rounding, to e4m3) and parts (one
    # rounding, of the sum: a part rounded to float16 could overflow, or fall to subnormals,
    # where the sum does not)
    inter_dtype = torch.float32 if quantize is not None else x.dtype
    inter = torch.empty((numel, intermediate), dtype=inter_dtype, device=x.device)
    parts = torch.empty((numel, h), dtype=inter_dtype, device=x.device)
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
        shared_out = torch.empty((t, h), dtype=inter_dtype, device=x.device)
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


# --- the reference loop -----------------------------------------------------------------------


def silu_mul(h: torch.Tensor, n: int) -> torch.Tensor:
    g, u = h[:, :n], h[:, n:]
    return g * torch.sigmoid(g) * u


def expert_loop(x, topk_weights, topk_ids, experts, w1_of, w2_of, out=None):
    """Σ over each token's top-k of weight · down(silu(gate(x)) · up(x)), one expert at a time:
    ``w1_of(e)`` [H, 2I] and ``w2_of(e)`` [I, H] (x·W layouts), in x's dtype."""
    t, h = x.shape
    y = torch.zeros((t, h), dtype=x.dtype, device=x.device)
    for e in range(experts):
        tok, slot = torch.where(topk_ids == e)
        if tok.numel() == 0:
            continue
        w1, w2 = w1_of(e), w2_of(e)
        inner = silu_mul(x[tok] @ w1, w1.shape[1] // 2)
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


def topk_select(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest per row, ties to the lower index (a stable sort), as int64."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]


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
