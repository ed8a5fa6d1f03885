"""W8A16: x · W (+ bias) with W int8 and one scale per output column.

    out = x · W (+ bias),   W[k, n] = q[k, n] · scales[n]        (symmetric, no zero point)

x is float16/bfloat16 [M, K]; ``qweight`` is int8 [K, N] (``_packing.quantize_int8`` makes it
from a float weight). The kernel and its launch plan are the weight-only family's
(``_weight_only``, with constexpr BITS = 8): the column scale multiplies the float32 sum once.

The ladder: ``_wq_gemm_kernel`` → ``w8a16_triton`` (validate, plan, launch) → ``w8a16_gemm``
(public) with ``w8a16_ref`` (reference, exact in float64) and ``w8a16_torch`` (eager: dequantize
to x's dtype, dense matmul) beside it.
"""

from __future__ import annotations

import torch

from kernelab.core import Op, Shape, Variant, register
from kernelab.core.runtime.triton import use_triton
from kernelab.ops.matmul import _common as gc
from kernelab.ops.matmul import _packing
from kernelab.ops.matmul import _weight_only as _wo
from kernelab.ops.matmul._kernels import _wq_gemm_kernel

WQConfig = _wo.WQConfig


# --- reference, eager, launcher, public function ----------------------------------------------


def w8a16_ref(x, qweight, scales, bias=None, out=None):
    """x @ dequantized W (+ bias), in x's dtype (exact when given float64)."""
    w = _packing.dequantize_int8(qweight, scales, x.dtype)
    y = x @ w if bias is None else x @ w + bias
    return y if out is None else out.copy_(y)


def w8a16_torch(x, qweight, scales, bias=None, out=None):
    """Eager PyTorch: dequantize the weight to x's dtype, then a dense matmul."""
    _validate(x, qweight, scales, bias, out)
    w = _packing.dequantize_int8(qweight, scales, x.dtype)
    y = torch.addmm(bias, x, w) if bias is not None else x @ w
    return y if out is None else out.copy_(y)


def _validate(x, qweight, scales, bias, out):
    _wo.validate(x, qweight, scales, None, None, bias, out, bits=8)


def _plan(x, qweight, scales, bias=None, out=None, config=None):
    """The launches of ``_wq_gemm_kernel`` (int8) for these (validated) arguments."""
    return _wo.plan(_wq_gemm_kernel, x, qweight, scales, None, None, bias, out, config, bits=8)


def w8a16_triton(x, qweight, scales, bias=None, out=None, config=None):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(x, qweight, scales, bias, out)
    return _plan(x, qweight, scales, bias, out, config).run()


def _pallas_plan(x, qweight, scales, bias=None, out=None, config=None, target=None):
    """The Pallas launch for these (validated) arguments (``matmul/_pallas.py``)."""
    from kernelab.ops.matmul import _pallas

    return _pallas.w8a16_plan(x, qweight, scales, bias, out, config, target)


def w8a16_pallas(x, qweight, scales, bias=None, out=None, config=None):
    """The Pallas kernel: natively on a TPU, through the TPU interpreter on CPU tensors."""
    _validate(x, qweight, scales, bias, out)
    return _pallas_plan(x, qweight, scales, bias, out, config).run()


def w8a16_gemm(x, qweight, scales, bias=None, out=None):
    """x [M, K] @ int8 weight [K, N] with per-column ``scales`` (+ bias) → [M, N]."""
    if isinstance(x, torch.Tensor) and use_triton(x):
        return w8a16_triton(x, qweight, scales, bias, out)
    return w8a16_torch(x, qweight, scales, bias, out)


# --- the declaration ---------------------------------------------------------------------------


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
    k, n = shape.dims["K"], shape.dims["N"]
    if device.type == "meta":
        q = torch.empty((k, n), dtype=torch.int8, device=device)
        s = torch.empty((n,), dtype=dtype, device=device)
    else:
        q, s = _packing.quantize_int8(_wo.weight(shape, device, gen), dtype)
    x, bias = _wo.x_and_bias(shape, dtype, device, gen, dist)
    return {"x": x, "qweight": q, "scales": s, "bias": bias}


W8A16_GEMM = register(
    Op(
        "w8a16_gemm",
        description="x·W (+bias), W int8 with per-output-channel scales",
        reference=w8a16_ref,
        make_inputs=_make_inputs,
        sampling=gc.gemm_sampling(rows={"x": 0}, cols={"qweight": 1, "scales": 0, "bias": 0}),
        shapes={"representative": lambda: gc.representative(), "edge": lambda: _wo.edge(8)},
        cost=_wo.cost,
        contract=_wo.CONTRACT,
        dtypes=_wo.DTYPES,
        kernels=(_wq_gemm_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: _wo.tuning_space(shape, dtype, 8),
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
W8A16_GEMM.add_variant(
    Variant(
        "pallas",
        w8a16_pallas,
        "pallas",
        plan=_pallas_plan,
        description="Pallas TPU kernel: int8 tiles, column scales on the f32 sum",
    )
)
W8A16_GEMM.add_torch(w8a16_torch)
