"""RMSNorm, with the fused residual add of inference servers.

    residual ← x + residual          (only when ``residual`` is given; in place)
    out      = h / sqrt(mean(h²) + eps) · weight,   h = residual if given else x

The ladder: ``_rmsnorm_kernel`` (Triton) → ``rmsnorm_triton`` (launcher: validate, allocate,
launch) → ``rmsnorm`` (public: Triton on GPUs, torch on CPU) with ``rmsnorm_ref`` (reference,
exact in float64) and ``rmsnorm_torch`` (eager PyTorch, float32 arithmetic) beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from kernelab.ops import _check, _inputs, _shapes, _tuned
from kernelab.ops._model import Contract, Cost, Launch, Op, Shape, Variant, register
from kernelab.ops._triton import kernel, next_pow2, num_sms, use_triton

# --- the kernel -----------------------------------------------------------------------------


@kernel
def _rmsnorm_kernel(
    Out,
    stride_out,
    X,
    stride_x,
    Res,
    stride_res,
    W,
    n_rows,
    n_cols,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    """BLOCK_M rows per program; each row normalised over n_cols in float32.

    Bytes: reads x (and residual) once and weight once per program, writes out (and residual)
    once when SINGLE_PASS (the row fits in BLOCK_N); otherwise a second pass re-reads the row.
    With a residual, the sum is rounded to the residual's dtype before it is normalised, so the
    output is exactly rmsnorm of the residual as stored.
    """
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    x_rows = X + rows[:, None] * stride_x
    o_rows = Out + rows[:, None] * stride_out
    r_rows = Res + rows[:, None] * stride_res
    if SINGLE_PASS:
        mask = row_ok[:, None] & (cols[None, :] < n_cols)
        h = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(r_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            s = (h + r).to(Res.dtype.element_ty)
            tl.store(r_rows + cols[None, :], s, mask=mask)
            h = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(h * h, axis=1) / n_cols + eps)
        w = tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = h * rstd[:, None] * w[None, :]
        tl.store(o_rows + cols[None, :], y.to(Out.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < n_cols)
            h = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(r_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
                s = (h + r).to(Res.dtype.element_ty)
                tl.store(r_rows + c[None, :], s, mask=mask)
                h = s.to(tl.float32)
            acc += h * h
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            c = start + cols
            mask = row_ok[:, None] & (c[None, :] < n_cols)
            if HAS_RESIDUAL:
                h = tl.load(r_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            else:
                h = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + c, mask=c < n_cols, other=0.0).to(tl.float32)
            y = h * rstd[:, None] * w[None, :]
            tl.store(o_rows + c[None, :], y.to(Out.dtype.element_ty), mask=mask)


# --- launch heuristics as data ----------------------------------------------------------------

#: Widest row kept in registers in one pass: 16384 fp32 values over 16 warps is 32 per thread,
#: which compiles without spills on sm_80/sm_90 (kernelab inspect); wider rows loop.
MAX_SINGLE_PASS = 16384
#: Block width when looping over a long row.
LOOP_BLOCK = 4096
#: Elements a program should hold when several short rows share it (8 KB of bf16).
TILE_ELEMENTS = 4096


@dataclass(frozen=True)
class RMSNormConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1

    @staticmethod
    def default_for(n_rows: int, n_cols: int, device: torch.device | None = None):
        block_n = next_pow2(n_cols) if n_cols <= MAX_SINGLE_PASS else LOOP_BLOCK
        # Several short rows per program, but never so many that the grid under-fills the GPU
        # (at least two programs per SM while rows allow).
        block_m = 1
        if block_n < TILE_ELEMENTS:
            block_m = TILE_ELEMENTS // block_n
            per_sm = max(1, n_rows // (2 * num_sms(device)))
            block_m = max(1, min(block_m, 1 << (per_sm.bit_length() - 1)))
        # About 8-16 values per thread: one or two 128-bit vectors of 16-bit data.
        num_warps = min(16, max(1, block_m * block_n // 512))
        return RMSNormConfig(block_m, block_n, num_warps)

    @staticmethod
    def tuning_space(n_cols: int) -> list[RMSNormConfig]:
        widths = [next_pow2(n_cols)] if n_cols <= MAX_SINGLE_PASS else [2048, 4096, 8192]
        space = [
            RMSNormConfig(m, n, w)
            for n in widths
            for m in (1, 2, 4, 8, 16)
            for w in (1, 2, 4, 8, 16)
        ]

        def keep(c: RMSNormConfig) -> bool:
            per_thread = c.block_m * c.block_n // (32 * c.num_warps)
            return 4 <= per_thread <= 64 and c.block_m * c.block_n <= MAX_SINGLE_PASS

        return [c for c in space if keep(c)] or [RMSNormConfig.default_for(1, n_cols)]


# --- reference, eager, launcher, public function ----------------------------------------------


def rmsnorm_ref(x, weight, eps=1e-6, residual=None, out=None):
    """Plain PyTorch in the inputs' dtype (exact when given float64); updates ``residual``."""
    h = x
    if residual is not None:
        residual.add_(x)
        h = residual
    y = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps) * weight
    return y if out is None else out.copy_(y)


def rmsnorm_torch(x, weight, eps=1e-6, residual=None, out=None):
    """Eager PyTorch as inference code writes it: float32 arithmetic, one rounding at the end."""
    _validate(x, weight, eps, residual, out)
    h = x
    if residual is not None:
        residual.add_(x)
        h = residual
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    y = y.to(x.dtype)
    return y if out is None else out.copy_(y)


def _validate(x, weight, eps, residual, out):
    _check.tensor("x", x, dtypes=_check.FLOATS, min_ndim=1)
    _check.tensor("weight", weight, dtypes=_check.FLOATS, ndim=1, device=x.device)
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight: expected shape ({x.shape[-1]},) to match x's last dimension, "
            f"got {tuple(weight.shape)}"
        )
    _check.positive("eps", eps)
    if residual is not None:
        _check.tensor("residual", residual, dtypes=(x.dtype,), device=x.device)
        _check.same_shape("residual", residual, x.shape, "the shape of x")
    if out is not None:
        _check.tensor("out", out, dtypes=(x.dtype,), device=x.device)
        _check.same_shape("out", out, x.shape, "the shape of x")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A 2-D view (rows, cols) with unit column stride; a copy only if no such view exists."""
    t2 = t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t
    if t2.shape[-1] > 1 and t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2


def rmsnorm_triton(x, weight, eps=1e-6, residual=None, out=None, config=None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(x, weight, eps, residual, out)
    result = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    if x.numel() == 0:
        return result
    x2 = _rows(x)
    n_rows, n_cols = x2.shape
    out2 = _rows(result)
    res2 = _rows(residual) if residual is not None else x2
    cfg = (
        config
        or _tuned.config_for(
            "rmsnorm",
            (_rmsnorm_kernel,),
            RMSNormConfig,
            {"rows": n_rows, "cols": n_cols},
            "rows",
            x.dtype,
            x.device,
        )
        or RMSNormConfig.default_for(n_rows, n_cols, x.device)
    )
    grid = (triton_cdiv(n_rows, cfg.block_m),)
    _rmsnorm_kernel[grid](
        out2,
        out2.stride(0),
        x2,
        x2.stride(0),
        res2,
        res2.stride(0),
        weight.contiguous(),
        n_rows,
        n_cols,
        float(eps),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        HAS_RESIDUAL=residual is not None,
        SINGLE_PASS=n_cols <= cfg.block_n,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    # Views that had to be copied (no 2-D view existed) are written back.
    if out2.data_ptr() != result.data_ptr() or out2.shape != result.reshape(-1, n_cols).shape:
        result.copy_(out2.view(result.shape))
    if residual is not None and res2.data_ptr() != residual.data_ptr():
        residual.copy_(res2.view(residual.shape))
    return result


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension, with optional fused residual.

    Parameters
    ----------
    x : tensor (..., n) of float32, float16 or bfloat16; any leading shape, any row stride.
    weight : tensor (n,), any float dtype.
    eps : added to the mean square before the reciprocal square root.
    residual : optional tensor like ``x``; updated in place to ``x + residual``, and the
        output is then the normalised residual.
    out : optional preallocated output like ``x``.

    Returns the normalised tensor, of ``x``'s shape and dtype. On CUDA/ROCm the Triton kernel
    runs; on CPU the torch implementation (or the Triton interpreter with KERNELAB_INTERPRET=1).
    """
    if isinstance(x, torch.Tensor) and use_triton(x):
        return rmsnorm_triton(x, weight, eps, residual, out)
    return rmsnorm_torch(x, weight, eps, residual, out)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    shapes = []
    for hidden, models in _shapes.by_width(lambda m: m.hidden).items():
        for tokens in _shapes.TOKENS:
            for residual in (False, True):
                label = f"{'/'.join(models)} {_shapes.phase(tokens)} {tokens}x{hidden}"
                shapes.append(
                    Shape(
                        label + (" +res" if residual else ""),
                        {"rows": tokens, "cols": hidden},
                        {"residual": residual},
                        batch_dim="rows",
                    )
                )
    return shapes


def _edge() -> list[Shape]:
    cases = [
        ("1 column", 3, 1, {}),
        ("prime width", 5, 1021, {}),
        ("one row", 1, 4096, {}),
        ("longer than one block", 3, MAX_SINGLE_PASS + 1000, {}),
        ("non-contiguous rows", 7, 257, {"row_pad": 13}),
        ("empty", 0, 128, {}),
        ("many short rows", 1000, 96, {}),
    ]
    shapes = []
    for label, rows, cols, params in cases:
        for residual in (False, True):
            shapes.append(
                Shape(
                    f"{label} {rows}x{cols}" + (" +res" if residual else ""),
                    {"rows": rows, "cols": cols},
                    {"residual": residual, **params},
                    batch_dim="rows",
                )
            )
    return shapes


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    rows, cols = shape.dims["rows"], shape.dims["cols"]
    x = _inputs.randn((rows, cols), dtype, device, gen, dist)
    # Weights near 1, as trained RMSNorm weights are, with enough spread to catch misindexing.
    weight = _inputs.randn((cols,), dtype, device, gen, "normal", scale=0.1, mean=1.0)
    residual = None
    if shape.params.get("residual"):
        residual = _inputs.randn((rows, cols), dtype, device, gen, dist)
    pad = shape.params.get("row_pad", 0)
    if pad and device.type != "meta":
        x = _inputs.strided_rows(x, pad)
        if residual is not None:
            residual = _inputs.strided_rows(residual, pad)
    return {"x": x, "weight": weight, "eps": 1e-6, "residual": residual}


def _cost(inputs: dict) -> Cost:
    x, w, residual = inputs["x"], inputs["weight"], inputs.get("residual")
    n = x.numel()
    # Read x and weight, write out; with a residual also read and write the residual.
    nbytes = 2 * n * x.element_size() + w.numel() * w.element_size()
    flops = 4 * n  # square, accumulate, scale by rstd, scale by weight
    if residual is not None:
        nbytes += 2 * n * residual.element_size()
        flops += n
    return Cost(flops=flops, bytes=nbytes)


_TL = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _launches(shape: Shape, dtype: torch.dtype, config: RMSNormConfig | None = None):
    rows, cols = shape.dims["rows"], shape.dims["cols"]
    if rows * cols == 0:
        return []
    cfg = config or RMSNormConfig.default_for(rows, cols)
    t = _TL[dtype]
    row_stride = cols + shape.params.get("row_pad", 0)
    sig = {
        "Out": f"*{t}",
        "stride_out": "i32",
        "X": f"*{t}",
        "stride_x": "i32",
        "Res": f"*{t}",
        "stride_res": "i32",
        "W": f"*{t}",
        "n_rows": "i32",
        "n_cols": "i32",
        "eps": "fp32",
        "BLOCK_M": "constexpr",
        "BLOCK_N": "constexpr",
        "HAS_RESIDUAL": "constexpr",
        "SINGLE_PASS": "constexpr",
    }
    ints = {
        "stride_out": cols,
        "stride_x": row_stride,
        "stride_res": row_stride,
        "n_rows": rows,
        "n_cols": cols,
    }
    return [
        Launch(
            _rmsnorm_kernel,
            sig,
            {
                "BLOCK_M": cfg.block_m,
                "BLOCK_N": cfg.block_n,
                "HAS_RESIDUAL": bool(shape.params.get("residual")),
                "SINGLE_PASS": cols <= cfg.block_n,
            },
            cfg.num_warps,
            cfg.num_stages,
            (triton_cdiv(rows, cfg.block_m),),
            divisible_16=("Out", "X", "Res", "W", *(k for k, v in ints.items() if v % 16 == 0)),
            equal_1=tuple(k for k, v in ints.items() if v == 1),
            config=cfg,
        )
    ]


RMSNORM = register(
    Op(
        "rmsnorm",
        description="RMSNorm over the last dimension, optional fused residual add (in place)",
        reference=rmsnorm_ref,
        make_inputs=_make_inputs,
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        contract=Contract(inplace=("residual",)),
        kernels=(_rmsnorm_kernel,),
        launches=_launches,
        tuning_space=lambda shape, dtype: RMSNormConfig.tuning_space(shape.dims["cols"]),
    )
)
RMSNORM.add_variant(
    Variant(
        "kernelab",
        rmsnorm_triton,
        "triton",
        description="Triton kernel, one pass for rows up to 16384",
    )
)
RMSNORM.add_torch(rmsnorm_torch)
RMSNORM.add_external(
    "liger",
    "liger_kernel",
    lambda: _liger_rmsnorm(),
    description="Liger-Kernel LigerRMSNormFunction (no fused residual)",
)


def _liger_rmsnorm():
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    def call(x, weight, eps=1e-6, residual=None, out=None):
        if residual is not None:
            residual.add_(x)
            x = residual
        y = LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama")
        return y if out is None else out.copy_(y)

    return call
