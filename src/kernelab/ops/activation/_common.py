"""Gated activations of transformer MLPs: SwiGLU and GeGLU (both GELU forms).

    x = [gate | up]  of shape (..., 2·d)
    silu_and_mul(x)                   = silu(gate) · up
    gelu_and_mul(x, approximate=...)  = gelu(gate) · up      ("none": erf form, "tanh": tanh form)

One kernel serves the family (the activation is a constexpr), one launcher serves both public
functions, and each function is its own op so that instruments report them apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton.language as tl

from kernelab.ops._model import Contract, Cost, Launch, Op, Shape, Variant, register
from kernelab.ops._runtime import check as _check
from kernelab.ops._runtime import inputs as _inputs
from kernelab.ops._runtime import shapes as _shapes
from kernelab.ops._runtime.launch import TL, cdiv, rows, shrink_to_fill, specialised, write_back
from kernelab.ops._runtime.triton import kernel, next_pow2, use_triton

#: The activations, as the kernel's ACT constexpr.
SILU, GELU_TANH, GELU_ERF = 0, 1, 2
_GELU = {"none": GELU_ERF, "tanh": GELU_TANH}

# --- the kernel -----------------------------------------------------------------------------


@kernel
def _act_and_mul_kernel(
    Out,
    stride_out,
    X,
    stride_x,
    n_rows,
    d,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ACT: tl.constexpr,
):
    """A tile of BLOCK_M rows × BLOCK_N output columns: act(gate) · up in float32.

    Bytes: reads each gate and up element once, writes each output element once (3·d per row).
    """
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < d)[None, :]
    x_gate = X + rows[:, None] * stride_x + cols[None, :]
    x_up = x_gate + d
    g = tl.load(x_gate, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_up, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        a = g / (1.0 + tl.exp(-g))
    elif ACT == 1:
        # tanh(z) = 1 - 2 / (1 + e^{2z}): exact limits ±1 when e^{2z} overflows or vanishes.
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 - 2.0 / (1.0 + tl.exp(2.0 * z)))
    else:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    out = Out + rows[:, None] * stride_out + cols[None, :]
    tl.store(out, (a * u).to(Out.dtype.element_ty), mask=mask)


# --- launch heuristics as data ----------------------------------------------------------------

#: Output elements per program at large shapes: 2048 over 8 warps is 8 per thread, one 128-bit
#: vector of 16-bit gate, one of up and one of output.
TILE_ELEMENTS = 2048
#: Smallest tile when shrinking tiles to fill the GPU at decode (one warp, 8 per thread).
MIN_TILE = 256


@dataclass(frozen=True)
class ActConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1

    @staticmethod
    def default_for(n_rows: int, d: int, device: torch.device | None = None) -> ActConfig:
        block_n = min(next_pow2(d), TILE_ELEMENTS)
        block_m = max(1, TILE_ELEMENTS // block_n)
        # Decode: shrink tiles (rows first, then columns) until there are two programs per SM.
        block_m, block_n = shrink_to_fill((n_rows, d), (block_m, block_n), MIN_TILE, device)
        num_warps = max(1, min(8, block_m * block_n // 256))
        return ActConfig(block_m, block_n, num_warps)

    @staticmethod
    def tuning_space(d: int) -> list[ActConfig]:
        space = [
            ActConfig(m, n, w)
            for n in (256, 512, 1024, 2048, 4096)
            if n <= max(256, next_pow2(d))
            for m in (1, 2, 4, 8)
            for w in (1, 2, 4, 8)
        ]

        def keep(c: ActConfig) -> bool:
            per_thread = c.block_m * c.block_n // (32 * c.num_warps)
            return 4 <= per_thread <= 32

        return [c for c in space if keep(c)]


# --- references, eager, launcher, public functions --------------------------------------------


def _gelu_f64(g, approximate):
    if approximate == "tanh":
        return 0.5 * g * (1.0 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g**3)))
    return 0.5 * g * (1.0 + torch.erf(g / 2**0.5))


def silu_and_mul_ref(x, out=None):
    """silu(gate) · up in the input's dtype (exact when given float64)."""
    d = x.shape[-1] // 2
    g, u = x[..., :d], x[..., d:]
    y = g * torch.sigmoid(g) * u
    return y if out is None else out.copy_(y)


def gelu_and_mul_ref(x, approximate="none", out=None):
    """gelu(gate) · up in the input's dtype (exact when given float64)."""
    d = x.shape[-1] // 2
    y = _gelu_f64(x[..., :d], approximate) * x[..., d:]
    return y if out is None else out.copy_(y)


def silu_and_mul_torch(x, out=None):
    """Eager PyTorch as inference servers write it, in the input's dtype."""
    _validate(x, out)
    d = x.shape[-1] // 2
    y = F.silu(x[..., :d]) * x[..., d:]
    return y if out is None else out.copy_(y)


def gelu_and_mul_torch(x, approximate="none", out=None):
    """Eager PyTorch as inference servers write it, in the input's dtype."""
    _validate(x, out, approximate)
    d = x.shape[-1] // 2
    y = F.gelu(x[..., :d], approximate=approximate) * x[..., d:]
    return y if out is None else out.copy_(y)


def _validate(x, out, approximate=None):
    _check.tensor("x", x, dtypes=_check.FLOATS, min_ndim=1)
    if x.shape[-1] % 2:
        raise ValueError(
            f"x: expected an even last dimension (gate and up halves), got shape {tuple(x.shape)}"
        )
    if approximate is not None and approximate not in _GELU:
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    if out is not None:
        _check.tensor("out", out, dtypes=(x.dtype,), device=x.device)
        _check.same_shape("out", out, (*x.shape[:-1], x.shape[-1] // 2), "x with half the width")


def act_and_mul_triton(x, act: int, out=None, config: ActConfig | None = None):
    """The one launcher of the family: ``act`` is SILU, GELU_TANH or GELU_ERF."""
    d = x.shape[-1] // 2
    result = out
    if result is None:
        result = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    if result.numel() == 0:
        return result
    x2 = rows(x)
    out2 = rows(result)
    n_rows = x2.shape[0]
    cfg = config or ActConfig.default_for(n_rows, d, x.device)
    grid = (cdiv(n_rows, cfg.block_m), cdiv(d, cfg.block_n))
    _act_and_mul_kernel[grid](
        out2,
        out2.stride(0),
        x2,
        x2.stride(0),
        n_rows,
        d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        ACT=act,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    write_back(out2, result)
    return result


def silu_and_mul_triton(x, out=None, config: ActConfig | None = None):
    _validate(x, out)
    return act_and_mul_triton(x, SILU, out, config)


def gelu_and_mul_triton(x, approximate="none", out=None, config: ActConfig | None = None):
    _validate(x, out, approximate)
    return act_and_mul_triton(x, _GELU[approximate], out, config)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU: ``silu(x[..., :d]) * x[..., d:]`` for ``x`` of shape (..., 2·d).

    Parameters
    ----------
    x : tensor (..., 2·d) of float32, float16 or bfloat16; any row stride.
    out : optional preallocated output (..., d) of ``x``'s dtype.

    Triton on CUDA/ROCm; torch on CPU (the interpreter with KERNELAB_INTERPRET=1).
    """
    if isinstance(x, torch.Tensor) and use_triton(x):
        return silu_and_mul_triton(x, out)
    return silu_and_mul_torch(x, out)


def gelu_and_mul(
    x: torch.Tensor, approximate: str = "none", out: torch.Tensor | None = None
) -> torch.Tensor:
    """GeGLU: ``gelu(x[..., :d]) * x[..., d:]``; ``approximate`` is "none" (erf) or "tanh".

    Parameters as :func:`silu_and_mul`.
    """
    if isinstance(x, torch.Tensor) and use_triton(x):
        return gelu_and_mul_triton(x, approximate, out)
    return gelu_and_mul_torch(x, approximate, out)


# --- the declarations --------------------------------------------------------------------------


def _shape(label, n_rows, d, params) -> Shape:
    return Shape(label, {"rows": n_rows, "d": d}, params, batch_dim="rows")


def _shape_sets(forms: tuple[dict, ...]):
    def suffix(p):
        return f" {p['approximate']}" if "approximate" in p else ""

    def representative() -> list[Shape]:
        return [
            _shape(
                f"{'/'.join(models)} {_shapes.phase(tokens)} {tokens}x2x{width}" + suffix(p),
                tokens,
                width,
                p,
            )
            for width, models in _shapes.by_width(lambda m: m.intermediate).items()
            for tokens in _shapes.TOKENS
            for p in forms
        ]

    def edge() -> list[Shape]:
        cases = [
            ("width 1", 3, 1, {}),
            ("prime width", 5, 1021, {}),
            ("one row", 1, 4096, {}),
            ("longer than one block", 3, 5000, {}),
            ("non-contiguous rows", 7, 257, {"row_pad": 13}),
            ("empty", 0, 128, {}),
            ("many short rows", 1000, 48, {}),
        ]
        return [
            _shape(f"{label} {n}x2x{d}" + suffix(p), n, d, {**extra, **p})
            for label, n, d, extra in cases
            for p in forms
        ]

    return {"representative": representative, "edge": edge}


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    n_rows, d = shape.dims["rows"], shape.dims["d"]
    x = _inputs.randn((n_rows, 2 * d), dtype, device, gen, dist)
    pad = shape.params.get("row_pad", 0)
    if pad and device.type != "meta":
        x = _inputs.strided_rows(x, pad)
    inputs = {"x": x}
    if "approximate" in shape.params:
        inputs["approximate"] = shape.params["approximate"]
    return inputs


def _cost(inputs: dict, flops_per_element: int) -> Cost:
    x = inputs["x"]
    n_out = x.numel() // 2
    # Read gate and up, write the product.
    return Cost(flops=flops_per_element * n_out, bytes=3 * n_out * x.element_size())


def _launcher(act_of):
    def launches(shape: Shape, dtype: torch.dtype, config: ActConfig | None = None):
        n_rows, d = shape.dims["rows"], shape.dims["d"]
        if n_rows * d == 0:
            return []
        cfg = config or ActConfig.default_for(n_rows, d)
        t = TL[dtype]
        sig = {
            "Out": f"*{t}",
            "stride_out": "i32",
            "X": f"*{t}",
            "stride_x": "i32",
            "n_rows": "i32",
            "d": "i32",
            "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr",
            "ACT": "constexpr",
        }
        ints = {
            "stride_out": d,
            "stride_x": 2 * d + shape.params.get("row_pad", 0),
            "n_rows": n_rows,
            "d": d,
        }
        div16, eq1 = specialised(ints, ("Out", "X"))
        return [
            Launch(
                _act_and_mul_kernel,
                sig,
                {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "ACT": act_of(shape)},
                cfg.num_warps,
                cfg.num_stages,
                (cdiv(n_rows, cfg.block_m), cdiv(d, cfg.block_n)),
                divisible_16=div16,
                equal_1=eq1,
                config=cfg,
            )
        ]

    return launches


def _tuning(shape: Shape, dtype) -> list[ActConfig]:
    return ActConfig.tuning_space(shape.dims["d"])


SILU_AND_MUL = register(
    Op(
        "silu_and_mul",
        description="SwiGLU: silu(gate) * up over [tokens, 2*d] -> [tokens, d]",
        reference=silu_and_mul_ref,
        make_inputs=_make_inputs,
        shapes=_shape_sets(({},)),
        cost=lambda inputs: _cost(inputs, 5),  # exp, add, divide, multiply by up (+ negate)
        contract=Contract(),
        kernels=(_act_and_mul_kernel,),
        launches=_launcher(lambda shape: SILU),
        tuning_space=_tuning,
    )
)
SILU_AND_MUL.add_variant(
    Variant("kernelab", silu_and_mul_triton, "triton", description="Triton, float32 math")
)
SILU_AND_MUL.add_torch(silu_and_mul_torch)

GELU_AND_MUL = register(
    Op(
        "gelu_and_mul",
        description="GeGLU: gelu(gate) * up, erf or tanh form, [tokens, 2*d] -> [tokens, d]",
        reference=gelu_and_mul_ref,
        make_inputs=_make_inputs,
        shapes=_shape_sets(({"approximate": "none"}, {"approximate": "tanh"})),
        cost=lambda inputs: _cost(inputs, 8),  # tanh form; the erf form is of the same order
        contract=Contract(),
        kernels=(_act_and_mul_kernel,),
        launches=_launcher(lambda shape: _GELU[shape.params.get("approximate", "none")]),
        tuning_space=_tuning,
    )
)
GELU_AND_MUL.add_variant(
    Variant("kernelab", gelu_and_mul_triton, "triton", description="Triton, float32 math")
)
GELU_AND_MUL.add_torch(gelu_and_mul_torch)
