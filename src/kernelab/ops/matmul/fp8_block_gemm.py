"""Block-scaled FP8 GEMM (DeepSeek-V3's recipe): e4m3 inputs, float32 accumulation, bf16 out.

    out[m, n] = Σ_kb (Σ_{k in block kb} a[m, k]·b[n, k]) · scale_a[m, kb] · scale_b[n // 128, kb]

``a`` [M, K] e4m3 with one float32 scale per row and 128 columns (``scale_a`` [M, ⌈K/128⌉],
from ``fp8_quant(x, group_size=128)``); ``b`` [N, K] e4m3, the nn.Linear weight, with one
float32 scale per 128 × 128 block (``scale_b`` [⌈N/128⌉, ⌈K/128⌉], from
``packing.quantize_fp8_block``). The scales change along K, so they are applied inside the K
loop: each 128-wide K block's product is summed on tensor cores, then scaled and accumulated.
K and N need not be multiples of 128: the last block is shorter and its scale covers only the
columns it has (loads past K are masked to zero). Scales may have any strides (DeepGEMM keeps
``scale_a`` column-major: pass ``scale_a.t().contiguous().t()``). Power-of-two (UE8M0) scales
are ordinary float32 values here.

The e4m3 flavour is the device's: ``float8_e4m3fn`` on NVIDIA sm_89+ (and the interpreter),
``float8_e4m3fnuz`` on AMD gfx942.

The ladder: ``_fp8_block_gemm_kernel`` → ``fp8_block_gemm_triton`` → ``fp8_block_gemm``;
``fp8_block_gemm_ref`` (float64 on the dequantized inputs) and ``fp8_block_gemm_torch``
(eager: dequantize to float32, matmul, round to bfloat16) beside it. External variants, listed
when their package imports: vLLM's and SGLang's Triton block-fp8 GEMMs, DeepGEMM.
"""

from __future__ import annotations

import torch

from kernelab.core import Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime import shapes as _shapes
from kernelab.core.runtime.launch import KernelCall, LaunchPlan
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul._kernels import _fp8_block_gemm_kernel
from kernelab.ops.matmul._packing import FP8_BLOCK, quantize_fp8_block
from kernelab.ops.matmul.fp8_gemm import E4M3, e4m3_for, fp8_supported
from kernelab.ops.quant.fp8_quant import fp8_quant_torch

# --- launch heuristics as data ----------------------------------------------------------------


class Fp8BlockConfig(gc.ScaledTileConfig):
    """Tiles of the block-scaled fp8 kernel; ``block_k`` divides the 128-wide scale block."""

    @classmethod
    def default_for(cls, M: int, N: int, K: int, dtype=torch.bfloat16, device=None):
        arch = gc.arch_of(device)
        if arch is not None and arch.startswith("gfx"):
            return cls(16 if M <= 16 else 64, 64, 64, 8, 4, 2)
        # 64-row tiles even at decode: one warpgroup's wgmma (sm_90) or tcgen05 (sm_100) tile;
        # at M ≤ 16 the weight read dominates and the idle rows cost no memory traffic.
        if M <= 64:
            return cls(64, 64, 128, 1, 4, 4)
        return cls(64, 128, 128, 8, 4, 3)

    @classmethod
    def tuning_space(cls, M: int, N: int, K: int, dtype=torch.bfloat16, device=None) -> list:
        space = [
            cls(bm, bn, bk, 8, w, s)
            for bm in (16, 32, 64, 128)
            for bn in (64, 128, 256)
            for bk in (64, 128)
            for w in (4, 8)
            for s in (2, 3, 4)
        ]

        def keep(c) -> bool:
            smem = (c.block_m + c.block_n) * c.block_k * c.num_stages
            per_thread = c.block_m * c.block_n // (32 * c.num_warps)
            return c.block_m <= max(64, 2 * M) and smem <= 200 * 1024 and 8 <= per_thread <= 128

        return [c for c in space if keep(c)] or [cls.default_for(M, N, K, dtype, device)]


# --- reference, eager, launcher ---------------------------------------------------------------


def _expand(scale: torch.Tensor, rows: int, cols: int, row_block: int) -> torch.Tensor:
    """A scale grid expanded over its blocks (``row_block`` rows, 128 columns), cut to
    [rows, cols]."""
    full = scale.repeat_interleave(FP8_BLOCK, dim=1)
    if row_block > 1:
        full = full.repeat_interleave(row_block, dim=0)
    return full[:rows, :cols]


def fp8_block_gemm_ref(a, b, scale_a, scale_b, out=None):
    """(a · scale_a per 1 × 128) @ (b · scale_b per 128 × 128)ᵀ in the inputs' dtype (exact in
    float64)."""
    m, k = a.shape
    n = b.shape[0]
    a_deq = a * _expand(scale_a, m, k, 1)
    b_deq = b * _expand(scale_b, n, k, FP8_BLOCK)
    y = a_deq @ b_deq.t()
    return y if out is None else out.copy_(y)


def fp8_block_gemm_torch(a, b, scale_a, scale_b, out=None):
    """Eager PyTorch: dequantize to float32, matmul, round to bfloat16."""
    _validate(a, b, scale_a, scale_b, out)
    y = fp8_block_gemm_ref(a.float(), b.float(), scale_a.float(), scale_b.float())
    y = y.to(torch.bfloat16)
    return y if out is None else out.copy_(y)


def _validate(a, b, scale_a, scale_b, out):
    _check.tensor("a", a, dtypes=E4M3, ndim=2)
    _check.tensor("b", b, dtypes=(a.dtype,), ndim=2, device=a.device)
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"b: expected [N, K] with K = {k}, got {tuple(b.shape)}")
    kb, nb = gc.cdiv(k, FP8_BLOCK), gc.cdiv(n, FP8_BLOCK)
    _check.tensor("scale_a", scale_a, dtypes=(torch.float32,), ndim=2, device=a.device)
    _check.same_shape("scale_a", scale_a, (m, kb), "(M, ceil(K / 128))")
    _check.tensor("scale_b", scale_b, dtypes=(torch.float32,), ndim=2, device=a.device)
    _check.same_shape("scale_b", scale_b, (nb, kb), "(ceil(N / 128), ceil(K / 128))")
    if out is not None:
        _check.tensor("out", out, dtypes=(torch.bfloat16,), ndim=2, device=a.device)
        _check.same_shape("out", out, (m, n), "(M, N)")
    return n


def fp8_block_gemm_triton(a, b, scale_a, scale_b, out=None, config=None):
    _validate(a, b, scale_a, scale_b, out)
    if not fp8_supported(a.device):
        raise ValueError(
            f"a: fp8 GEMM needs an sm_89+ or gfx942 device, got {gc.arch_of(a.device)}"
        )
    return _plan(a, b, scale_a, scale_b, out, config).run()


def _plan(a, b, scale_a, scale_b, out=None, config=None):
    """The launch of ``_fp8_block_gemm_kernel`` for these (validated) arguments; nothing for an
    empty output."""
    m, k = a.shape
    n = b.shape[0]
    c = out if out is not None else torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return LaunchPlan(result=c)
    if k == 0:
        return LaunchPlan(result=c.zero_())
    cfg = config or Fp8BlockConfig.default_for(m, n, k, torch.bfloat16, a.device)
    if FP8_BLOCK % cfg.block_k:
        raise ValueError(f"config: block_k must divide {FP8_BLOCK}, got {cfg.block_k}")
    call = KernelCall(
        _fp8_block_gemm_kernel,
        (gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n),),
        dict(
            **gc.operand_args(c, a, b.t()),
            SA=scale_a,
            stride_sam=scale_a.stride(0),
            stride_sak=scale_a.stride(1),
            SB=scale_b,
            stride_sbn=scale_b.stride(0),
            stride_sbk=scale_b.stride(1),
            **gc.tile_args(cfg),
            SCALE_BLOCK=FP8_BLOCK,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    return LaunchPlan((call,), c)


def fp8_block_gemm(a, b, scale_a, scale_b, out=None):
    """bfloat16 [M, N] = (a·scale_a) @ (b·scale_b)ᵀ with block scales; see the module docstring.

    a : e4m3 [M, K]; scale_a : float32 [M, ⌈K/128⌉] (one per row and 128 columns).
    b : e4m3 weight [N, K]; scale_b : float32 [⌈N/128⌉, ⌈K/128⌉] (one per 128 × 128 block).
    out : optional bfloat16 [M, N].
    """
    if isinstance(a, torch.Tensor) and use_triton(a):
        return fp8_block_gemm_triton(a, b, scale_a, scale_b, out)
    return fp8_block_gemm_torch(a, b, scale_a, scale_b, out)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    shapes = []
    for label, n, k in _shapes.BLOCK_FP8_PROJECTIONS:
        for m in gc.GEMM_M:
            phase = "decode" if m <= 16 else "prefill"
            shapes.append(
                Shape(
                    f"{label} {phase} M={m} {n}x{k}",
                    {"M": m, "N": n, "K": k},
                    {"ue8m0": label.startswith("deepseek")},
                    batch_dim="M",
                    reduce_to=dict(gc.INTERPRETER_DIMS),
                )
            )
    return shapes


def _edge() -> list[Shape]:
    cases = [
        ("one row, one block", 1, 128, 128, {}),
        ("primes, K inside one block", 7, 53, 67, {}),
        ("K not a multiple of 128", 5, 130, 200, {}),
        ("N and M past one tile, ue8m0", 70, 200, 384, {"ue8m0": True}),
        ("column-major scale_a", 33, 96, 256, {"scale_a_layout": "mk-major"}),
        ("empty M", 0, 16, 128, {}),
    ]
    return [
        Shape(f"{label} {m}x{n}x{k}", {"M": m, "N": n, "K": k}, p, batch_dim="M")
        for label, m, n, k, p in cases
    ]


def _block_spread(rows: int, cols: int, row_block: int, device, gen) -> torch.Tensor:
    """Magnitudes that differ from block to block (e^N(0, 1) per block), so that a scale read
    from a wrong block, or skipped, changes the result."""
    rb = gc.cdiv(rows, row_block)
    cb = gc.cdiv(cols, FP8_BLOCK)
    spread = _inputs.randn((rb, cb), torch.float32, device, gen, "normal").exp()
    return _expand(spread, rows, cols, row_block)


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    m, n, k = shape.dims["M"], shape.dims["N"], shape.dims["K"]
    p = shape.params
    ue8m0 = bool(p.get("ue8m0", False))
    fp8 = e4m3_for(device)
    kb, nb = gc.cdiv(k, FP8_BLOCK), gc.cdiv(n, FP8_BLOCK)
    if device.type == "meta":
        a = torch.empty((m, k), dtype=fp8, device=device)
        b = torch.empty((n, k), dtype=fp8, device=device)
        sa = torch.empty((m, kb), device=device)
        sb = torch.empty((nb, kb), device=device)
    else:
        x = _inputs.randn((m, k), torch.float32, device, gen, dist)
        x = x * _block_spread(m, k, 1, device, gen)
        w = _inputs.randn((n, k), torch.float32, device, gen, "normal") / max(1.0, k**0.5)
        w = w * _block_spread(n, k, FP8_BLOCK, device, gen)
        a, sa = fp8_quant_torch(x, fp8_dtype=fp8, group_size=FP8_BLOCK, ue8m0=ue8m0)
        b, sb = quantize_fp8_block(w, fp8, ue8m0)
    if p.get("scale_a_layout") == "mk-major":
        sa = sa.t().contiguous().t()
    return {"a": a, "b": b, "scale_a": sa, "scale_b": sb}


def _cost(inputs: dict) -> Cost:
    a, b = inputs["a"], inputs["b"]
    m, k = a.shape
    n = b.shape[0]
    scales = inputs["scale_a"].numel() + inputs["scale_b"].numel()
    nbytes = a.numel() + b.numel() + 4 * scales + 2 * m * n
    return Cost(flops=2 * m * n * k, bytes=nbytes, compute="float8_e4m3fn")


FP8_BLOCK_GEMM = register(
    Op(
        "fp8_block_gemm",
        description="e4m3 GEMM with 1x128 activation and 128x128 weight block scales, bf16 out",
        reference=fp8_block_gemm_ref,
        make_inputs=_make_inputs,
        sampling=gc.gemm_sampling(rows={"a": 0, "scale_a": 0}),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # the e4m3 weight and the block scales are prepared together: only a is data
        contract=Contract(reduction=gc.reduction_of("a"), data_inputs=("a",)),
        dtypes=(torch.bfloat16,),
        kernels=(_fp8_block_gemm_kernel,),
        plan=_plan,
        tuning_space=gc.mnk_space(Fp8BlockConfig),
    )
)
FP8_BLOCK_GEMM.add_variant(
    Variant(
        "kernelab",
        fp8_block_gemm_triton,
        "triton",
        description="tiled, block scales applied per 128-wide K step (sm_89+, gfx942)",
    )
)
FP8_BLOCK_GEMM.add_torch(fp8_block_gemm_torch)


def _block_fp8_matmul(fn):
    """vLLM's and SGLang's Triton GEMMs share one signature: (A, B, As, Bs, block_size,
    output_dtype), B [N, K], As [M, K/128], Bs [N/128, K/128]."""

    def call(a, b, scale_a, scale_b, out=None):
        y = fn(a, b, scale_a, scale_b, [FP8_BLOCK, FP8_BLOCK], torch.bfloat16)
        return y if out is None else out.copy_(y)

    return call


def _vllm():
    from vllm.model_executor.layers.quantization.utils import fp8_utils

    fn = getattr(fp8_utils, "w8a8_triton_block_scaled_mm", None) or fp8_utils.w8a8_block_fp8_matmul
    return _block_fp8_matmul(fn)


def _sglang():
    from sglang.srt.layers.quantization.fp8_kernel import w8a8_block_fp8_matmul

    return _block_fp8_matmul(w8a8_block_fp8_matmul)


def _deep_gemm():
    import deep_gemm

    gemm = getattr(deep_gemm, "fp8_gemm_nt", None) or deep_gemm.gemm_fp8_fp8_bf16_nt
    align = getattr(deep_gemm, "get_col_major_tma_aligned_tensor", None)

    def call(a, b, scale_a, scale_b, out=None):
        c = (
            out
            if out is not None
            else torch.empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
        )
        sa = align(scale_a) if align is not None else scale_a
        gemm((a, sa), (b, scale_b), c)
        return c

    return call


FP8_BLOCK_GEMM.add_external(
    "vllm", "vllm", _vllm, description="vLLM's Triton block-fp8 GEMM (w8a8 block-scaled mm)"
)
FP8_BLOCK_GEMM.add_external(
    "sglang", "sglang", _sglang, description="SGLang's Triton w8a8_block_fp8_matmul"
)
FP8_BLOCK_GEMM.add_external(
    "deep_gemm",
    "deep_gemm",
    _deep_gemm,
    description="DeepGEMM fp8 NT GEMM (sm_90/sm_100; K a multiple of 128, TMA-aligned scales)",
)
