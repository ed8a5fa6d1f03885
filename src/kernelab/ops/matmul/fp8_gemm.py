"""FP8 GEMM with scales: e4m3 inputs, float32 accumulation, bfloat16 output.

    out = (a · b) ⊙ (scale_a ⊗ scale_b) (+ bias)        a: [M, K] e4m3, b: [N, K] or [K, N] e4m3

``scale_a`` is one value (per-tensor) or one per row of ``a`` (per-token activations);
``scale_b`` is one value or one per output column (per-channel weights). Because each scale is
constant along K, it multiplies the float32 sum once per output element. The e4m3 flavour is
the device's: ``float8_e4m3fn`` on NVIDIA sm_89+ (and the interpreter), ``float8_e4m3fnuz``
on AMD gfx942. ``quantize_fp8`` makes inputs from 16-bit tensors.

The ladder: ``_fp8_gemm_kernel`` → ``fp8_gemm_triton`` → ``fp8_gemm``; ``fp8_gemm_ref``
(float64 on the dequantized inputs) and ``fp8_gemm_torch`` (eager: dequantize to float32,
matmul, round to bfloat16) beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.core import Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul import _packing
from kernelab.ops.matmul._kernels import _fp8_gemm_kernel

E4M3 = tuple(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, name)
)


# --- launch heuristics as data ----------------------------------------------------------------


@dataclass(frozen=True)
class Fp8Config:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    @staticmethod
    def default_for(M: int, N: int, K: int, dtype=torch.bfloat16, device=None) -> Fp8Config:
        arch = gc.arch_of(device)
        if M <= 16:
            return Fp8Config(16, 64, 128, 1, 4, 4)
        if M <= 64:
            return Fp8Config(64, 64, 128, 8, 4, 3)
        # Spill-free choices (ptxas -v and AMD code-object metadata, triton 3.9): block_k 128
        # spilled 428 bytes on sm_90 and 87 on gfx942; gfx942 still spilled 7 at block_k 64.
        if arch is not None and arch.startswith("gfx"):
            return Fp8Config(128, 128, 32, 8, 8, 2)
        return Fp8Config(128, 128, 64, 8, 8, 3 if gc.sm_version(arch) >= 90 else 2)

    @staticmethod
    def tuning_space(M: int, N: int, K: int, dtype=torch.bfloat16, device=None) -> list:
        space = [
            Fp8Config(bm, bn, bk, 8, w, s)
            for bm in (16, 32, 64, 128)
            for bn in (64, 128, 256)
            for bk in (64, 128, 256)
            for w in (4, 8)
            for s in (2, 3, 4)
        ]

        def keep(c: Fp8Config) -> bool:
            smem = (c.block_m + c.block_n) * c.block_k * c.num_stages
            per_thread = c.block_m * c.block_n // (32 * c.num_warps)
            return c.block_m <= max(16, 2 * M) and smem <= 200 * 1024 and 8 <= per_thread <= 256

        return [c for c in space if keep(c)] or [Fp8Config.default_for(M, N, K, dtype, device)]


# --- quantization, reference, eager, launcher -------------------------------------------------


def quantize_fp8(x: torch.Tensor, per_row: bool = True, dtype: torch.dtype | None = None):
    """e4m3 values and float32 scales of a 2-D tensor: one scale per row (``per_row``) or one
    for the tensor, each the row's (tensor's) absolute maximum over the format's largest value.
    Returns (values, scales) with ``x ≈ values · scales[:, None]``; scales are [rows] or [1].
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 2:
        raise TypeError(f"x: expected a 2-D float tensor, got {type(x).__name__}")
    dtype = dtype or E4M3[0]
    if dtype not in E4M3:
        raise TypeError(f"dtype: expected one of {E4M3}, got {dtype}")
    top = torch.finfo(dtype).max
    xf = x.to(torch.float32)
    amax = xf.abs().amax(dim=1) if per_row else xf.abs().amax().reshape(1)
    scale = (amax / top).clamp_min(1e-12)
    values = (xf / (scale[:, None] if per_row else scale)).clamp(-top, top).to(dtype)
    return values, scale


def _b_as_kn(b, b_layout):
    return b.t() if b_layout == "nk" else b


def fp8_gemm_ref(a, b, scale_a, scale_b, bias=None, b_layout="nk", out=None, check=True):
    """(a·scale_a) @ (b·scale_b) (+ bias) in the inputs' dtype (exact in float64)."""
    a_deq = a * scale_a[:, None] if scale_a.numel() > 1 else a * scale_a
    bk = _b_as_kn(b, b_layout)
    b_deq = bk * scale_b[None, :] if scale_b.numel() > 1 else bk * scale_b
    y = a_deq @ b_deq
    if bias is not None:
        y = y + bias
    return y if out is None else out.copy_(y)


def fp8_gemm_torch(a, b, scale_a, scale_b, bias=None, b_layout="nk", out=None, check=True):
    """Eager PyTorch: dequantize to float32, matmul, add the bias, round to bfloat16."""
    _validate(a, b, scale_a, scale_b, bias, b_layout, out, check)
    f32 = {k: v.to(torch.float32) for k, v in (("a", a), ("b", b))}
    bias32 = bias.to(torch.float32) if bias is not None else None
    y = fp8_gemm_ref(f32["a"], f32["b"], scale_a.float(), scale_b.float(), bias32, b_layout)
    y = y.to(torch.bfloat16)
    return y if out is None else out.copy_(y)


def _validate(a, b, scale_a, scale_b, bias, b_layout, out, check=True):
    """Shapes and dtypes from metadata; with ``check`` (a device sync), the scales' values."""
    _check.tensor("a", a, dtypes=E4M3, ndim=2)
    _check.tensor("b", b, dtypes=(a.dtype,), ndim=2, device=a.device)
    if b_layout not in ("kn", "nk"):
        raise ValueError(f"b_layout: expected 'kn' ([K, N]) or 'nk' ([N, K]), got {b_layout!r}")
    m, k = a.shape
    kb, n = (b.shape[1], b.shape[0]) if b_layout == "nk" else tuple(b.shape)
    if kb != k:
        raise ValueError(f"b: expected K = {k} for b_layout={b_layout!r}, got {tuple(b.shape)}")
    _check.tensor("scale_a", scale_a, dtypes=(torch.float32,), ndim=1, device=a.device)
    if scale_a.numel() not in (1, m):
        raise ValueError(f"scale_a: expected 1 or M = {m} values, got {scale_a.numel()}")
    _check.tensor("scale_b", scale_b, dtypes=(torch.float32,), ndim=1, device=a.device)
    if scale_b.numel() not in (1, n):
        raise ValueError(f"scale_b: expected 1 or N = {n} values, got {scale_b.numel()}")
    if bias is not None:
        _check.tensor("bias", bias, dtypes=(torch.bfloat16,), ndim=1, device=a.device)
        _check.same_shape("bias", bias, (n,), "N")
    if out is not None:
        _check.tensor("out", out, dtypes=(torch.bfloat16,), ndim=2, device=a.device)
        _check.same_shape("out", out, (m, n), "(M, N)")
    _check.boolean("check", check)
    if check:
        _packing.check_scales("scale_a", scale_a)
        _packing.check_scales("scale_b", scale_b)
    return n


def e4m3_for(device) -> torch.dtype:
    """The e4m3 flavour a device multiplies: fnuz on gfx942, the OCP format elsewhere."""
    arch = gc.arch_of(device) or ""
    return torch.float8_e4m3fnuz if arch.startswith("gfx942") else E4M3[0]


def fp8_supported(device) -> bool:
    """fp8 tensor cores: NVIDIA sm_89 and newer, AMD gfx942/gfx950; the CPU interpreter."""
    if str(device) == "cpu":
        return True
    arch = gc.arch_of(device) or ""
    return gc.sm_version(arch) >= 89 or arch.startswith(("gfx942", "gfx950"))


def fp8_gemm_triton(
    a, b, scale_a, scale_b, bias=None, b_layout="nk", out=None, check=True, config=None
):
    _validate(a, b, scale_a, scale_b, bias, b_layout, out, check)
    if not fp8_supported(a.device):
        raise ValueError(
            f"a: fp8 GEMM needs an sm_89+ or gfx942 device, got {gc.arch_of(a.device)}"
        )
    return _plan(a, b, scale_a, scale_b, bias, b_layout, out, config).run()


def _plan(a, b, scale_a, scale_b, bias=None, b_layout="nk", out=None, config=None):
    """The launch of ``_fp8_gemm_kernel`` for these (validated) arguments; nothing for an
    empty output."""
    m, k = a.shape
    n = b.shape[0] if b_layout == "nk" else b.shape[1]
    c = out if out is not None else torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return LaunchPlan(result=c)
    cfg = config or Fp8Config.default_for(m, n, k, torch.bfloat16, a.device)
    bk = _b_as_kn(b, b_layout)
    scale_a, scale_b, bias = gc.dense(scale_a), gc.dense(scale_b), gc.dense(bias)
    call = KernelCall(
        _fp8_gemm_kernel,
        (gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n),),
        dict(
            **gc.operand_args(c, a, bk),
            SA=scale_a,
            SB=scale_b,
            Bias=bias if bias is not None else c,
            **gc.tile_args(cfg),
            ROW_SCALE_A=scale_a.numel() > 1,
            COL_SCALE_B=scale_b.numel() > 1,
            HAS_BIAS=bias is not None,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    return LaunchPlan((call,), c)


def fp8_gemm(a, b, scale_a, scale_b, bias=None, b_layout="nk", out=None, check=True):
    """bfloat16 [M, N] = (a·scale_a) @ (b·scale_b) (+ bias); see the module docstring.

    a : e4m3 [M, K]; b : e4m3 weight [N, K] (``b_layout="nk"``) or [K, N] ("kn").
    scale_a : float32 [1] or [M]; scale_b : float32 [1] or [N]; bias : bfloat16 [N].
    check : read the scales on the host, each finite and positive (a device sync; off for
        scales known good, e.g. from ``quantize_fp8``, and inside a CUDA graph).
    """
    if isinstance(a, torch.Tensor) and use_triton(a):
        return fp8_gemm_triton(a, b, scale_a, scale_b, bias, b_layout, out, check)
    return fp8_gemm_torch(a, b, scale_a, scale_b, bias, b_layout, out, check)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    return gc.representative(lambda proj, bias: {"scaling": "row"})


def _edge() -> list[Shape]:
    cases = [
        ("one row, per-tensor", 1, 33, 48, {"scaling": "tensor"}),
        ("primes, per-row", 7, 53, 67, {"scaling": "row", "bias": True}),
        ("odd M and N, per-tensor, [K, N]", 33, 70, 96, {"scaling": "tensor", "layout": "kn"}),
        ("M past one tile, per-row", 70, 40, 160, {"scaling": "row"}),
        ("empty M", 0, 16, 32, {"scaling": "row"}),
        # a square weight in each layout (see gemm's edge shapes: b_layout must be honoured)
        ("square weight [N, K], per-row", 9, 64, 64, {"scaling": "row", "layout": "nk"}),
        ("square weight [K, N], per-tensor", 9, 64, 64, {"scaling": "tensor", "layout": "kn"}),
    ]
    return [
        Shape(f"{label} {m}x{n}x{k}", {"M": m, "N": n, "K": k}, p, batch_dim="M")
        for label, m, n, k, p in cases
    ]


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    m, n, k = shape.dims["M"], shape.dims["N"], shape.dims["K"]
    p = shape.params
    per_row = p.get("scaling", "row") == "row"
    layout = p.get("layout", "nk")
    fp8 = e4m3_for(device)
    if device.type == "meta":
        a = torch.empty((m, k), dtype=fp8, device=device)
        b = torch.empty((n, k) if layout == "nk" else (k, n), dtype=fp8, device=device)
        sa = torch.empty((m if per_row and m else 1,), device=device)  # as drawn below
        sb = torch.empty((n if per_row else 1,), device=device)
    else:
        x = _inputs.randn((m, k), torch.float32, device, gen, dist)
        w = _inputs.randn((n, k), torch.float32, device, gen, "normal") / max(1.0, k**0.5)
        a, sa = quantize_fp8(x, per_row) if m else (x.to(fp8), torch.ones(1, device=device))
        b, sb = quantize_fp8(w, per_row)
        if layout == "kn":
            b = b.t().contiguous()
    bias = _inputs.randn((n,), torch.bfloat16, device, gen, "normal") if p.get("bias") else None
    return {"a": a, "b": b, "scale_a": sa, "scale_b": sb, "bias": bias, "b_layout": layout}


def _cost(inputs: dict) -> Cost:
    a, b = inputs["a"], inputs["b"]
    m, k = a.shape
    n = b.numel() // k if k else 0
    nbytes = a.numel() + b.numel() + 2 * m * n + 4 * (inputs["scale_a"].numel() +
                                                      inputs["scale_b"].numel())  # fmt: skip
    if inputs.get("bias") is not None:
        nbytes += 2 * n
    return Cost(flops=2 * m * n * k, bytes=nbytes, compute="float8_e4m3fn")


FP8_GEMM = register(
    Op(
        "fp8_gemm",
        description="e4m3 GEMM with per-tensor or per-row/per-column scales, bf16 output",
        reference=fp8_gemm_ref,
        make_inputs=_make_inputs,
        sampling=gc.gemm_sampling(
            rows={"a": 0, "scale_a": 0}, cols={"b": gc.b_cols, "scale_b": 0, "bias": 0}
        ),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # the e4m3 weight and the scales are prepared together: only a and the bias are data
        contract=Contract(reduction=gc.reduction_of("a"), data_inputs=("a", "bias")),
        dtypes=(torch.bfloat16,),
        kernels=(_fp8_gemm_kernel,),
        plan=_plan,
        tuning_space=gc.mnk_space(Fp8Config),
    )
)
FP8_GEMM.add_variant(
    Variant(
        "kernelab",
        fp8_gemm_triton,
        "triton",
        description="tiled, scales applied to the float32 sum (sm_89+, gfx942)",
    )
)
FP8_GEMM.add_torch(fp8_gemm_torch)
