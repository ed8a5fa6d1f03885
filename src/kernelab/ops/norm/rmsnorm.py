"""RMSNorm, with the fused residual add of inference servers.

    residual ← x + residual          (only when ``residual`` is given; in place)
    out      = h / sqrt(mean(h²) + eps) · weight,   h = residual if given else x

The ladder: ``_rmsnorm_kernel`` (Triton) → ``rmsnorm_triton`` (launcher: validate, allocate,
launch) → ``rmsnorm`` (public: Triton on GPUs, torch on CPU) with ``rmsnorm_ref`` (reference,
exact in float64) and ``rmsnorm_torch`` (eager PyTorch, float32 arithmetic) beside it.
"""

from __future__ import annotations

import torch

from kernelab.core import Contract, Cost, Op, Sampling, Shape, Variant, register
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.norm import _common as _norm
from kernelab.ops.norm._kernels import _norm_kernel

# --- the kernel and its launch heuristic: the norm family's (kernelab.ops.norm) ------------------

#: RMSNorm runs the family kernel with IS_RMS; the name stays so that tests can replace it.
_rmsnorm_kernel = _norm_kernel
RMSNormConfig = _norm.NormConfig
MAX_SINGLE_PASS = _norm.MAX_SINGLE_PASS


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
    _norm.validate(x, weight, eps, residual, out)


def _plan(x, weight, eps=1e-6, residual=None, out=None, config=None):
    """The launch of ``_rmsnorm_kernel`` for these (validated) arguments."""
    result = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    return _norm.plan(_rmsnorm_kernel, x, weight, None, eps, residual, result, config, is_rms=True)


def rmsnorm_triton(x, weight, eps=1e-6, residual=None, out=None, config=None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(x, weight, eps, residual, out)
    return _plan(x, weight, eps, residual, out, config).run()


def _pallas_plan(x, weight, eps=1e-6, residual=None, out=None, config=None, target=None):
    """The Pallas launch for these (validated) arguments (``norm/_pallas.py``)."""
    from kernelab.ops.norm import _pallas

    return _pallas.rmsnorm_plan(x, weight, eps, residual, out, config, target)


def rmsnorm_pallas(x, weight, eps=1e-6, residual=None, out=None, config=None):
    """The Pallas kernel: natively on a TPU, through the TPU interpreter on CPU tensors."""
    _validate(x, weight, eps, residual, out)
    return _pallas_plan(x, weight, eps, residual, out, config).run()


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
    return _norm.representative(({"residual": False}, {"residual": True}))


def _edge() -> list[Shape]:
    return _norm.edge(({"residual": False}, {"residual": True}))


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    return _norm.inputs(shape, dtype, device, gen, dist, eps=1e-6)


def _cost(inputs: dict) -> Cost:
    return _norm.cost(inputs, 4)  # square, accumulate, scale by rstd, scale by weight


RMSNORM = register(
    Op(
        "rmsnorm",
        description="RMSNorm over the last dimension, optional fused residual add (in place)",
        reference=rmsnorm_ref,
        make_inputs=_make_inputs,
        sampling=Sampling(
            rows={"x": 0, "residual": 0, "out": 0}, cut={"cols": 128}, tile={"rows": 32}
        ),
        shapes={"representative": _representative, "edge": _edge},
        cost=_cost,
        contract=Contract(inplace=("residual",), reduction=_norm.row_length),
        kernels=(_rmsnorm_kernel,),
        plan=_plan,
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
RMSNORM.add_variant(
    Variant(
        "pallas",
        rmsnorm_pallas,
        "pallas",
        plan=_pallas_plan,
        description="Pallas TPU kernel, blocks of whole rows (fused residual too)",
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
