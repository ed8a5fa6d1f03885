"""GeGLU: gelu(gate) · up for x = [gate | up] of shape (..., 2·d), in the erf form
(``approximate="none"``) or the tanh form (``approximate="tanh"``).

The gated-activation family's kernel (``kernelab.ops.activation._kernels``) with ACT = GELU_ERF
or GELU_TANH; the ladder: ``gelu_and_mul_triton`` (launcher: validate, then the plan) →
``gelu_and_mul`` (public), beside ``gelu_and_mul_ref`` and ``gelu_and_mul_torch``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelab.core import Contract, Op, Sampling, Variant, register
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.activation import _common as _act
from kernelab.ops.activation._common import ActConfig
from kernelab.ops.activation._kernels import _act_and_mul_kernel

# --- reference, eager, launcher, public function ----------------------------------------------


def _gelu_f64(g, approximate):
    if approximate == "tanh":
        return 0.5 * g * (1.0 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g**3)))
    return 0.5 * g * (1.0 + torch.erf(g / 2**0.5))


def gelu_and_mul_ref(x, approximate="none", out=None):
    """gelu(gate) · up in the input's dtype (exact when given float64)."""
    d = x.shape[-1] // 2
    y = _gelu_f64(x[..., :d], approximate) * x[..., d:]
    return y if out is None else out.copy_(y)


def gelu_and_mul_torch(x, approximate="none", out=None):
    """Eager PyTorch as inference servers write it, in the input's dtype."""
    _act.validate(x, out, approximate)
    d = x.shape[-1] // 2
    y = F.gelu(x[..., :d], approximate=approximate) * x[..., d:]
    return y if out is None else out.copy_(y)


def _plan(x, approximate="none", out=None, config=None):
    """The launch of ``_act_and_mul_kernel`` (looked up at call time, so tests can replace it)
    with the ACT of ``approximate`` for these (validated) arguments."""
    return _act.plan(_act_and_mul_kernel, x, _act.GELU[approximate], out, config)


def gelu_and_mul_triton(x, approximate="none", out=None, config: ActConfig | None = None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _act.validate(x, out, approximate)
    return _plan(x, approximate, out, config).run()


def gelu_and_mul(
    x: torch.Tensor, approximate: str = "none", out: torch.Tensor | None = None
) -> torch.Tensor:
    """GeGLU: ``gelu(x[..., :d]) * x[..., d:]``; ``approximate`` is "none" (erf) or "tanh".

    Parameters as :func:`kernelab.ops.silu_and_mul`.
    """
    if isinstance(x, torch.Tensor) and use_triton(x):
        return gelu_and_mul_triton(x, approximate, out)
    return gelu_and_mul_torch(x, approximate, out)


# --- the declaration ---------------------------------------------------------------------------

GELU_AND_MUL = register(
    Op(
        "gelu_and_mul",
        description="GeGLU: gelu(gate) * up, erf or tanh form, [tokens, 2*d] -> [tokens, d]",
        reference=gelu_and_mul_ref,
        make_inputs=_act.inputs,
        sampling=Sampling(rows={"x": 0, "out": 0}, cut={"d": 128}, tile={"rows": 32}),
        shapes=_act.shape_sets(({"approximate": "none"}, {"approximate": "tanh"})),
        cost=lambda inputs: _act.cost(inputs, 8),  # tanh form; the erf form is of the same order
        contract=Contract(),
        kernels=(_act_and_mul_kernel,),
        plan=_plan,
        tuning_space=_act.tuning,
    )
)
GELU_AND_MUL.add_variant(
    Variant("kernelab", gelu_and_mul_triton, "triton", description="Triton, float32 math")
)
GELU_AND_MUL.add_torch(gelu_and_mul_torch)
