"""Dense GEMM with a fused epilogue, as inference linear layers use it.

    C = activation(A·B + bias) + residual        A: [M, K], B: [K, N] or an nn.Linear [N, K]

fp16/bf16 inputs, float32 accumulation, one rounding at the end. Four kernels, in
``_kernels``:

- ``_gemm_kernel``: one output tile per program, tiles in grouped order (L2 reuse); with
  SPLIT_K > 1 each program sums one slice of K into a float32 workspace and
  ``_splitk_reduce_kernel`` adds the slices in a fixed order and applies the epilogue
  (deterministic, no atomics): the small-M path, where M·N alone gives too few tiles.
- ``_gemm_persistent_kernel``: one program per SM walking the tiles in the same order.
- ``_gemm_tma_kernel``: the Hopper path, tiles loaded through TMA descriptors (wgmma on
  sm_90). Used only where the device is sm_90+ and the installed Triton has host-side tensor
  descriptors; this is checked when the op is called, never at import; otherwise the tiled
  kernel runs.

The ladder: kernels → ``gemm_triton`` (validate, allocate, launch) → ``gemm`` (public) with
``gemm_ref`` (float64-exact reference) and ``gemm_torch`` (eager PyTorch) beside it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace

import torch

from kernelab.ops._model import Cost, Launch, Op, Shape, Variant, register
from kernelab.ops._runtime import check as _check
from kernelab.ops._runtime import inputs as _inputs
from kernelab.ops._runtime.triton import num_sms, use_triton
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul._kernels import (
    _gemm_kernel,
    _gemm_persistent_kernel,
    _gemm_tma_kernel,
)

# --- launch heuristics as data ----------------------------------------------------------------

#: Below this M a tile row is mostly padding; split K instead to fill the machine.
SMALL_M = 16
#: Split-K is worth its extra pass only while it at least doubles the tiles in flight, and
#: each slice keeps this many K steps (fewer and the pipeline never fills).
MIN_K_STEPS_PER_SPLIT = 4
MAX_SPLIT_K = 16


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes, grouping, split-K and launch options for one GEMM launch.

    ``kind``: "tiled" (``_gemm_kernel``), "persistent" or "tma".
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    kind: str = "tiled"

    @staticmethod
    def default_for(M: int, N: int, K: int, dtype=torch.bfloat16, device=None) -> GemmConfig:
        """The default for a problem on ``device`` (a torch device or an arch like "sm_90";
        None: a configuration that compiles within every supported target's limits)."""
        arch = gc.arch_of(device)
        sms = num_sms(device if isinstance(device, torch.device) else None)
        if M <= SMALL_M:
            # Decode: a 16-row tile (the smallest tensor-core M) and enough K slices that
            # the N tiles times the slices cover the SMs twice.
            cfg = GemmConfig(16, 64, 128, group_m=1, num_warps=4, num_stages=4)
            split = gc.split_k_for(
                gc.cdiv(N, cfg.block_n),
                gc.cdiv(K, cfg.block_k),
                sms,
                MAX_SPLIT_K,
                MIN_K_STEPS_PER_SPLIT,
            )
            return replace(cfg, split_k=split)
        if M <= 64:
            return GemmConfig(64, 64, 64, group_m=8, num_warps=4, num_stages=4)
        if arch is not None and arch.startswith("gfx"):
            # 64 KB of LDS per CU: two stages of 128x128x32 (32 KB).
            return GemmConfig(128, 128, 32, group_m=8, num_warps=8, num_stages=2)
        if gc.sm_version(arch) >= 90 and tma_available(device):
            return GemmConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=3, kind="tma")
        # 128x128x32 over 8 warps compiles without spills (ptxas -v, triton 3.9); 128x128x64
        # spilled 44 bytes on sm_80. Four stages (64 KB) on NVIDIA; three for an unknown target.
        stages = 4 if arch is not None else 3
        return GemmConfig(128, 128, 32, group_m=8, num_warps=8, num_stages=stages)

    @staticmethod
    def persistent_for(M: int, N: int, K: int, dtype=torch.bfloat16, device=None) -> GemmConfig:
        """The persistent kernel's default: the tiled default's tiles, with these exceptions
        measured with ptxas -v (triton 3.9): on sm_8x a 128x128 tile spilled 288 bytes in the
        tile loop and 128x64 does not; on sm_90 128x128x64 spilled 432 bytes, 128x128x32 with
        four stages does not."""
        base = GemmConfig.default_for(max(M, SMALL_M + 1), N, K, dtype, device)
        cfg = replace(base, kind="persistent", split_k=1)
        if base.kind == "tma":
            cfg = replace(cfg, block_k=32, num_stages=4)
        if 80 <= gc.sm_version(gc.arch_of(device)) < 90:
            cfg = replace(cfg, block_n=64)
        return cfg

    @staticmethod
    def tuning_space(M: int, N: int, K: int, dtype=torch.bfloat16, device=None) -> list:
        space = [
            GemmConfig(bm, bn, bk, 8, sk, w, s, kind)
            for bm in (16, 32, 64, 128)
            for bn in (64, 128, 256)
            for bk in (32, 64, 128)
            for sk in (1, 2, 4, 8)
            for w in (4, 8)
            for s in (2, 3, 4)
            for kind in ("tiled", "persistent", "tma")
        ]
        tma = tma_available(device)

        def keep(c: GemmConfig) -> bool:
            if c.kind == "tma" and not tma:
                return False
            smem = (c.block_m + c.block_n) * c.block_k * 2 * c.num_stages
            if c.split_k > 1 and (c.kind != "tiled" or M > 64 or K // c.split_k < c.block_k):
                return False
            if c.block_m > max(16, 2 * M) or smem > 200 * 1024:
                return False
            acc_per_thread = c.block_m * c.block_n // (32 * c.num_warps)
            return 8 <= acc_per_thread <= 256

        return [c for c in space if keep(c)] or [GemmConfig.default_for(M, N, K, dtype, device)]


def tma_available(device=None) -> bool:
    """Whether the Hopper TMA path can run: an sm_90+ CUDA device, and host-side tensor
    descriptors in the installed Triton (looked up now, not at import)."""
    if gc.sm_version(gc.arch_of(device)) < 90:
        return False
    try:
        module = importlib.import_module("triton.tools.tensor_descriptor")
    except ImportError:
        return False
    return hasattr(module, "TensorDescriptor")


# --- reference, eager, launcher, public function ----------------------------------------------


def _b_as_kn(b: torch.Tensor, b_layout: str) -> torch.Tensor:
    return b if b_layout == "kn" else b.t()


def gemm_ref(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    """Plain PyTorch in the inputs' dtype (exact when given float64)."""
    c = a @ _b_as_kn(b, b_layout)
    if bias is not None:
        c = c + bias
    c = gc.apply_activation(c, activation)
    if residual is not None:
        c = c + residual
    return c if out is None else out.copy_(c)


def gemm_torch(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    """Eager PyTorch as inference code writes it: matmul (+ bias) in the inputs' dtype (cuBLAS
    rounds once), then the activation and the residual add, each rounded."""
    _validate(a, b, bias, residual, activation, b_layout, out)
    bk = _b_as_kn(b, b_layout)
    c = torch.addmm(bias, a, bk) if bias is not None else a @ bk
    c = gc.apply_activation(c, activation)
    if residual is not None:
        c = c + residual
    return c if out is None else out.copy_(c)


FLOATS16 = (torch.float16, torch.bfloat16)


def _validate(a, b, bias, residual, activation, b_layout, out):
    _check.tensor("a", a, dtypes=FLOATS16, ndim=2)
    _check.tensor("b", b, dtypes=(a.dtype,), ndim=2, device=a.device)
    if b_layout not in ("kn", "nk"):
        raise ValueError(f"b_layout: expected 'kn' ([K, N]) or 'nk' ([N, K]), got {b_layout!r}")
    k_b = b.shape[0] if b_layout == "kn" else b.shape[1]
    if k_b != a.shape[1]:
        raise ValueError(
            f"b: expected K = {a.shape[1]} (a's columns) along dimension "
            f"{0 if b_layout == 'kn' else 1} for b_layout={b_layout!r}, got shape {tuple(b.shape)}"
        )
    n = b.shape[1] if b_layout == "kn" else b.shape[0]
    gc.activation_code(activation)
    if bias is not None:
        _check.tensor("bias", bias, dtypes=(a.dtype,), ndim=1, device=a.device)
        _check.same_shape("bias", bias, (n,), "N")
    if residual is not None:
        _check.tensor("residual", residual, dtypes=(a.dtype,), ndim=2, device=a.device)
        _check.same_shape("residual", residual, (a.shape[0], n), "the output's shape")
    if out is not None:
        _check.tensor("out", out, dtypes=(a.dtype,), ndim=2, device=a.device)
        _check.same_shape("out", out, (a.shape[0], n), "(M, N)")
    return n


def gemm_triton(
    a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None, config=None
):
    """Launch the kernel ``config`` names (default: ``GemmConfig.default_for``)."""
    n = _validate(a, b, bias, residual, activation, b_layout, out)
    m, k = a.shape
    c = out if out is not None else torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.copy_(gemm_torch(a, b, bias, residual, activation, b_layout))
    cfg = config or GemmConfig.default_for(m, n, k, a.dtype, a.device)
    bk = _b_as_kn(b, b_layout)
    res = residual if residual is not None else c
    flags = {
        "HAS_BIAS": bias is not None,
        "ACTIVATION": gc.activation_code(activation),
        "HAS_RESIDUAL": residual is not None,
    }
    bias_arg = bias if bias is not None else c
    tiles = gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n)
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    blocks = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k}
    if cfg.kind == "tma" and _tma_ok(a, b, c, cfg):
        from triton.tools.tensor_descriptor import TensorDescriptor

        a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k])
        box = [cfg.block_n, cfg.block_k] if b_layout == "nk" else [cfg.block_k, cfg.block_n]
        b_desc = TensorDescriptor.from_tensor(b, box)
        _gemm_tma_kernel[(tiles,)](
            c, c.stride(0), c.stride(1), a_desc, b_desc, bias_arg, res, res.stride(0),
            res.stride(1), m, n, k, **blocks, GROUP_M=cfg.group_m, B_IS_NK=b_layout == "nk",
            **flags, **opts,
        )  # fmt: skip
        return c
    if cfg.kind == "persistent":
        programs = min(tiles, num_sms(a.device))
        _gemm_persistent_kernel[(programs,)](
            c, c.stride(0), c.stride(1), a, a.stride(0), a.stride(1), bk, bk.stride(0),
            bk.stride(1), bias_arg, res, res.stride(0), res.stride(1), m, n, k, programs,
            **blocks, GROUP_M=cfg.group_m, **flags, **opts,
        )  # fmt: skip
        return c
    k_per_split = gc.cdiv(gc.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = gc.cdiv(k, k_per_split)
    if split == 1:
        target, stride_s = c, 0
    else:
        target = torch.empty((split, m, n), dtype=torch.float32, device=a.device)
        stride_s = target.stride(0)
    _gemm_kernel[(tiles, split)](
        target, stride_s, target.stride(-2), target.stride(-1), a, a.stride(0), a.stride(1),
        bk, bk.stride(0), bk.stride(1), bias_arg, res, res.stride(0), res.stride(1), m, n, k,
        k_per_split, **blocks, GROUP_M=cfg.group_m, SPLIT_K=split,
        **(flags if split == 1 else {"HAS_BIAS": False, "ACTIVATION": 0, "HAS_RESIDUAL": False}),
        **opts,
    )  # fmt: skip
    if split > 1:
        gc.splitk_reduce(c, target, bias=bias, residual=residual, activation=flags["ACTIVATION"])
    return c


def _tma_ok(a, b, c, cfg) -> bool:
    """TMA needs the device and Triton support, unit inner strides and 16-byte aligned rows."""
    if not tma_available(a.device):
        return False
    for t in (a, b):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    return True


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    activation: str = "none",
    b_layout: str = "kn",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """C = activation(A·B + bias) + residual.

    Parameters
    ----------
    a : tensor [M, K] of float16 or bfloat16, any strides.
    b : tensor [K, N] (``b_layout="kn"``) or an nn.Linear weight [N, K] (``b_layout="nk"``),
        same dtype as ``a``.
    bias : optional [N]; residual : optional [M, N]; both in ``a``'s dtype.
    activation : "none", "silu" or "gelu" (exact, erf-based).
    out : optional preallocated [M, N] output.

    Accumulates in float32 and rounds once. On CUDA/ROCm the Triton kernel runs; on CPU the
    torch implementation (or the Triton interpreter with KERNELAB_INTERPRET=1).
    """
    if isinstance(a, torch.Tensor) and use_triton(a):
        return gemm_triton(a, b, bias, residual, activation, b_layout, out)
    return gemm_torch(a, b, bias, residual, activation, b_layout, out)


# --- the declaration ---------------------------------------------------------------------------


def _params_for(proj: str, bias: bool) -> dict:
    # Real layers: nn.Linear weights; the o and down projections feed the residual stream.
    return {"layout": "nk", "residual": proj in ("o", "down")}


def _representative() -> list[Shape]:
    return gc.representative(_params_for)


def _edge() -> list[Shape]:
    cases = [
        ("one row, K below one tile", 1, 33, 17, {}),
        ("primes", 7, 53, 67, {"layout": "nk"}),
        ("M just over a tile", 17, 96, 40, {"bias": True, "activation": "silu"}),
        ("odd everything", 33, 65, 97, {"activation": "gelu", "residual": True}),
        ("non-contiguous a", 5, 48, 80, {"a_pad": 7, "layout": "nk", "bias": True}),
        ("long K, small M (split-K)", 3, 40, 520, {"layout": "nk", "residual": True}),
        ("empty M", 0, 32, 64, {}),
    ]
    return [
        Shape(f"{label} {m}x{n}x{k}", {"M": m, "N": n, "K": k}, params, batch_dim="M")
        for label, m, n, k, params in cases
    ]


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    m, n, k = shape.dims["M"], shape.dims["N"], shape.dims["K"]
    p = shape.params
    a = _inputs.randn((m, k), dtype, device, gen, dist)
    # Weights scaled by 1/sqrt(K), as trained layers are: outputs keep the inputs' magnitude.
    layout = p.get("layout", "kn")
    b = _inputs.randn((k, n) if layout == "kn" else (n, k), dtype, device, gen, "normal")
    b = b / max(1.0, k**0.5)
    bias = _inputs.randn((n,), dtype, device, gen, "normal") if p.get("bias") else None
    res = _inputs.randn((m, n), dtype, device, gen, dist)
    if p.get("a_pad") and device.type != "meta":
        a = _inputs.strided_rows(a, p["a_pad"])
    return {
        "a": a,
        "b": b,
        "bias": bias,
        "residual": res if p.get("residual") else None,
        "activation": p.get("activation", "none"),
        "b_layout": layout,
    }


def _cost(inputs: dict) -> Cost:
    a, b = inputs["a"], inputs["b"]
    m, k = a.shape
    n = b.numel() // k if k else 0
    nbytes = (a.numel() + b.numel() + m * n) * a.element_size()
    flops = 2 * m * n * k
    if inputs.get("bias") is not None:
        nbytes += n * a.element_size()
        flops += m * n
    if inputs.get("residual") is not None:
        nbytes += m * n * a.element_size()
        flops += m * n
    return Cost(flops=flops, bytes=nbytes)


def _launches(shape: Shape, dtype, config: GemmConfig | None = None, device=None):
    m, n, k = shape.dims["M"], shape.dims["N"], shape.dims["K"]
    if m * n * k == 0:
        return []
    cfg = config or GemmConfig.default_for(m, n, k, dtype, device)
    p = shape.params
    t = gc.TL_NAME[dtype]
    nk = p.get("layout", "kn") == "nk"
    lda = k + p.get("a_pad", 0)
    flags = {
        "HAS_BIAS": bool(p.get("bias")),
        "ACTIVATION": gc.ACTIVATIONS[p.get("activation", "none")],
        "HAS_RESIDUAL": bool(p.get("residual")),
    }
    blocks = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k}
    tiles = gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n)
    ints = {
        "stride_cm": n,
        "stride_cn": 1,
        "stride_am": lda,
        "stride_ak": 1,
        "stride_bk": 1 if nk else n,
        "stride_bn": k if nk else 1,
        "stride_rm": n,
        "stride_rn": 1,
        "M": m,
        "N": n,
        "K": k,
    }
    ptrs = {"C": f"*{t}", "A": f"*{t}", "B": f"*{t}", "Bias": f"*{t}", "Res": f"*{t}"}
    if cfg.kind == "tma":
        a_box = f"tensordesc<{t}[{cfg.block_m}, {cfg.block_k}]>"
        b_box = f"[{cfg.block_n}, {cfg.block_k}]" if nk else f"[{cfg.block_k}, {cfg.block_n}]"
        kern, grid = _gemm_tma_kernel, (tiles,)
        const = {**blocks, "GROUP_M": cfg.group_m, "B_IS_NK": nk, **flags}
        ptrs.update({"a_desc": a_box, "b_desc": f"tensordesc<{t}{b_box}>"})
    elif cfg.kind == "persistent":
        programs = min(tiles, num_sms(None))
        kern, grid = _gemm_persistent_kernel, (programs,)
        const = {**blocks, "GROUP_M": cfg.group_m, **flags}
        ints["num_programs"] = programs
    else:
        k_per_split = gc.cdiv(gc.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
        split = gc.cdiv(k, k_per_split)
        kern, grid = _gemm_kernel, (tiles, split)
        const = {**blocks, "GROUP_M": cfg.group_m, "SPLIT_K": split, **flags}
        ints.update({"stride_cs": m * n if split > 1 else 0, "k_per_split": k_per_split})
        if split > 1:
            ptrs["C"] = "*fp32"
            const.update({"HAS_BIAS": False, "ACTIVATION": 0, "HAS_RESIDUAL": False})
    sig = {}
    for name in kern.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = ptrs[name]
        else:
            sig[name] = "i32"
    launches = [
        Launch(
            kern,
            sig,
            const,
            cfg.num_warps,
            cfg.num_stages,
            grid,
            divisible_16=(
                *(p_ for p_, t_ in ptrs.items() if t_.startswith("*")),
                *(k_ for k_, v in ints.items() if v % 16 == 0 and k_ in sig),
            ),
            equal_1=tuple(k_ for k_, v in ints.items() if v == 1 and k_ in sig),
            config=cfg,
        )
    ]
    if cfg.kind == "tiled" and const["SPLIT_K"] > 1:
        launches.append(_reduce_launch(shape, t, const["SPLIT_K"], flags, cfg))
    return launches


def _reduce_launch(shape: Shape, t: str, split: int, flags: dict, cfg) -> Launch:
    m, n = shape.dims["M"], shape.dims["N"]
    bm, bn = gc.REDUCE_BLOCK
    const = {"SPLIT_K": split, "BLOCK_M": bm, "BLOCK_N": bn, "HAS_SCALE": False, **flags}
    return Launch(
        gc._splitk_reduce_kernel,
        gc.reduce_signature(t),
        const,
        4,
        1,
        (gc.cdiv(m, bm), gc.cdiv(n, bn)),
        divisible_16=("C", "Part", "Bias", "Res"),
        config=cfg,
    )


def _tuning_space(shape: Shape, dtype):
    d = shape.dims
    return GemmConfig.tuning_space(d["M"], d["N"], d["K"], dtype)


GEMM = register(
    Op(
        "gemm",
        description="C = act(A·B + bias) + residual; fp16/bf16, fp32 accumulate; B [K,N] or [N,K]",
        reference=gemm_ref,
        make_inputs=_make_inputs,
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        dtypes=FLOATS16,
        kernels=(_gemm_kernel, _gemm_persistent_kernel, _gemm_tma_kernel),
        launches=_launches,
        tuning_space=_tuning_space,
    )
)


def _with_kind(kind: str):
    def call(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
        m, k = a.shape
        n = b.shape[1] if b_layout == "kn" else b.shape[0]
        if kind == "splitk":
            cfg = GemmConfig.default_for(1, n, k, a.dtype, a.device)
            cfg = replace(cfg, split_k=max(2, cfg.split_k))
        else:
            cfg = GemmConfig.persistent_for(m, n, k, a.dtype, a.device)
        return gemm_triton(a, b, bias, residual, activation, b_layout, out, config=cfg)

    call.__name__ = f"gemm_{kind}"
    return call


GEMM.add_variant(
    Variant(
        "kernelab",
        gemm_triton,
        "triton",
        description="default per shape: split-K below M=17, tiled (grouped), TMA on sm_90",
    )
)
GEMM.add_variant(
    Variant("kernelab-persistent", _with_kind("persistent"), "triton", description="persistent")
)
GEMM.add_variant(
    Variant("kernelab-splitk", _with_kind("splitk"), "triton", description="split-K, any M")
)
GEMM.add_torch(gemm_torch)
