"""Weight-only quantized linear layers: int4 (w4a16_gemm) and int8 (w8a16_gemm).

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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kernelab.ops._model import Contract, Cost, Launch, Op, Shape, Variant, register
from kernelab.ops._runtime import check as _check
from kernelab.ops._runtime import inputs as _inputs
from kernelab.ops._runtime.triton import num_sms, use_triton
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul import _packing
from kernelab.ops.matmul._kernels import _wq_gemm_kernel

# --- launch heuristics as data ----------------------------------------------------------------

#: The GEMV-shaped path serves M up to this (one 16-row tensor-core tile).
GEMV_MAX_M = 16
#: Each K slice keeps at least this many K steps, so its loads can be pipelined.
MIN_K_STEPS_PER_SPLIT = 4
MAX_SPLIT_K = 16


@dataclass(frozen=True)
class WQConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

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
            split = gc.split_k_for(
                gc.cdiv(N, cfg.block_n),
                gc.cdiv(K, cfg.block_k),
                sms,
                MAX_SPLIT_K,
                MIN_K_STEPS_PER_SPLIT,
            )
            return replace(cfg, split_k=split)
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


# --- references, eager, launcher --------------------------------------------------------------


def w4a16_ref(x, qweight, scales, zeros, group_size, bias=None, out=None):
    """x @ dequantized W (+ bias), in x's dtype (exact when given float64)."""
    w = _packing.dequantize_int4(qweight, scales, zeros, group_size, x.dtype)
    y = x @ w if bias is None else x @ w + bias
    return y if out is None else out.copy_(y)


def w8a16_ref(x, qweight, scales, bias=None, out=None):
    w = _packing.dequantize_int8(qweight, scales, x.dtype)
    y = x @ w if bias is None else x @ w + bias
    return y if out is None else out.copy_(y)


def w4a16_torch(x, qweight, scales, zeros, group_size, bias=None, out=None):
    """Eager PyTorch: dequantize the weight to x's dtype, then a dense matmul."""
    _validate(x, qweight, scales, zeros, group_size, bias, out, bits=4)
    w = _packing.dequantize_int4(qweight, scales, zeros, group_size, x.dtype)
    y = torch.addmm(bias, x, w) if bias is not None else x @ w
    return y if out is None else out.copy_(y)


def w8a16_torch(x, qweight, scales, bias=None, out=None):
    _validate(x, qweight, scales, None, None, bias, out, bits=8)
    w = _packing.dequantize_int8(qweight, scales, x.dtype)
    y = torch.addmm(bias, x, w) if bias is not None else x @ w
    return y if out is None else out.copy_(y)


def _validate(x, qweight, scales, zeros, group_size, bias, out, bits):
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


def _launch(x, qweight, scales, zeros, group_size, bias, out, bits, config):
    n = _validate(x, qweight, scales, zeros, group_size, bias, out, bits)
    m, k = x.shape
    c = out if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return c
    cfg = config or WQConfig.default_for(m, n, k, x.dtype, x.device, bits)
    if bits == 4 and group_size % cfg.block_k:
        raise ValueError(
            f"config: block_k={cfg.block_k} must divide group_size={group_size} for int4"
        )
    qweight, scales = qweight.contiguous(), scales.contiguous()
    zeros = zeros.contiguous() if zeros is not None else scales
    k_per_split = gc.cdiv(gc.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = gc.cdiv(k, k_per_split)
    target = c if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n), split)
    _wq_gemm_kernel[grid](
        target, target.stride(0) if split > 1 else 0, target.stride(-2), target.stride(-1),
        x, x.stride(0), x.stride(1), qweight, qweight.stride(0), qweight.stride(1),
        scales, scales.stride(0) if bits == 4 else 0, zeros, zeros.stride(0) if bits == 4 else 0,
        bias if bias is not None else c, m, n, k, k_per_split,
        BITS=bits, GROUP_SIZE=group_size if bits == 4 else 1, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SPLIT_K=split,
        HAS_BIAS=bias is not None and split == 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split > 1:
        gc.splitk_reduce(c, target, scale=scales if bits == 8 else None, bias=bias)
    return c


def w4a16_triton(x, qweight, scales, zeros, group_size, bias=None, out=None, config=None):
    return _launch(x, qweight, scales, zeros, group_size, bias, out, 4, config)


def w8a16_triton(x, qweight, scales, bias=None, out=None, config=None):
    return _launch(x, qweight, scales, None, None, bias, out, 8, config)


def w4a16_gemm(x, qweight, scales, zeros, group_size, bias=None, out=None):
    """x [M, K] @ int4 weight (kernelab layout, see ``_packing``) (+ bias) → [M, N] in x's
    dtype. Triton on CUDA/ROCm; torch on CPU (interpreter with KERNELAB_INTERPRET=1)."""
    if isinstance(x, torch.Tensor) and use_triton(x):
        return w4a16_triton(x, qweight, scales, zeros, group_size, bias, out)
    return w4a16_torch(x, qweight, scales, zeros, group_size, bias, out)


def w8a16_gemm(x, qweight, scales, bias=None, out=None):
    """x [M, K] @ int8 weight [K, N] with per-column ``scales`` (+ bias) → [M, N]."""
    if isinstance(x, torch.Tensor) and use_triton(x):
        return w8a16_triton(x, qweight, scales, bias, out)
    return w8a16_torch(x, qweight, scales, bias, out)


# --- the declarations -------------------------------------------------------------------------
#
# Contract: the default (2x eager torch's error, per-dtype floor). The reference is computed
# from the very quantized weight the kernel reads, so quantization error is not compared.


def _representative() -> list[Shape]:
    return gc.representative(lambda proj, bias: {"group_size": 128})


def _edge(bits: int = 4) -> list[Shape]:
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


def _weight(shape, device, gen):
    k, n = shape.dims["K"], shape.dims["N"]
    return _inputs.randn((k, n), torch.float32, device, gen, "normal") / max(1.0, k**0.5)


def _x_and_bias(shape, dtype, device, gen, dist):
    m, k, n = shape.dims["M"], shape.dims["K"], shape.dims["N"]
    x = _inputs.randn((m, k), dtype, device, gen, dist)
    if shape.params.get("x_pad") and device.type != "meta":
        x = _inputs.strided_rows(x, shape.params["x_pad"])
    bias = _inputs.randn((n,), dtype, device, gen, "normal") if shape.params.get("bias") else None
    return x, bias


def _w4_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    g = shape.params.get("group_size", 128)
    if device.type == "meta":
        k, n = shape.dims["K"], shape.dims["N"]
        meta = {"dtype": torch.uint8, "device": device}
        w = _packing.Int4Weight(
            torch.empty((k // 2, n), **meta),
            torch.empty((k // g, n), dtype=dtype, device=device),
            torch.empty((k // g, n), **meta),
            g,
        )
    else:
        w = _packing.quantize_int4(_weight(shape, device, gen), g, dtype)
    x, bias = _x_and_bias(shape, dtype, device, gen, dist)
    return {"x": x, "qweight": w.qweight, "scales": w.scales, "zeros": w.zeros,
            "group_size": g, "bias": bias}  # fmt: skip


def _w8_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    k, n = shape.dims["K"], shape.dims["N"]
    if device.type == "meta":
        q = torch.empty((k, n), dtype=torch.int8, device=device)
        s = torch.empty((n,), dtype=dtype, device=device)
    else:
        q, s = _packing.quantize_int8(_weight(shape, device, gen), dtype)
    x, bias = _x_and_bias(shape, dtype, device, gen, dist)
    return {"x": x, "qweight": q, "scales": s, "bias": bias}


def _cost(inputs: dict) -> Cost:
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


def _launches_for(bits: int):
    def launches(shape: Shape, dtype, config: WQConfig | None = None, device=None):
        m, n, k = shape.dims["M"], shape.dims["N"], shape.dims["K"]
        if m * n * k == 0:
            return []
        cfg = config or WQConfig.default_for(m, n, k, dtype, device, bits)
        t = gc.TL_NAME[dtype]
        k_per_split = gc.cdiv(gc.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
        split = gc.cdiv(k, k_per_split)
        has_bias = bool(shape.params.get("bias"))
        const = {
            "BITS": bits,
            "GROUP_SIZE": shape.params.get("group_size", 128) if bits == 4 else 1,
            "BLOCK_M": cfg.block_m,
            "BLOCK_N": cfg.block_n,
            "BLOCK_K": cfg.block_k,
            "GROUP_M": cfg.group_m,
            "SPLIT_K": split,
            "HAS_BIAS": has_bias and split == 1,
        }
        ptrs = {
            "C": "*fp32" if split > 1 else f"*{t}",
            "X": f"*{t}",
            "Q": "*u8" if bits == 4 else "*i8",
            "S": f"*{t}",
            "Z": "*u8" if bits == 4 else f"*{t}",
            "Bias": f"*{t}",
        }
        ints = {
            "stride_cs": m * n if split > 1 else 0,
            "stride_cm": n,
            "stride_cn": 1,
            "stride_xm": k + shape.params.get("x_pad", 0),
            "stride_xk": 1,
            "stride_qk": n,
            "stride_qn": 1,
            "stride_sk": n if bits == 4 else 0,
            "stride_zk": n if bits == 4 else 0,
            "M": m,
            "N": n,
            "K": k,
            "k_per_split": k_per_split,
        }
        kern = _wq_gemm_kernel
        sig = {a: "constexpr" if a in const else ptrs.get(a, "i32") for a in kern.arg_names}
        out = [
            Launch(
                kern,
                sig,
                const,
                cfg.num_warps,
                cfg.num_stages,
                (gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n), split),
                divisible_16=(*ptrs, *(a for a, v in ints.items() if v % 16 == 0)),
                equal_1=tuple(a for a, v in ints.items() if v == 1),
                config=cfg,
            )
        ]
        if split > 1:
            bm, bn = gc.REDUCE_BLOCK
            rconst = {"SPLIT_K": split, "BLOCK_M": bm, "BLOCK_N": bn, "HAS_SCALE": bits == 8,
                      "HAS_BIAS": has_bias, "ACTIVATION": 0, "HAS_RESIDUAL": False}  # fmt: skip
            rsig = gc.reduce_signature(t, t)
            out.append(
                Launch(gc._splitk_reduce_kernel, rsig, rconst, 4, 1,
                       (gc.cdiv(m, bm), gc.cdiv(n, bn)),
                       divisible_16=("C", "Part", "Scale", "Bias", "Res"), config=cfg)
            )  # fmt: skip
        return out

    return launches


def _space_for(bits: int):
    def space(shape: Shape, dtype):
        d = shape.dims
        return WQConfig.tuning_space(d["M"], d["N"], d["K"], dtype, None, bits)

    return space


_DTYPES = (torch.float16, torch.bfloat16)

W4A16_GEMM = register(
    Op(
        "w4a16_gemm",
        description="x·W (+bias), W int4 two per byte with group-wise scales and zero points",
        reference=w4a16_ref,
        make_inputs=_w4_inputs,
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        # NaN and Inf go into the activations; scales and zero points are prepared data.
        contract=Contract(special_inputs=("x",)),
        dtypes=_DTYPES,
        kernels=(_wq_gemm_kernel,),
        launches=_launches_for(4),
        tuning_space=_space_for(4),
    )
)
W4A16_GEMM.add_variant(
    Variant(
        "kernelab",
        w4a16_triton,
        "triton",
        description="GEMV-shaped split-K path for M<=16, tiled above",
    )
)
W4A16_GEMM.add_torch(w4a16_torch)

W8A16_GEMM = register(
    Op(
        "w8a16_gemm",
        description="x·W (+bias), W int8 with per-output-channel scales",
        reference=w8a16_ref,
        make_inputs=_w8_inputs,
        shapes={
            "representative": lambda: gc.representative(),
            "edge": lambda: _edge(8),
        },
        cost=_cost,
        # NaN and Inf go into the activations; scales and zero points are prepared data.
        contract=Contract(special_inputs=("x",)),
        dtypes=_DTYPES,
        kernels=(_wq_gemm_kernel,),
        launches=_launches_for(8),
        tuning_space=_space_for(8),
    )
)
W8A16_GEMM.add_variant(
    Variant(
        "kernelab",
        w8a16_triton,
        "triton",
        description="GEMV-shaped split-K path for M<=16, tiled above",
    )
)
W8A16_GEMM.add_torch(w8a16_torch)
