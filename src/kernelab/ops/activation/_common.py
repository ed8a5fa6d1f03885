"""What the gated activations share: the launch heuristic, argument checks, the launch plan of
the family kernel (``_kernels._act_and_mul_kernel``), shape sets, inputs and cost. The op
modules (silu_and_mul, gelu_and_mul) declare the ops.

    x = [gate | up]  of shape (..., 2·d)
    out = act(gate) · up          of shape (..., d)

One kernel serves the family (the activation is a constexpr), and each function is its own op
so that instruments report them apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core import Cost, Shape
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime import shapes as _shapes
from kernelab.core.runtime.launch import KernelCall, LaunchPlan, cdiv, rows, shrink_to_fill
from kernelab.core.runtime.triton import next_pow2
from kernelab.ops.activation._kernels import GELU_ERF, GELU_TANH

#: The GELU forms (``approximate``) as the kernel's ACT constexpr.
GELU = {"none": GELU_ERF, "tanh": GELU_TANH}

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


def tuning(shape: Shape, dtype) -> list[ActConfig]:
    return ActConfig.tuning_space(shape.dims["d"])


# --- the launcher ------------------------------------------------------------------------------


def validate(x, out, approximate=None) -> None:
    """Arguments of the gated activations; ``approximate`` only for the GELU forms."""
    _check.tensor("x", x, dtypes=_check.FLOATS, min_ndim=1)
    if x.shape[-1] % 2:
        raise ValueError(
            f"x: expected an even last dimension (gate and up halves), got shape {tuple(x.shape)}"
        )
    if approximate is not None and approximate not in GELU:
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    if out is not None:
        _check.tensor("out", out, dtypes=(x.dtype,), device=x.device)
        _check.same_shape("out", out, (*x.shape[:-1], x.shape[-1] // 2), "x with half the width")


def plan(kern, x: torch.Tensor, act: int, out, config: ActConfig | None) -> LaunchPlan:
    """act(gate) · up of ``x`` into ``out`` (allocated when None) with ``kern`` (the family
    kernel, or a planted-defect copy of it); ``act`` is the kernel's ACT (SILU, GELU_TANH or
    GELU_ERF). Nothing is launched for an empty output."""
    d = x.shape[-1] // 2
    result = out
    if result is None:
        result = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    if result.numel() == 0:
        return LaunchPlan(result=result)
    x2 = rows(x)
    out2 = rows(result)
    n_rows = x2.shape[0]
    cfg = config or ActConfig.default_for(n_rows, d, x.device)
    call = KernelCall(
        kern,
        (cdiv(n_rows, cfg.block_m), cdiv(d, cfg.block_n)),
        dict(
            Out=out2,
            stride_out=out2.stride(0),
            X=x2,
            stride_x=x2.stride(0),
            n_rows=n_rows,
            d=d,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            ACT=act,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    return LaunchPlan((call,), result, ((out2, result),))


# --- shapes, inputs and cost -------------------------------------------------------------------


def _shape(label, n_rows, d, params) -> Shape:
    return Shape(label, {"rows": n_rows, "d": d}, params, batch_dim="rows")


def shape_sets(forms: tuple[dict, ...]):
    """The representative (MLP widths of the models) and edge shapes, once per form."""

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


def inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    """x [rows, 2·d] with the shape's row padding, and the shape's GELU form if it has one."""
    n_rows, d = shape.dims["rows"], shape.dims["d"]
    x = _inputs.randn((n_rows, 2 * d), dtype, device, gen, dist)
    pad = shape.params.get("row_pad", 0)
    if pad:
        x = _inputs.strided_rows(x, pad)
    out = {"x": x}
    if "approximate" in shape.params:
        out["approximate"] = shape.params["approximate"]
    return out


def cost(inputs: dict, flops_per_element: int) -> Cost:
    x = inputs["x"]
    n_out = x.numel() // 2
    # Read gate and up, write the product.
    return Cost(flops=flops_per_element * n_out, bytes=3 * n_out * x.element_size())
