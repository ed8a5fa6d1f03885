"""SwiGLU: silu(gate) · up for x = [gate | up] of shape (..., 2·d).

The gated-activation family's kernel (``kernelab.ops.activation._kernels``) with ACT = SILU;
the ladder: ``silu_and_mul_triton`` (launcher: validate, then the plan) → ``silu_and_mul``
(public: Triton on GPUs, torch on CPU), beside ``silu_and_mul_ref`` and ``silu_and_mul_torch``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelab.core import Contract, Op, Sampling, Variant, register
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.activation import _common as _act
from kernelab.ops.activation._common import ActConfig
from kernelab.ops.activation._kernels import SILU, _act_and_mul_kernel

# --- reference, eager, launcher, public function ----------------------------------------------


def silu_and_mul_ref(x, out=None):
    """silu(gate) · up in the input's dtype (exact when given float64)."""
    d = x.shape[-1] // 2
    g, u = x[..., :d], x[..., d:]
    y = g * torch.sigmoid(g) * u
    return y if out is None else out.copy_(y)


def silu_and_mul_torch(x, out=None):
    """Eager PyTorch as inference servers write it, in the input's dtype."""
    _act.validate(x, out)
    d = x.shape[-1] // 2
    y = F.silu(x[..., :d]) * x[..., d:]
    return y if out is None else out.copy_(y)


def _plan(x, out=None, config=None):
    """The launch of ``_act_and_mul_kernel`` (looked up at call time, so tests can replace it)
    with ACT = SILU for these (validated) arguments."""
    return _act.plan(_act_and_mul_kernel, x, SILU, out, config)


def silu_and_mul_triton(x, out=None, config: ActConfig | None = None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _act.validate(x, out)
    return _plan(x, out, config).run()


def _pallas_plan(x, out=None, config=None, target=None):
    """The Pallas launch for these (validated) arguments (``activation/_pallas.py``)."""
    from kernelab.ops.activation import _pallas

    return _pallas.silu_and_mul_plan(x, out, config, target)


def silu_and_mul_pallas(x, out=None, config=None):
    """The Pallas kernel: natively on a TPU, through the TPU interpreter on CPU tensors."""
    _act.validate(x, out)
    return _pallas_plan(x, out, config).run()


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


# --- the declaration ---------------------------------------------------------------------------

SILU_AND_MUL = register(
    Op(
        "silu_and_mul",
        description="SwiGLU: silu(gate) * up over [tokens, 2*d] -> [tokens, d]",
        reference=silu_and_mul_ref,
        make_inputs=_act.inputs,
        sampling=Sampling(rows={"x": 0, "out": 0}, cut={"d": 128}, tile={"rows": 32}),
        shapes=_act.shape_sets(({},)),
        cost=lambda inputs: _act.cost(inputs, 5),  # exp, add, divide, multiply by up (+ negate)
        contract=Contract(),
        kernels=(_act_and_mul_kernel,),
        plan=_plan,
        tuning_space=_act.tuning,
    )
)
SILU_AND_MUL.add_variant(
    Variant("kernelab", silu_and_mul_triton, "triton", description="Triton, float32 math")
)
SILU_AND_MUL.add_variant(
    Variant(
        "pallas",
        silu_and_mul_pallas,
        "pallas",
        plan=_pallas_plan,
        description="Pallas TPU kernel, float32 math, tiles of 128-lane columns",
    )
)
SILU_AND_MUL.add_torch(silu_and_mul_torch)
