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

The ladder: kernels → ``gemm_triton`` (validate, then run ``_plan``) → ``gemm`` (public) with
``gemm_ref`` (float64-exact reference) and ``gemm_torch`` (eager PyTorch) beside it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace

import torch

from kernelab.core import Contract, Cost, Op, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime.launch import KernelCall, LaunchPlan
from kernelab.core.runtime.triton import num_sms, use_triton
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
class GemmConfig(gc.TileConfig):
    """Tile sizes, grouping, split-K and launch options for one GEMM launch.

    ``kind``: "tiled" (``_gemm_kernel``), "persistent" or "tma".
    """

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
            return gc.with_split_k(cfg, N, K, sms, MAX_SPLIT_K, MIN_K_STEPS_PER_SPLIT)
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
    return _tensor_descriptor() is not None


def _tensor_descriptor():
    """Triton's host-side ``TensorDescriptor`` class, or None when this Triton has none."""
    try:
        module = importlib.import_module("triton.tools.tensor_descriptor")
    except ImportError:
        return None
    return getattr(module, "TensorDescriptor", None)


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
    _validate(a, b, bias, residual, activation, b_layout, out)
    if a.shape[1] == 0:  # an empty sum: no kernel, the epilogue of zeros in torch
        c = gemm_torch(a, b, bias, residual, activation, b_layout)
        return c if out is None else out.copy_(c)
    return _plan(a, b, bias, residual, activation, b_layout, out, config).run()


def _plan(
    a,
    b,
    bias=None,
    residual=None,
    activation="none",
    b_layout="kn",
    out=None,
    config=None,
    target=None,
):
    """The launches of ``gemm_triton`` for these (validated) arguments: the kernel ``config``
    names (default: ``GemmConfig.default_for`` the inputs' device, or ``target``: "sm_90"
    describes the TMA launch Hopper runs), and for split-K the reduction after it. Nothing is
    launched for an empty output, nor for K = 0 (``gemm_triton`` computes that in torch)."""
    m, k = a.shape
    n = b.shape[1] if b_layout == "kn" else b.shape[0]
    c = out if out is not None else torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0 or k == 0:
        return LaunchPlan(result=c)
    cfg = config or GemmConfig.default_for(m, n, k, a.dtype, target or a.device)
    act = gc.activation_code(activation)
    bias = gc.dense(bias)
    if cfg.kind == "tma" and _tma_ok(a, b):
        return LaunchPlan((_tma_call(c, a, b, bias, residual, act, b_layout, cfg),), c)
    bk = _b_as_kn(b, b_layout)
    if cfg.kind == "persistent":
        return LaunchPlan((_persistent_call(c, a, bk, bias, residual, act, cfg),), c)
    k_per_split, split = gc.k_slices(k, cfg.split_k, cfg.block_k)
    if split == 1:
        return LaunchPlan((_tiled_call(c, c, a, bk, bias, residual, act, k_per_split, cfg),), c)
    # Each slice into a float32 workspace, no epilogue; the reduction adds them in order.
    part = torch.empty((split, m, n), dtype=torch.float32, device=a.device)
    calls = (
        _tiled_call(part, c, a, bk, bias, residual, act, k_per_split, cfg),
        gc.reduce_call(c, part, bias=bias, residual=residual, activation=act, config=cfg),
    )
    return LaunchPlan(calls, c)


def _tiles(m: int, n: int, cfg: GemmConfig) -> int:
    return gc.cdiv(m, cfg.block_m) * gc.cdiv(n, cfg.block_n)


def _epilogue_args(c, bias, residual, activation) -> dict:
    """The epilogue's arguments: the unused pointers stand in as ``c``."""
    res = residual if residual is not None else c
    return dict(
        Bias=bias if bias is not None else c,
        Res=res,
        stride_rm=res.stride(0),
        stride_rn=res.stride(1),
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        HAS_RESIDUAL=residual is not None,
    )


def _tiled_call(target, c, a, bk, bias, residual, activation, k_per_split, cfg) -> KernelCall:
    """``_gemm_kernel`` into ``target``: ``c`` itself, or the float32 workspace [S, M, N] of
    S K slices (then the epilogue is left to the reduction)."""
    m, n = a.shape[0], c.shape[1]
    split = target.shape[0] if target.dim() == 3 else 1
    epilogue = _epilogue_args(c, bias, residual, activation)
    if split > 1:
        epilogue.update(HAS_BIAS=False, ACTIVATION=0, HAS_RESIDUAL=False)
    return KernelCall(
        _gemm_kernel,
        (_tiles(m, n, cfg), split),
        dict(
            **gc.operand_args(target, a, bk),
            stride_cs=target.stride(0) if split > 1 else 0,
            k_per_split=k_per_split,
            **gc.tile_args(cfg),
            SPLIT_K=split,
            **epilogue,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )


def _persistent_call(c, a, bk, bias, residual, activation, cfg) -> KernelCall:
    """``_gemm_persistent_kernel``: one program per SM (fewer when there are fewer tiles)."""
    m, n = a.shape[0], c.shape[1]
    programs = min(_tiles(m, n, cfg), num_sms(a.device))
    return KernelCall(
        _gemm_persistent_kernel,
        (programs,),
        dict(
            **gc.operand_args(c, a, bk),
            num_programs=programs,
            **gc.tile_args(cfg),
            **_epilogue_args(c, bias, residual, activation),
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )


def _tma_call(c, a, b, bias, residual, activation, b_layout, cfg) -> KernelCall:
    """``_gemm_tma_kernel``: A in [BLOCK_M, BLOCK_K] boxes, B as given ([N, K] boxes of
    [BLOCK_N, BLOCK_K], or [K, N] boxes of [BLOCK_K, BLOCK_N])."""
    descriptor = _tensor_descriptor()
    m, k = a.shape
    n = c.shape[1]
    box = [cfg.block_n, cfg.block_k] if b_layout == "nk" else [cfg.block_k, cfg.block_n]
    return KernelCall(
        _gemm_tma_kernel,
        (_tiles(m, n, cfg),),
        dict(
            C=c,
            stride_cm=c.stride(0),
            stride_cn=c.stride(1),
            a_desc=descriptor.from_tensor(a, [cfg.block_m, cfg.block_k]),
            b_desc=descriptor.from_tensor(b, box),
            M=m,
            N=n,
            K=k,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            B_IS_NK=b_layout == "nk",
            **_epilogue_args(c, bias, residual, activation),
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )


def _tma_ok(a, b) -> bool:
    """TMA needs the device and Triton support, unit inner strides and 16-byte aligned rows.
    Meta tensors (static analysis) stand for whichever device a "tma" config was chosen for:
    only the installed Triton and the layouts are checked."""
    if a.device.type == "meta":
        if _tensor_descriptor() is None:
            return False
    elif not tma_available(a.device):
        return False
    for t in (a, b):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    return True


def _pallas_plan(
    a,
    b,
    bias=None,
    residual=None,
    activation="none",
    b_layout="kn",
    out=None,
    config=None,
    target=None,
):
    """The Pallas launch for these (validated) arguments (``matmul/_pallas.py``)."""
    from kernelab.ops.matmul import _pallas

    return _pallas.gemm_plan(a, b, bias, residual, activation, b_layout, out, config, target)


def gemm_pallas(
    a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None, config=None
):
    """The Pallas kernel: natively on a TPU, through the TPU interpreter on CPU tensors."""
    _validate(a, b, bias, residual, activation, b_layout, out)
    return _pallas_plan(a, b, bias, residual, activation, b_layout, out, config).run()


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
        # a square weight in each layout: a kernel guessing the layout from b's shape (rather
        # than honouring b_layout) computes a @ b where a @ bᵀ was asked, or the reverse
        ("square weight [N, K]", 9, 48, 48, {"layout": "nk"}),
        ("square weight [K, N]", 9, 48, 48, {"layout": "kn"}),
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
    if p.get("a_pad"):
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


GEMM = register(
    Op(
        "gemm",
        description="C = act(A·B + bias) + residual; fp16/bf16, fp32 accumulate; B [K,N] or [N,K]",
        reference=gemm_ref,
        make_inputs=_make_inputs,
        sampling=gc.gemm_sampling(
            rows={"a": 0, "residual": 0}, cols={"b": gc.b_cols, "bias": 0, "residual": 1}
        ),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        contract=Contract(reduction=gc.reduction_of("a")),
        dtypes=FLOATS16,
        kernels=(_gemm_kernel, _gemm_persistent_kernel, _gemm_tma_kernel),
        plan=_plan,
        tuning_space=gc.mnk_space(GemmConfig),
    )
)


def _configure(kind: str):
    """The config the ``kernelab-<kind>`` variant runs ``inputs`` with on ``target``."""

    def configure(inputs: dict, target=None) -> GemmConfig:
        a, b, layout = inputs["a"], inputs["b"], inputs.get("b_layout", "kn")
        m, k = a.shape
        n = b.shape[1] if layout == "kn" else b.shape[0]
        where = target or a.device
        if kind == "splitk":
            cfg = GemmConfig.default_for(1, n, k, a.dtype, where)
            return replace(cfg, split_k=max(2, cfg.split_k))
        return GemmConfig.persistent_for(m, n, k, a.dtype, where)

    return configure


def _with_kind(kind: str):
    configure = _configure(kind)

    def call(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
        cfg = configure({"a": a, "b": b, "b_layout": b_layout})
        return gemm_triton(a, b, bias, residual, activation, b_layout, out, config=cfg)

    call.__name__ = f"gemm_{kind}"
    return call


GEMM.add_variant(
    Variant(
        "pallas",
        gemm_pallas,
        "pallas",
        plan=_pallas_plan,
        description="Pallas TPU kernel: f32 VMEM accumulator, K last and arbitrary",
    )
)
GEMM.add_variant(
    Variant(
        "kernelab",
        gemm_triton,
        "triton",
        description="default per shape: split-K below M=17, tiled (grouped), TMA on sm_90",
    )
)
GEMM.add_variant(
    Variant(
        "kernelab-persistent",
        _with_kind("persistent"),
        "triton",
        description="persistent",
        configure=_configure("persistent"),
    )
)
GEMM.add_variant(
    Variant(
        "kernelab-splitk",
        _with_kind("splitk"),
        "triton",
        description="split-K, any M",
        configure=_configure("splitk"),
    )
)
GEMM.add_torch(gemm_torch)
