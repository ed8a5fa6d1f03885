"""What the weight-only quantized GEMMs share: int4 (``w4a16``) and int8 (``w8a16``).

    out = x · W (+ bias),   W = (q − zero) · scale per group (int4)  or  q · scale[n] (int8)

x is float16/bfloat16 [M, K]; the weight is in the packed layouts of ``_packing`` (int4: two
codes per byte along K, scales and zero points per group of 64 or 128 rows; int8: one scale
per output column). Accumulation in float32, one rounding at the end.

One kernel serves both widths (constexpr BITS). The codes are turned into small integers
(q − zero, exact in 16-bit floats) and multiplied on tensor cores; the group's scale multiplies
the tile's float32 partial sum (int4) or the final sum (int8), so no dequantized weight is ever
rounded. Two launch shapes:

- M ≤ 16, the GEMV-shaped path: a 16-row tile (the smallest tensor-core M; the weight read,
  not the arithmetic, bounds this regime), a narrow N tile, and K split across programs so that
  the whole GPU streams the weight; ``_splitk_reduce_kernel`` sums the slices in a fixed order.
- larger M, the tiled path: output tiles in grouped order, as ``gemm``.

For int4 the even and odd k of a K tile are multiplied as two half-depth products (the low and
high nibbles of one byte), so the packed bytes are used as loaded, without an interleave; the
activation tile is loaded contiguously (vector loads) and split into its even and odd columns
in registers.

Shared here: the launch config and its heuristics (``WQConfig``), argument checks, the launch
plan of ``_kernels._wq_gemm_kernel`` (and the split-K reduction), inputs, cost and shapes. The
op modules (w4a16, w8a16) declare the ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core import Contract, Cost, Shape
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan
from kernelab.core.runtime.triton import num_sms
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul import _packing

# --- launch heuristics as data ----------------------------------------------------------------

#: The GEMV-shaped path serves M up to this (one 16-row tensor-core tile).
GEMV_MAX_M = 16
#: Each K slice keeps at least this many K steps, so its loads can be pipelined.
MIN_K_STEPS_PER_SPLIT = 4
MAX_SPLIT_K = 16


@dataclass(frozen=True)
class WQConfig(gc.TileConfig):
    """The weight-only kernel's tile; a BLOCK_M of 16 or less takes the GEMV-shaped path."""

    @property
    def path(self) -> str:
        return "gemv" if self.block_m <= GEMV_MAX_M else "tiled"

    @staticmethod
    def default_for(M: int, N: int, K: int, dtype=torch.bfloat16, device=None, bits=4):
        arch = gc.arch_of(device)
        if M <= GEMV_MAX_M:
            # Weight streaming: 16x64 tiles over N; split K until the tiles times the slices
            # cover the SMs twice (a 4096-wide layer has only 64 column tiles for 132 SMs).
            cfg = WQConfig(16, 64, 64 if bits == 4 else 128, 1, 1, 4, 4)
            sms = num_sms(device if isinstance(device, torch.device) else None)
            return gc.with_split_k(cfg, N, K, sms, MAX_SPLIT_K, MIN_K_STEPS_PER_SPLIT)
        if M <= 64:
            return WQConfig(64, 64, 64, 8, 1, 4, 3)
        # 128x128x32 over 8 warps: no spills on sm_80, sm_90 or gfx942 (triton 3.9); with
        # block_k 64, sm_80 spilled 10 KB (int4) and 120 bytes (int8).
        stages = 2 if arch is not None and arch.startswith("gfx") else 3
        return WQConfig(128, 128, 32, 8, 1, 8, stages)

    @staticmethod
    def tuning_space(M: int, N: int, K: int, dtype=torch.bfloat16, device=None, bits=4):
        space = [
            WQConfig(bm, bn, bk, 8, sk, w, s)
            for bm in (16, 32, 64, 128)
            for bn in (32, 64, 128, 256)
            for bk in (32, 64, 128)
            for sk in (1, 2, 4, 8, 16)
            for w in (4, 8)
            for s in (2, 3, 4)
        ]

        def keep(c: WQConfig) -> bool:
            if c.block_m > max(16, 2 * M) or (c.split_k > 1 and M > 64):
                return False
            if K // c.split_k < c.block_k or (bits == 4 and 64 % c.block_k):
                return False
            return 8 <= c.block_m * c.block_n // (32 * c.num_warps) <= 256

        return [c for c in space if keep(c)] or [WQConfig.default_for(M, N, K, dtype, device, bits)]


# --- argument checks and the launch plan ------------------------------------------------------


def validate(x, qweight, scales, zeros, group_size, bias, out, bits, check=False) -> int:
    """Arguments of the weight-only GEMMs (``zeros``, ``group_size``: int4 only); returns N.
    With ``check`` (a host sync), the int4 zero points' values too."""
    _check.tensor("x", x, dtypes=(torch.float16, torch.bfloat16), ndim=2)
    k = x.shape[1]
    if bits == 4:
        _check.tensor("qweight", qweight, dtypes=(torch.uint8,), ndim=2, device=x.device)
        _packing.check_group_size(group_size, k)
        if qweight.shape[0] * 2 != k:
            raise ValueError(
                f"qweight: expected {k // 2} rows (K/2 packed bytes for K={k}), "
                f"got shape {tuple(qweight.shape)}"
            )
        n = qweight.shape[1]
        groups = (k // group_size, n)
        _check.tensor("scales", scales, dtypes=(x.dtype,), ndim=2, device=x.device)
        _check.same_shape("scales", scales, groups, "K // group_size, N")
        _check.tensor("zeros", zeros, dtypes=(torch.uint8,), ndim=2, device=x.device)
        _check.same_shape("zeros", zeros, groups, "K // group_size, N")
        _check.boolean("check", check)
        if check:
            _packing.check_zero_points("zeros", zeros)
    else:
        _check.tensor("qweight", qweight, dtypes=(torch.int8,), ndim=2, device=x.device)
        if qweight.shape[0] != k:
            raise ValueError(f"qweight: expected {k} rows (K), got shape {tuple(qweight.shape)}")
        n = qweight.shape[1]
        _check.tensor("scales", scales, dtypes=(x.dtype,), ndim=1, device=x.device)
        _check.same_shape("scales", scales, (n,), "N")
    if bias is not None:
        _check.tensor("bias", bias, dtypes=(x.dtype,), ndim=1, device=x.device)
        _check.same_shape("bias", bias, (n,), "N")
    if out is not None:
        _check.tensor("out", out, dtypes=(x.dtype,), ndim=2, device=x.device)
        _check.same_shape("out", out, (x.shape[0], n), "(M, N)")
    return n


def plan(kern, x, qweight, scales, zeros, group_size, bias, out, config, *, bits) -> LaunchPlan:
    """The launches for these (validated) arguments with ``kern`` (``_wq_gemm_kernel``, or a
    planted-defect copy of it): the kernel into ``out`` (allocated when None), or, when K is
    split, into a float32 workspace and then the split-K reduction, which applies the int8
    scale and the bias. Nothing is launched for an empty output."""
    m, k = x.shape
    n = qweight.shape[1]
    c = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return LaunchPlan(result=c)
    if k == 0:  # an empty sum: zeros, plus the bias (as the torch path's addmm); no launch
        return LaunchPlan(result=c.zero_() if bias is None else c.copy_(bias.expand(m, n)))
    cfg = config or WQConfig.default_for(m, n, k, x.dtype, x.device, bits)
    if bits == 4 and group_size % cfg.block_k:
        raise ValueError(
            f"config: block_k={cfg.block_k} must divide group_size={group_size} for int4"
        )
    qweight, scales, bias = qweight.contiguous(), scales.contiguous(), gc.dense(bias)
    zeros = zeros.contiguous() if zeros is not None else scales
    k_per_split, split = gc.k_slices(k, cfg.split_k, cfg.block_k)
    opts = dict(group_size=group_size, bits=bits, k_per_split=k_per_split, cfg=cfg)
    if split == 1:
        return LaunchPlan((gemm_call(kern, c, c, x, qweight, scales, zeros, bias, **opts),), c)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    calls = (
        gemm_call(kern, part, c, x, qweight, scales, zeros, bias, **opts),
        gc.reduce_call(c, part, scale=scales if bits == 8 else None, bias=bias, config=cfg),
    )
    return LaunchPlan(calls, c)


def gemm_call(
    kern, target, c, x, qweight, scales, zeros, bias, *, group_size, bits, k_per_split, cfg
) -> KernelCall:
    """``kern`` into ``target``: ``c`` itself, or the float32 workspace [S, M, N] of S K slices
    (then the int8 scale and the bias are left to the reduction). int8 has no zero points
    (``scales`` stands in for them) and no groups."""
    m, k = x.shape
    n = c.shape[1]
    split = target.shape[0] if target.dim() == 3 else 1
    return KernelCall(
        kern,
        (gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n), split),
        dict(
            C=target,
            stride_cs=target.stride(0) if split > 1 else 0,
            stride_cm=target.stride(-2),
            stride_cn=target.stride(-1),
            X=x,
            stride_xm=x.stride(0),
            stride_xk=x.stride(1),
            Q=qweight,
            stride_qk=qweight.stride(0),
            stride_qn=qweight.stride(1),
            S=scales,
            stride_sk=scales.stride(0) if bits == 4 else 0,
            Z=zeros,
            stride_zk=zeros.stride(0) if bits == 4 else 0,
            Bias=bias if bias is not None else c,
            M=m,
            N=n,
            K=k,
            k_per_split=k_per_split,
            BITS=bits,
            GROUP_SIZE=group_size if bits == 4 else 1,
            **gc.tile_args(cfg),
            SPLIT_K=split,
            HAS_BIAS=bias is not None and split == 1,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )


# --- inputs, cost, shapes, contract -----------------------------------------------------------
#
# Contract: the default (2x eager torch's error, per-dtype floor). The reference is computed
# from the very quantized weight the kernel reads, so quantization error is not compared.

DTYPES = (torch.float16, torch.bfloat16)
#: NaN and Inf go into the activations; scales and zero points are prepared data.
CONTRACT = Contract(
    special_inputs=("x",), data_inputs=("x", "bias"), reduction=gc.reduction_of("x")
)


def edge(bits: int) -> list[Shape]:
    cases = [
        ("one row", 1, 33, 128, {"group_size": 64}),
        ("decode batch", 5, 100, 384, {"group_size": 128, "bias": True}),
        ("GEMV limit", 16, 72, 192, {"group_size": 64}),
        ("just past GEMV", 17, 50, 256, {"group_size": 128}),
        ("odd M and N", 33, 97, 128, {"group_size": 64, "bias": True, "x_pad": 5}),
        ("empty M", 0, 32, 128, {"group_size": 64}),
    ]
    shapes = []
    for label, m, n, k, p in cases:
        if bits == 8:  # per-column scales: no groups
            p = {a: v for a, v in p.items() if a != "group_size"}
        group = f" g{p['group_size']}" if "group_size" in p else ""
        shapes.append(Shape(f"{label} {m}x{n}x{k}{group}", {"M": m, "N": n, "K": k}, p, "M"))
    return shapes


def weight(shape, device, gen):
    """The float weight [K, N] to quantize, scaled by 1/sqrt(K) as trained layers are."""
    k, n = shape.dims["K"], shape.dims["N"]
    return _inputs.randn((k, n), torch.float32, device, gen, "normal") / max(1.0, k**0.5)


def x_and_bias(shape, dtype, device, gen, dist):
    """The activations (with the shape's row padding) and the bias the shape asks for."""
    m, k, n = shape.dims["M"], shape.dims["K"], shape.dims["N"]
    x = _inputs.randn((m, k), dtype, device, gen, dist)
    if shape.params.get("x_pad"):
        x = _inputs.strided_rows(x, shape.params["x_pad"])
    bias = _inputs.randn((n,), dtype, device, gen, "normal") if shape.params.get("bias") else None
    return x, bias


def cost(inputs: dict) -> Cost:
    """FLOPs 2·M·N·K; bytes: x, the weight at its packed width, scales, zeros, bias, out."""
    x, q = inputs["x"], inputs["qweight"]
    m, k = x.shape
    n = q.shape[1]
    nbytes = x.numel() * x.element_size() + q.numel() * q.element_size()
    for name in ("scales", "zeros", "bias"):
        t = inputs.get(name)
        if t is not None:
            nbytes += t.numel() * t.element_size()
    nbytes += m * n * x.element_size()
    return Cost(flops=2 * m * n * k + (m * n if inputs.get("bias") is not None else 0),
                bytes=nbytes)  # fmt: skip


def tuning_space(shape: Shape, dtype, bits: int) -> list[WQConfig]:
    d = shape.dims
    return WQConfig.tuning_space(d["M"], d["N"], d["K"], dtype, None, bits)
