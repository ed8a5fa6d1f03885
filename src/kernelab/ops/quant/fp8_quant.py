"""Float8 quantization for inference: dynamic per-token, per-token-group and per-tensor scales,
or a given one (RMSNorm fused with per-token quantization is ``kernelab.ops.rmsnorm_fp8_quant``).

    scale  = max(max|x| / FP8_MAX, MIN_SCALE)     over a row (per token), over each group of
                                                  ``group_size`` columns of a row (per token
                                                  group), or over the whole tensor
    scale  = 2^ceil(log2(scale))                  with ``ue8m0`` (power-of-two group scales)
    values = fp8(clamp(x / scale, −FP8_MAX, FP8_MAX))    rounded to nearest even
    x ≈ values · scale

Per token group is the activation side of block-scaled float8 GEMMs (DeepSeek-V3's recipe:
groups of 128 along K, ``kernelab.ops.fp8_block_gemm``); scales are float32 of shape
(..., ceil(cols / group_size)), the last group shorter when cols is not a multiple. With
``ue8m0`` every scale is a power of two (an 8-bit exponent, as Blackwell's block-scaled MMA and
DeepGEMM's UE8M0 path take them) and the division by it is exact.

FP8_MAX is 448 for float8_e4m3fn (NVIDIA) and 240 for float8_e4m3fnuz (AMD gfx942). MIN_SCALE
(the smallest normal float32) gives an all-zero row a finite, non-zero scale. The division is
IEEE-rounded (``div_rn``), so the arithmetic up to the cast is exactly eager PyTorch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core import Contract, Cost, Op, Sampling, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import fp8
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime import shapes as _shapes
from kernelab.core.runtime.fp8 import FP8_DTYPES, MIN_SCALE
from kernelab.core.runtime.launch import (
    KernelCall,
    LaunchPlan,
    RowConfig,
    cdiv,
    rows,
    shrink_to_fill,
)
from kernelab.core.runtime.triton import next_pow2, use_triton
from kernelab.ops.quant._kernels import (
    AMAX,
    PER_GROUP,
    PER_TENSOR,
    PER_TOKEN,
    STATIC,
    _fp8_quant_kernel,
)

# --- launch heuristics as data ----------------------------------------------------------------

#: Elements per program of the per-tensor tiles: 4096 over 8 warps is 16 per thread, one
#: 128-bit vector of float8 output.
TILE_ELEMENTS = 4096
#: Smallest per-tensor tile when shrinking tiles to fill the GPU at decode.
MIN_TILE = 512
#: Group sizes the per-token-group kernel takes (a group is one power-of-two tile row).
GROUP_SIZES = (16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Fp8QuantConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1

    @staticmethod
    def default_for(
        n_rows: int,
        n_cols: int,
        per_token: bool,
        device: torch.device | None = None,
        group_size: int | None = None,
    ) -> Fp8QuantConfig:
        if group_size is not None:
            # Whole groups per tile, 128-bit accesses at any row count (a single 128-column
            # group over one warp would be 4 values per thread); shrunk to fill at decode, never
            # below one group.
            block_n = max(group_size, min(next_pow2(n_cols), TILE_ELEMENTS))
            block_m = max(1, min(next_pow2(max(1, n_rows)), TILE_ELEMENTS // block_n))
            block_m, block_n = shrink_to_fill(
                (n_rows, n_cols), (block_m, block_n), max(MIN_TILE, group_size), device
            )
            return Fp8QuantConfig(block_m, block_n, max(1, min(8, block_m * block_n // 512)))
        if per_token:
            c = RowConfig.default_for(n_rows, n_cols, device)
            return Fp8QuantConfig(c.block_m, c.block_n, c.num_warps)
        block_n = min(next_pow2(n_cols), TILE_ELEMENTS)
        block_m = max(1, TILE_ELEMENTS // block_n)
        block_m, block_n = shrink_to_fill((n_rows, n_cols), (block_m, block_n), MIN_TILE, device)
        return Fp8QuantConfig(block_m, block_n, max(1, min(8, block_m * block_n // 512)))

    @staticmethod
    def tuning_space(
        n_cols: int, per_token: bool, group_size: int | None = None
    ) -> list[Fp8QuantConfig]:
        if group_size is not None:
            space = [
                Fp8QuantConfig(m, n, w)
                for n in (128, 256, 512, 1024, 2048, 4096)
                if group_size <= n <= max(group_size, next_pow2(n_cols))
                for m in (1, 2, 4, 8, 16)
                for w in (1, 2, 4, 8)
            ]
            return [c for c in space if 8 <= c.block_m * c.block_n // (32 * c.num_warps) <= 64]
        if per_token:
            return [
                Fp8QuantConfig(c.block_m, c.block_n, c.num_warps)
                for c in RowConfig.tuning_space(n_cols)
            ]
        space = [
            Fp8QuantConfig(m, n, w)
            for n in (512, 1024, 2048, 4096)
            if n <= max(512, next_pow2(n_cols))
            for m in (1, 2, 4, 8)
            for w in (1, 2, 4, 8)
        ]
        return [c for c in space if 8 <= c.block_m * c.block_n // (32 * c.num_warps) <= 64]


# --- references and eager ---------------------------------------------------------------------


def _quantize_ref(y, scale, fp8_dtype):
    """Values of y / scale rounded to the float8 grid, in y's dtype (float64 for references).

    torch rounds float64 to float8 through float32; the double rounding is exact here (float32
    carries more than twice float8's 4 significant bits plus two)."""
    fmax = torch.finfo(fp8_dtype).max
    return (y / scale).clamp(-fmax, fmax).to(torch.float32).to(fp8_dtype).to(y.dtype)


def _scale_of(amax, fp8_dtype):
    return (amax / torch.finfo(fp8_dtype).max).clamp_min(MIN_SCALE)


def _grouped(x, group_size):
    """x (..., n) as (..., groups, group_size), the last group padded with zeros (which change
    no group's max and are dropped again by ``_ungrouped``)."""
    n = x.shape[-1]
    groups = -(-n // group_size)
    pad = groups * group_size - n
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], groups, group_size)


def _ungrouped(values, n):
    *lead, groups, size = values.shape
    return values.reshape(*lead, groups * size)[..., :n]


def _group_scales(xg, fp8_dtype, ue8m0):
    """One scale per group of ``xg`` (..., groups, group_size): the float8 rule, then rounded
    up to a power of two with ``ue8m0`` (exact in any binary float: frexp's exponent)."""
    a = xg.abs()
    amax = a.amax(dim=-1) if xg.shape[-1] else a.new_zeros(xg.shape[:-1])
    scale = _scale_of(amax, fp8_dtype)
    if ue8m0:
        mantissa, exponent = torch.frexp(scale)  # scale = mantissa · 2^exponent, 0.5 ≤ m < 1
        up = torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).to(exponent.dtype))
        scale = torch.where(torch.isfinite(scale), up, scale)
    return scale


def fp8_quant_ref(
    x, per_token=False, fp8_dtype=FP8_DTYPES[0], scale=None, group_size=None, ue8m0=False
):
    """(values on the float8 grid in x's dtype, scales) in x's dtype (exact in float64)."""
    if group_size is not None:
        xg = _grouped(x, group_size)
        scales = _group_scales(xg, fp8_dtype, ue8m0)
        values = _quantize_ref(xg, scales[..., None], fp8_dtype)
        return _ungrouped(values, x.shape[-1]), scales
    if scale is None:
        scale = _scale_of(fp8.amax(x, per_token), fp8_dtype)
    return _quantize_ref(x, scale, fp8_dtype), scale


def fp8_quant_torch(
    x, per_token=False, fp8_dtype=FP8_DTYPES[0], scale=None, group_size=None, ue8m0=False
):
    """Eager PyTorch in float32: the same IEEE divisions and rounding as the kernel."""
    _validate_quant(x, per_token, fp8_dtype, scale, group_size, ue8m0)
    xf = x.float()
    fmax = torch.finfo(fp8_dtype).max
    if group_size is not None:
        xg = _grouped(xf, group_size)
        scales = _group_scales(xg, fp8_dtype, ue8m0)
        values = (xg / scales[..., None]).clamp(-fmax, fmax).to(fp8_dtype)
        return _ungrouped(values, x.shape[-1]).contiguous(), scales
    if scale is None:
        scale = _scale_of(fp8.amax(xf, per_token), fp8_dtype)
    values = (xf / scale).clamp(-fmax, fmax).to(fp8_dtype)
    return values, scale.float()


def _validate_quant(x, per_token, fp8_dtype, scale, group_size=None, ue8m0=False):
    _check.tensor("x", x, dtypes=_check.FLOATS, min_ndim=1)
    _check.boolean("per_token", per_token)
    fp8.check_dtype("fp8_dtype", fp8_dtype)
    _check.boolean("ue8m0", ue8m0)
    if group_size is not None:
        _check.integer("group_size", group_size)  # 64.0 is not a group size (it equals 64)
        if group_size not in GROUP_SIZES:
            raise ValueError(
                f"group_size: expected None or one of {GROUP_SIZES}, got {group_size!r}"
            )
        if per_token or scale is not None:
            raise ValueError(
                "group_size: per-token-group scales are dynamic and per group; "
                "give it without per_token=True or a given scale"
            )
    elif ue8m0:
        raise ValueError(
            "ue8m0: power-of-two scales are for per-token-group quantization; give group_size"
        )
    if scale is not None:
        if per_token:
            raise ValueError("scale: a given (static) scale is per tensor; got per_token=True")
        _check.tensor("scale", scale, dtypes=(torch.float32,), device=x.device)
        if scale.numel() != 1:
            raise ValueError(f"scale: expected one element, got shape {tuple(scale.shape)}")
        if x.device.type == "cpu":  # on a device, reading the value back would synchronise
            _check.finite_positive("scale", float(scale))


# --- launchers and public functions -----------------------------------------------------------


def _call(x2, out2, scales, amax, mode, cfg, fp8_dtype, ue8m0=False, group_size=None) -> KernelCall:
    """One launch of ``_fp8_quant_kernel`` (looked up at call time, so tests can replace it):
    ``x2`` into ``out2``, per token over whole rows, else over tiles of the (rows, cols) grid
    (per group: one group of columns per tile, ``scales`` [rows, groups])."""
    n_rows, n_cols = x2.shape
    grid = (cdiv(n_rows, cfg.block_m), 1 if mode == PER_TOKEN else cdiv(n_cols, cfg.block_n))
    return KernelCall(
        _fp8_quant_kernel,
        grid,
        dict(
            Out=out2,
            stride_out=out2.stride(0),
            Scale=scales,
            stride_scale=scales.stride(0) if mode == PER_GROUP else 0,
            X=x2,
            stride_x=x2.stride(0),
            Amax=amax,
            n_rows=n_rows,
            n_cols=n_cols,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            MODE=mode,
            SINGLE_PASS=n_cols <= cfg.block_n,
            FP8_MAX=float(torch.finfo(fp8_dtype).max),
            MIN_SCALE=MIN_SCALE,
            GROUP_SIZE=group_size or 1,
            UE8M0=ue8m0,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )


def _plan(
    x,
    per_token=False,
    fp8_dtype=FP8_DTYPES[0],
    scale=None,
    group_size=None,
    ue8m0=False,
    config=None,
) -> LaunchPlan:
    """The launches for these (validated) arguments: one per token or per token group; per
    tensor, the max into a workspace and then the quantization (or the quantization alone with
    a given scale)."""
    values = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    if group_size is not None:
        groups = cdiv(x.shape[-1], group_size)
        scales = torch.empty((*x.shape[:-1], groups), dtype=torch.float32, device=x.device)
        if x.numel() == 0:
            return LaunchPlan(result=(values, scales))
        x2 = rows(x)
        n_rows, n_cols = x2.shape
        cfg = config or Fp8QuantConfig.default_for(n_rows, n_cols, False, x.device, group_size)
        if cfg.block_n % group_size:
            raise ValueError(
                f"config: block_n must be a multiple of group_size {group_size}, got {cfg.block_n}"
            )
        call = _call(
            x2, values.view(n_rows, n_cols), scales.view(n_rows, groups),
            scales.view(torch.int32), PER_GROUP, cfg, fp8_dtype, ue8m0, group_size,
        )  # fmt: skip
        return LaunchPlan((call,), result=(values, scales))
    if per_token:
        scales = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    elif scale is None:
        scales = torch.empty(1, dtype=torch.float32, device=x.device)
    else:
        scales = scale.reshape(1)
    if x.numel() == 0:
        if scale is None:
            scales.fill_(MIN_SCALE)  # the max of nothing is 0
        return LaunchPlan(result=(values, scales))
    x2 = rows(x)
    n_rows, n_cols = x2.shape
    out2 = values.view(n_rows, n_cols)
    cfg = config or Fp8QuantConfig.default_for(n_rows, n_cols, per_token, x.device)
    if per_token:
        modes, amax = (PER_TOKEN,), scales.view(torch.int32)  # Amax unused
    elif scale is None:
        modes = (AMAX, PER_TENSOR)
        amax = torch.zeros(1, dtype=torch.int32, device=x.device)  # float32 bits, see kernel
    else:
        modes, amax = (STATIC,), scales.view(torch.int32)  # Amax unused
    calls = tuple(_call(x2, out2, scales, amax, mode, cfg, fp8_dtype) for mode in modes)
    return LaunchPlan(calls, result=(values, scales))


def fp8_quant_triton(
    x,
    per_token=False,
    fp8_dtype=FP8_DTYPES[0],
    scale=None,
    group_size=None,
    ue8m0=False,
    config=None,
):
    """Launch the Triton kernel: one launch per token or token group, two (max, then
    quantize) per tensor."""
    _validate_quant(x, per_token, fp8_dtype, scale, group_size, ue8m0)
    return _plan(x, per_token, fp8_dtype, scale, group_size, ue8m0, config).run()


def fp8_quant(
    x: torch.Tensor,
    per_token: bool = False,
    fp8_dtype: torch.dtype = FP8_DTYPES[0],
    scale: torch.Tensor | None = None,
    group_size: int | None = None,
    ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to float8 with dynamic (or a given) scales; returns (values, scales).

    Parameters
    ----------
    x : tensor (..., n) of float32, float16 or bfloat16; any row stride.
    per_token : one scale per row (scales of shape (..., 1)) instead of one for the tensor
        (shape (1,)).
    fp8_dtype : torch.float8_e4m3fn (NVIDIA) or torch.float8_e4m3fnuz (AMD gfx942).
    scale : optional given per-tensor float32 scale (static quantization).
    group_size : one scale per ``group_size`` columns of each row (per token group, e.g. 128
        for block-scaled GEMMs): scales of shape (..., ceil(n / group_size)).
    ue8m0 : with ``group_size``, round each scale up to a power of two.

    ``x ≈ values.float() * scales`` (per group: each group's columns times its scale).
    Triton on CUDA/ROCm; torch on CPU.
    """
    if isinstance(x, torch.Tensor) and use_triton(x):
        return fp8_quant_triton(x, per_token, fp8_dtype, scale, group_size, ue8m0)
    return fp8_quant_torch(x, per_token, fp8_dtype, scale, group_size, ue8m0)


# --- the declarations --------------------------------------------------------------------------


def _quant_representative() -> list[Shape]:
    # The activations entering block-scaled float8 GEMMs, in groups of 128 along K (UE8M0
    # scales on DeepSeek-V3's hidden width, as its Blackwell recipe takes them); then those
    # entering each GEMM: hidden (QKV and gate/up inputs) and intermediate (down-projection
    # input) widths, quantized per token and per tensor.
    return [
        Shape(
            f"{label} {_shapes.phase(tokens)} {tokens}x{k} group 128" + (" ue8m0" if ue8m0 else ""),
            {"rows": tokens, "cols": k},
            {"group_size": 128, "ue8m0": ue8m0},
            batch_dim="rows",
        )
        for k, label in _block_fp8_widths().items()
        for tokens in _shapes.TOKENS
        for ue8m0 in ((False, True) if k == 7168 else (False,))
    ] + [
        Shape(
            f"{'/'.join(models)} {_shapes.phase(tokens)} {tokens}x{width} {kind} "
            + ("per token" if per_token else "per tensor"),
            {"rows": tokens, "cols": width},
            {"per_token": per_token},
            batch_dim="rows",
        )
        for kind, width_of in (("hidden", lambda m: m.hidden), ("inter", lambda m: m.intermediate))
        for width, models in _shapes.by_width(width_of).items()
        for tokens in _shapes.TOKENS
        for per_token in (True, False)
    ]


def _block_fp8_widths() -> dict[int, str]:
    """K of each block-scaled projection → the projections that take it."""
    widths: dict[int, list[str]] = {}
    for label, _, k in _shapes.BLOCK_FP8_PROJECTIONS:
        model, proj = label.split(" ", 1)
        widths.setdefault(k, []).append(f"{model} {proj}")
    return {k: "/".join(v[:2]) for k, v in widths.items()}


def _quant_edge() -> list[Shape]:
    base = _shapes.row_edge(({"per_token": True}, {"per_token": False}))
    extra = [
        Shape("static scale 5x1021", {"rows": 5, "cols": 1021}, {"static": True}, "rows"),
        Shape(
            "e4m3fnuz 7x257 per token",
            {"rows": 7, "cols": 257},
            {"per_token": True, "fp8": "e4m3fnuz"},
            "rows",
        ),
        Shape(
            "e4m3fnuz 3x1000 per tensor",
            {"rows": 3, "cols": 1000},
            {"per_token": False, "fp8": "e4m3fnuz"},
            "rows",
        ),
        Shape("group 128, one row 1x128", {"rows": 1, "cols": 128}, {"group_size": 128}, "rows"),
        Shape(
            "group 128, last group short 7x300",
            {"rows": 7, "cols": 300},
            {"group_size": 128},
            "rows",
        ),
        Shape(
            "group 64 ue8m0, strided rows 33x256",
            {"rows": 33, "cols": 256},
            {"group_size": 64, "ue8m0": True, "row_pad": 64},
            "rows",
        ),
        Shape(
            "group 128 ue8m0 e4m3fnuz 5x1024",
            {"rows": 5, "cols": 1024},
            {"group_size": 128, "ue8m0": True, "fp8": "e4m3fnuz"},
            "rows",
        ),
        Shape("group 128, empty 0x256", {"rows": 0, "cols": 256}, {"group_size": 128}, "rows"),
    ]
    return base + extra


def _quant_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    n_rows, n_cols = shape.dims["rows"], shape.dims["cols"]
    x = _inputs.randn((n_rows, n_cols), dtype, device, gen, dist)
    # Rows of different magnitudes (as activations of different tokens are), so that each row's
    # scale differs from its neighbours'.
    if device.type != "meta" and n_rows:
        spread = _inputs.randn((n_rows, 1), torch.float32, device, gen, "normal", scale=0.5)
        x = (x.float() * spread.exp()).to(dtype)
    pad = shape.params.get("row_pad", 0)
    if pad:
        x = _inputs.strided_rows(x, pad)
    fp8_dtype = fp8.of_shape(shape)
    scale = None
    if shape.params.get("static"):
        amax = x.float().abs().amax() if x.numel() and device.type != "meta" else torch.ones(())
        scale = (amax / torch.finfo(fp8_dtype).max * 1.25).reshape(1).to(device)
    return {
        "x": x,
        "per_token": bool(shape.params.get("per_token", False)),
        "fp8_dtype": fp8_dtype,
        "scale": scale,
        "group_size": shape.params.get("group_size"),
        "ue8m0": bool(shape.params.get("ue8m0", False)),
    }


def _quant_cost(inputs: dict) -> Cost:
    x = inputs["x"]
    n = x.numel()
    n_rows = n // max(1, x.shape[-1])
    if inputs.get("group_size"):
        n_scales = n_rows * cdiv(x.shape[-1], inputs["group_size"])
    else:
        n_scales = n_rows if inputs.get("per_token") else 1
    # Read x once, write one byte per value and the float32 scales (the minimum: the two-launch
    # per-tensor path reads x twice and is measured against this floor).
    return Cost(flops=4 * n, bytes=n * x.element_size() + n + 4 * n_scales)


def _rows_independent(inputs: dict) -> bool:
    """Per token, per group or with a static scale each row is quantized on its own; the
    dynamic per-tensor scale is the amax of the whole tensor."""
    return (
        bool(inputs.get("per_token"))
        or inputs.get("group_size") is not None
        or (inputs.get("scale") is not None)
    )


FP8_QUANT = register(
    Op(
        "fp8_quant",
        description="dynamic per-token, per-token-group or per-tensor (or static) float8 e4m3 "
        "quantization",
        reference=fp8_quant_ref,
        make_inputs=_quant_inputs,
        sampling=Sampling(
            rows={"x": 0, "values": 0, "scales": 0},
            cut={"cols": 128},
            tile={"rows": 32},
            applies=_rows_independent,
        ),
        shapes={"representative": _quant_representative, "edge": _quant_edge},
        cost=_quant_cost,
        # The kernel's arithmetic and cast are eager torch's bit for bit (the tests check both),
        # so its error equals eager's; the floors only matter where eager's error is 0 and are
        # set far below one float8 step (2^-3 relative) in any row, instead of the default 16-bit
        # floors, which a float8 output computed at lower precision could slip under.
        # a static scale is calibrated once: only x is data
        contract=Contract(
            floors={"float32": 1e-6, "float16": 1e-5, "bfloat16": 1e-5}, data_inputs=("x",)
        ),
        outputs=("values", "scales"),
        out_arg=None,
        kernels=(_fp8_quant_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: Fp8QuantConfig.tuning_space(
            shape.dims["cols"], bool(shape.params.get("per_token")), shape.params.get("group_size")
        ),
    )
)
FP8_QUANT.add_variant(
    Variant(
        "kernelab",
        fp8_quant_triton,
        "triton",
        description="Triton; per token or token group in one pass, per tensor as max then quantize",
    )
)
FP8_QUANT.add_torch(fp8_quant_torch)
