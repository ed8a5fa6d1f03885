"""Pieces shared by the GEMM family (gemm, w4a16_gemm, w8a16_gemm, fp8_gemm); the Triton
kernels and helpers they share (``_tile_coords``, ``_epilogue``, ``_splitk_reduce_kernel``) are
in ``_kernels``.

- K slices, and the launch (``KernelCall``) of the deterministic split-K reduction.
- The shape sets: projections of real models and edge cases, with the sizes the interpreter
  runs them at (``Shape.reduce_to``).
- Architecture names for a device, split-K factors, activation codes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kernelab.core import Sampling, Shape
from kernelab.core.runtime import shapes as _shapes
from kernelab.core.runtime.launch import KernelCall
from kernelab.core.runtime.launch import cdiv as cdiv  # re-exported for the GEMM modules
from kernelab.core.runtime.triton import arch_of as arch_of  # re-exported, as cdiv
from kernelab.core.runtime.triton import sm_version as sm_version
from kernelab.ops.matmul._kernels import _splitk_reduce_kernel

#: Activation codes understood by ``_epilogue`` (constexpr ACTIVATION).
ACTIVATIONS = {"none": 0, "silu": 1, "gelu": 2}

#: Tokens per step for the representative GEMM shapes: decode at 1 and 16, a small prefill
#: chunk, and long prefills.
GEMM_M = (1, 16, 128, 2048, 8192)

#: Sizes a representative shape is cut to when it runs through the interpreter: N and K that are
#: not multiples of the largest tiles, and K a multiple of both int4 group sizes (64, 128).
INTERPRETER_DIMS = {"N": 160, "K": 256}

#: The largest BLOCK_M the GEMM kernels use (an interpreted edge shape keeps two such tiles).
TILE_M = 128


def dense(vector: torch.Tensor | None) -> torch.Tensor | None:
    """A 1-D bias or scale vector as the kernels read it, element i at ``ptr + i``: the
    tensor itself when it has unit stride, else a contiguous copy (N elements, cheap
    beside the GEMM)."""
    if vector is None or vector.numel() <= 1 or vector.stride(-1) == 1:
        return vector
    return vector.contiguous()


def b_cols(inputs: dict) -> int:
    """The dimension of B indexed by the output column: 1 for [K, N], 0 for an [N, K] weight."""
    return 1 if inputs.get("b_layout", "kn") == "kn" else 0


def gemm_sampling(rows: dict, cols: dict | None = None, applies=None) -> Sampling:
    """A GEMM's row independence: output element (i, j) depends on row i of the row inputs
    and, when ``cols`` are given, column j of the column inputs only; the output is "out"."""
    return Sampling(
        rows={**rows, "out": 0},
        cols={**cols, "out": 1} if cols else {},
        col_dim="N" if cols else None,
        tile={"M": TILE_M},
        applies=applies,
    )


# --- the split-K reduction -------------------------------------------------------------------

REDUCE_BLOCK = (32, 64)


def k_slices(k: int, split_k: int, block_k: int) -> tuple[int, int]:
    """(K per slice, slices) for ``split_k`` slices of whole ``block_k`` steps: the last slice
    may be shorter, and fewer slices than asked remain when K is short."""
    k_per_split = cdiv(cdiv(k, split_k), block_k) * block_k
    return k_per_split, cdiv(k, k_per_split)


def operand_args(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> dict:
    """The argument group every A·B kernel of the family takes: C (the output, or a [S, M, N]
    workspace: its last two strides), A [M, K], B as [K, N] (a view), their strides, M, N, K."""
    return dict(
        C=c,
        stride_cm=c.stride(-2),
        stride_cn=c.stride(-1),
        A=a,
        stride_am=a.stride(0),
        stride_ak=a.stride(1),
        B=b,
        stride_bk=b.stride(0),
        stride_bn=b.stride(1),
        M=a.shape[0],
        N=b.shape[1],
        K=a.shape[1],
    )


def tile_args(cfg) -> dict:
    """The tile constexprs of a tiled config (BLOCK_M/N/K, GROUP_M)."""
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)


def reduce_call(out, part, *, scale=None, bias=None, residual=None, activation=0, config=None):
    """The launch of ``_splitk_reduce_kernel``: ``out`` ← epilogue(Σ part[s] (× scale)), with
    ``part`` the float32 workspace [S, M, N]; ``config`` is the GEMM's, for the record."""
    split_k, m, n = part.shape
    res = residual if residual is not None else out
    bm, bn = REDUCE_BLOCK
    return KernelCall(
        _splitk_reduce_kernel,
        (cdiv(m, bm), cdiv(n, bn)),
        dict(
            C=out,
            stride_cm=out.stride(0),
            stride_cn=out.stride(1),
            Part=part,
            stride_ps=part.stride(0),
            stride_pm=part.stride(1),
            Scale=scale if scale is not None else part,
            Bias=bias if bias is not None else out,
            Res=res,
            stride_rm=res.stride(0),
            stride_rn=res.stride(1),
            M=m,
            N=n,
            SPLIT_K=split_k,
            BLOCK_M=bm,
            BLOCK_N=bn,
            HAS_SCALE=scale is not None,
            HAS_BIAS=bias is not None,
            ACTIVATION=activation,
            HAS_RESIDUAL=residual is not None,
        ),
        num_warps=4,
        config=config,
    )


# --- small host helpers -----------------------------------------------------------------------


@dataclass(frozen=True)
class TileConfig:
    """The launch fields of the family's tiled, split-K capable kernels: a BLOCK_M × BLOCK_N
    output tile stepping BLOCK_K, tiles grouped GROUP_M rows at a time, K in ``split_k``
    slices (summed by the reduce kernel)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class ScaledTileConfig:
    """Tiles of the block-scaled GEMMs (fp8_block_gemm, mx_gemm, nvfp4_gemm); no split-K. Each
    op subclasses it so its configs keep their own name. ``default_for`` and ``tuning_space``
    here are the ``tl.dot_scaled`` GEMMs' (mx, nvfp4): ``block_k`` a multiple of 64 (whole
    scale blocks of 32 or 16 values, and the block-scaled MMA's K step); fp8_block_gemm
    overrides both."""

    block_m: int
    block_n: int
    block_k: int = 128
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    @classmethod
    def default_for(cls, M: int, N: int, K: int, dtype=torch.bfloat16, device=None):
        if M <= 64:
            return cls(64, 64, 128, 1, 4, 3)
        if sm_version(arch_of(device)) >= 90:
            return cls(128, 128, 128, 8, 8, 3)
        # sm_80, gfx942 and an unknown device (one config for every target): 64-wide K steps.
        # With A quantized in the kernel, mx_gemm's 128-wide steps spilled there (336 bytes per
        # thread on sm_80, 92 on gfx942, triton 3.9), with no wgmma or tcgen05 accumulator to
        # relieve the registers; nvfp4_gemm's in-kernel quantizer takes the same steps.
        return cls(128, 128, 64, 8, 8, 3)

    @classmethod
    def tuning_space(cls, M: int, N: int, K: int, dtype=torch.bfloat16, device=None) -> list:
        space = [
            cls(bm, bn, bk, 8, w, s)
            for bm in (64, 128)
            for bn in (64, 128, 256)
            for bk in (64, 128, 256)
            for w in (4, 8)
            for s in (2, 3, 4)
        ]

        def keep(c) -> bool:
            smem = (2 * c.block_m + c.block_n) * c.block_k * c.num_stages
            per_thread = c.block_m * c.block_n // (32 * c.num_warps)
            return c.block_m <= max(64, 2 * M) and smem <= 200 * 1024 and 16 <= per_thread <= 128

        return [c for c in space if keep(c)] or [cls.default_for(M, N, K, dtype, device)]


def with_split_k(cfg, n: int, k: int, sms: int, max_split: int, min_steps: int):
    """``cfg`` with the K slices that make its N tiles times the slices cover the SMs twice."""
    tiles, k_steps = cdiv(n, cfg.block_n), cdiv(k, cfg.block_k)
    return replace(cfg, split_k=split_k_for(tiles, k_steps, sms, max_split, min_steps))


def mnk_space(config_cls):
    """An op's ``tuning_space(shape, dtype)`` from a config class's ``tuning_space(M, N, K,
    dtype)``."""

    def tuning_space(shape: Shape, dtype):
        d = shape.dims
        return config_cls.tuning_space(d["M"], d["N"], d["K"], dtype)

    return tuning_space


def split_k_for(tiles: int, k_steps: int, sms: int, max_split: int = 16, min_steps: int = 4) -> int:
    """Split-K factor for a small-M problem: double the K slices while the output tiles times
    the slices cover the SMs less than twice, each slice keeps at least ``min_steps`` K steps
    (fewer and the pipeline never fills), and at most ``max_split`` slices."""
    split = 1
    while (
        split * 2 <= max_split and tiles * split < 2 * sms and k_steps // (split * 2) >= min_steps
    ):
        split *= 2
    return split


def activation_code(activation: str) -> int:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation]


def apply_activation(x: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return torch.nn.functional.silu(x)
    if activation == "gelu":
        return torch.nn.functional.gelu(x)
    return x


# --- shape sets -------------------------------------------------------------------------------


def projections() -> list[tuple[str, int, int, bool]]:
    """(label, N, K, has_bias) of the attention and MLP projections of the models in _shapes.

    qkv: N = (heads + 2·kv_heads)·head_dim, K = hidden (Qwen2.5 has a qkv bias); o: N = hidden,
    K = heads·head_dim; gate_up (fused): N = 2·intermediate, K = hidden; down: N = hidden,
    K = intermediate. Models with equal shapes share one entry.
    """
    seen: dict[tuple[int, int, bool], list[str]] = {}
    order: list[tuple[str, int, int, bool]] = []
    for m in _shapes.MODELS:
        q = m.heads * m.head_dim
        for proj, n, k in (
            ("qkv", q + 2 * m.kv_heads * m.head_dim, m.hidden),
            ("o", m.hidden, q),
            ("gate_up", 2 * m.intermediate, m.hidden),
            ("down", m.hidden, m.intermediate),
        ):
            bias = proj == "qkv" and m.name.startswith("qwen")
            key = (n, k, bias)
            if key not in seen:
                seen[key] = []
                order.append((proj, n, k, bias))
            seen[key].append(m.name)
    return [(f"{'/'.join(seen[(n, k, b)])} {p}", n, k, b) for p, n, k, b in order]


def representative(
    params_for=lambda proj, bias: {}, ms=GEMM_M, reduce_to=INTERPRETER_DIMS
) -> list[Shape]:
    """Every projection at every M in ``ms``; M is the batch dimension, and N, K are cut to
    ``reduce_to`` when the shape is reduced for the interpreter (the label says so)."""
    shapes = []
    for label, n, k, bias in projections():
        proj = label.rsplit(" ", 1)[-1]
        for m in ms:
            phase = "decode" if m <= 16 else "prefill"
            shapes.append(
                Shape(
                    f"{label} {phase} M={m} {n}x{k}",
                    {"M": m, "N": n, "K": k},
                    {"bias": bias, **params_for(proj, bias)},
                    batch_dim="M",
                    reduce_to=dict(reduce_to),
                )
            )
    return shapes


def reduction_of(name: str):
    """``Contract.reduction`` of a GEMM: K, the last dimension of activation ``name``."""

    def reduction(inputs: dict) -> int:
        return int(inputs[name].shape[-1])

    return reduction
