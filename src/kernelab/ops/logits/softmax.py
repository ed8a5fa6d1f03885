"""Softmax over the last dimension, with an optional scale (temperature) and additive mask.

    z   = x · scale (+ mask)
    out = exp(z − max z) / Σ exp(z − max z)

Rows up to MAX_SINGLE_PASS stay in registers (one read, one write); longer rows (vocabularies)
take two passes: an online running max and sum (each lane rescales its partial sum when its
maximum grows), then the normalised write. The ladder: ``_softmax_kernel`` → ``softmax_triton``
(launcher) → ``softmax`` (public), beside ``softmax_ref`` and ``softmax_torch``.
"""

from __future__ import annotations

import torch

from kernelab.core import Contract, Cost, Op, Sampling, Shape, Variant, register
from kernelab.core.runtime import check as _check
from kernelab.core.runtime import inputs as _inputs
from kernelab.core.runtime import shapes as _shapes
from kernelab.core.runtime.launch import KernelCall, LaunchPlan, RowConfig, cdiv, rows
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.logits._kernels import _softmax_kernel

# --- launch heuristics as data ----------------------------------------------------------------

#: The row-wise config (``_launch.RowConfig``): rows up to 16384 values in one pass (32 fp32 per
#: thread over 16 warps, 64 with the exponentials, no local memory on sm_90 per
#: benchmarks/ptx_check.py); longer rows take the online path in blocks of 4096.
SoftmaxConfig = RowConfig
MAX_SINGLE_PASS = RowConfig.MAX_SINGLE_PASS


# --- reference, eager, launcher, public function ----------------------------------------------


def softmax_ref(x, scale=1.0, mask=None, out=None):
    """Plain PyTorch in the inputs' dtype (exact when given float64)."""
    z = x * scale
    if mask is not None:
        z = z + mask
    y = torch.softmax(z, dim=-1)
    return y if out is None else out.copy_(y)


def softmax_torch(x, scale=1.0, mask=None, out=None):
    """Eager PyTorch as samplers write it: float32 arithmetic, one rounding at the end."""
    _validate(x, scale, mask, out)
    z = x.float() * scale
    if mask is not None:
        z = z + mask.float()
    y = torch.softmax(z, dim=-1).to(x.dtype)
    return y if out is None else out.copy_(y)


def _validate(x, scale, mask, out):
    _check.tensor("x", x, dtypes=_check.FLOATS, min_ndim=1)
    _check.finite("scale", scale)
    if mask is not None:
        _check.tensor("mask", mask, dtypes=_check.FLOATS, device=x.device)
        try:
            torch.broadcast_shapes(mask.shape, x.shape)
            ok = mask.dim() <= x.dim()
        except RuntimeError:
            ok = False
        if not ok or torch.broadcast_shapes(mask.shape, x.shape) != x.shape:
            raise ValueError(
                f"mask: expected a shape that broadcasts to x's {tuple(x.shape)}, "
                f"got {tuple(mask.shape)}"
            )
    if out is not None:
        _check.tensor("out", out, dtypes=(x.dtype,), device=x.device)
        _check.same_shape("out", out, x.shape, "the shape of x")


def _mask_rows(mask: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The mask as rows of x's 2-D view: (tensor, row stride); one row is shared (stride 0)."""
    n_cols = x.shape[-1]
    if mask.numel() == n_cols and (n_cols == 1 or mask.stride(-1) == 1 or mask.dim() == 1):
        m = mask.reshape(n_cols)
        return (m if m.stride(0) == 1 else m.contiguous()), 0
    m2 = rows(mask.expand(x.shape)) if mask.shape != x.shape else rows(mask)
    if m2.stride(0) == 0:  # an expanded mask without a row view: materialise it
        m2 = m2.contiguous()
    return m2, m2.stride(0)


def _plan(x, scale=1.0, mask=None, out=None, config=None) -> LaunchPlan:
    """The launch of ``_softmax_kernel`` (looked up at call time, so tests can replace it) for
    these (validated) arguments; nothing is launched for empty ``x``."""
    result = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    if x.numel() == 0:
        return LaunchPlan(result=result)
    x2 = rows(x)
    n_rows, n_cols = x2.shape
    out2 = rows(result)
    m2, stride_mask = _mask_rows(mask, x) if mask is not None else (x2, 0)
    cfg = config or SoftmaxConfig.default_for(n_rows, n_cols, x.device)
    call = KernelCall(
        _softmax_kernel,
        (cdiv(n_rows, cfg.block_m),),
        dict(
            Out=out2,
            stride_out=out2.stride(0),
            X=x2,
            stride_x=x2.stride(0),
            Mask=m2,
            stride_mask=stride_mask,
            n_rows=n_rows,
            n_cols=n_cols,
            scale=float(scale),
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            HAS_MASK=mask is not None,
            SINGLE_PASS=n_cols <= cfg.block_n,
        ),
        cfg.num_warps,
        cfg.num_stages,
        config=cfg,
    )
    return LaunchPlan((call,), result, ((out2, result),))


def softmax_triton(x, scale=1.0, mask=None, out=None, config=None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(x, scale, mask, out)
    return _plan(x, scale, mask, out, config).run()


def softmax(
    x: torch.Tensor,
    scale: float = 1.0,
    mask: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Numerically stable softmax over the last dimension of ``x · scale + mask``.

    Parameters
    ----------
    x : tensor (..., n) of float32, float16 or bfloat16; any leading shape, any row stride.
    scale : multiplies x first (1 / temperature for sampling, 1/sqrt(d) for attention).
    mask : optional additive tensor broadcastable to x (−inf removes an entry); a mask of
        shape (n,) is read once per row without being materialised.
    out : optional preallocated output like ``x``.

    Triton on CUDA/ROCm; torch on CPU (the interpreter with KERNELAB_INTERPRET=1).
    """
    if isinstance(x, torch.Tensor) and use_triton(x):
        return softmax_triton(x, scale, mask, out)
    return softmax_torch(x, scale, mask, out)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    shapes = []
    # Sampling: next-token logits over the vocabulary at temperature 0.7 (the online path).
    for vocab, models in _shapes.by_width(lambda m: m.vocab).items():
        for tokens in _shapes.DECODE_TOKENS:
            shapes.append(
                Shape(
                    f"{'/'.join(models)} logits {tokens}x{vocab}",
                    {"rows": tokens, "cols": vocab},
                    {"scale": 1 / 0.7},
                    batch_dim="rows",
                )
            )
    # Attention scores over a 4096-token context, scaled by 1/sqrt(head_dim), with a padding
    # mask over keys: every head of decode steps, and one head of a prefill.
    for heads, models in _shapes.by_width(lambda m: m.heads).items():
        for tokens in _shapes.DECODE_TOKENS:
            shapes.append(
                Shape(
                    f"{'/'.join(models)} decode scores {tokens}x{heads}x4096",
                    {"rows": tokens * heads, "cols": 4096},
                    {"scale": 128**-0.5, "mask": "keys"},
                    batch_dim="rows",
                )
            )
    shapes.append(
        Shape(
            "prefill scores 4096x4096 (one head)",
            {"rows": 4096, "cols": 4096},
            {"scale": 128**-0.5, "mask": "full"},
            batch_dim="rows",
        )
    )
    return shapes


def _edge() -> list[Shape]:
    cases = [
        ("1 column", 3, 1, {}),
        ("prime width", 5, 1021, {"mask": "keys"}),
        ("one row", 1, 4096, {"scale": 0.5}),
        ("longer than one block", 3, MAX_SINGLE_PASS + 1000, {"mask": "full"}),
        ("non-contiguous rows", 7, 257, {"row_pad": 13, "mask": "full"}),
        ("empty", 0, 128, {}),
        ("many short rows", 1000, 96, {"scale": 2.0}),
    ]
    return [
        Shape(f"{label} {n}x{c}", {"rows": n, "cols": c}, params, batch_dim="rows")
        for label, n, c, params in cases
    ]


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    n_rows, n_cols = shape.dims["rows"], shape.dims["cols"]
    x = _inputs.randn((n_rows, n_cols), dtype, device, gen, dist)
    kind = shape.params.get("mask")
    mask = None
    if kind is not None:
        mshape = (n_cols,) if kind == "keys" else (n_rows, n_cols)
        # Additive mask: small biases, and about one entry in eight removed with -inf (never a
        # whole row, whose softmax is undefined).
        mask = _inputs.randn(mshape, dtype, device, gen, "normal", scale=0.5)
        if device.type != "meta":
            drop = _inputs.randn(mshape, torch.float32, device, gen, "normal") > 1.15
            drop[..., 0] = False
            mask = mask.masked_fill(drop, float("-inf"))
    pad = shape.params.get("row_pad", 0)
    if pad:
        x = _inputs.strided_rows(x, pad)
        if mask is not None and mask.dim() == 2:
            mask = _inputs.strided_rows(mask, pad)
    return {"x": x, "scale": float(shape.params.get("scale", 1.0)), "mask": mask}


def _cost(inputs: dict) -> Cost:
    x, mask = inputs["x"], inputs.get("mask")
    n = x.numel()
    nbytes = 2 * n * x.element_size()  # read x, write out
    flops = 5 * n  # scale, max, subtract and exp, sum, divide
    if mask is not None:
        nbytes += mask.numel() * mask.element_size()
        flops += n
    return Cost(flops=flops, bytes=nbytes)


SOFTMAX = register(
    Op(
        "softmax",
        description="softmax over the last dimension, optional scale and additive mask",
        reference=softmax_ref,
        make_inputs=_make_inputs,
        sampling=Sampling(rows={"x": 0, "mask": 0, "out": 0}, cut={"cols": 128}, tile={"rows": 32}),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        contract=Contract(reduction=lambda inputs: int(inputs["x"].shape[-1])),
        kernels=(_softmax_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: SoftmaxConfig.tuning_space(shape.dims["cols"]),
    )
)
SOFTMAX.add_variant(
    Variant(
        "kernelab",
        softmax_triton,
        "triton",
        description="Triton kernel, one pass up to 16384 columns, online max/sum beyond",
    )
)
SOFTMAX.add_torch(softmax_torch)
