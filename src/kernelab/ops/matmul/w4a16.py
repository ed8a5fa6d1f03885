"""W4A16: x · W (+ bias) with W int4, two codes per byte, group-wise scales and zero points.

    out = x · W (+ bias),   W[k, n] = (q[k, n] − zeros[k // G, n]) · scales[k // G, n]

x is float16/bfloat16 [M, K]; the weight is in the kernelab int4 layout of ``_packing``
(``quantize_int4``, ``from_awq``, ``from_gptq`` make it), G = 64 or 128. The kernel and its
launch plan are the weight-only family's (``_weight_only``, with constexpr BITS = 4).

The ladder: ``_wq_gemm_kernel`` → ``w4a16_triton`` (validate, plan, launch) → ``w4a16_gemm``
(public) with ``w4a16_ref`` (reference, exact in float64) and ``w4a16_torch`` (eager: dequantize
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


def w4a16_ref(x, qweight, scales, zeros, group_size, bias=None, out=None, check=True):
    """x @ dequantized W (+ bias), in x's dtype (exact when given float64)."""
    w = _packing.dequantize_int4(qweight, scales, zeros, group_size, x.dtype)
    y = x @ w if bias is None else x @ w + bias
    return y if out is None else out.copy_(y)


def w4a16_torch(x, qweight, scales, zeros, group_size, bias=None, out=None, check=True):
    """Eager PyTorch: dequantize the weight to x's dtype, then a dense matmul."""
    _validate(x, qweight, scales, zeros, group_size, bias, out, check)
    w = _packing.dequantize_int4(qweight, scales, zeros, group_size, x.dtype)
    y = torch.addmm(bias, x, w) if bias is not None else x @ w
    return y if out is None else out.copy_(y)


def _validate(x, qweight, scales, zeros, group_size, bias, out, check=True):
    _wo.validate(x, qweight, scales, zeros, group_size, bias, out, bits=4, check=check)


def _plan(x, qweight, scales, zeros, group_size, bias=None, out=None, check=True, config=None):
    """The launches of ``_wq_gemm_kernel`` (int4) for these (validated) arguments."""
    return _wo.plan(
        _wq_gemm_kernel, x, qweight, scales, zeros, group_size, bias, out, config, bits=4
    )


def w4a16_triton(
    x, qweight, scales, zeros, group_size, bias=None, out=None, check=True, config=None
):
    """Launch the Triton kernel (natively on GPUs, through the interpreter on CPU tensors)."""
    _validate(x, qweight, scales, zeros, group_size, bias, out, check)
    return _plan(x, qweight, scales, zeros, group_size, bias, out, check, config).run()


def w4a16_gemm(x, qweight, scales, zeros, group_size, bias=None, out=None, check=True):
    """x [M, K] @ int4 weight (kernelab layout, see ``_packing``) (+ bias) → [M, N] in x's
    dtype; K = 0 gives zeros (+ bias). ``check``: the zero points read on the host, each in the
    int4 range 0..15 (a device sync; off for weights known good, e.g. from ``quantize_int4``).
    Triton on CUDA/ROCm; torch on CPU (interpreter with KERNELAB_INTERPRET=1)."""
    if isinstance(x, torch.Tensor) and use_triton(x):
        return w4a16_triton(x, qweight, scales, zeros, group_size, bias, out, check)
    return w4a16_torch(x, qweight, scales, zeros, group_size, bias, out, check)


# --- the declaration ---------------------------------------------------------------------------


def _representative() -> list[Shape]:
    return gc.representative(lambda proj, bias: {"group_size": 128})


def _make_inputs(shape: Shape, dtype, device, gen, dist) -> dict:
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
        w = _packing.quantize_int4(_wo.weight(shape, device, gen), g, dtype)
    x, bias = _wo.x_and_bias(shape, dtype, device, gen, dist)
    return {"x": x, "qweight": w.qweight, "scales": w.scales, "zeros": w.zeros,
            "group_size": g, "bias": bias}  # fmt: skip


W4A16_GEMM = register(
    Op(
        "w4a16_gemm",
        description="x·W (+bias), W int4 two per byte with group-wise scales and zero points",
        reference=w4a16_ref,
        make_inputs=_make_inputs,
        sampling=gc.gemm_sampling(
            rows={"x": 0}, cols={"qweight": 1, "scales": 1, "zeros": 1, "bias": 0}
        ),
        shapes={"representative": _representative, "edge": lambda: _wo.edge(4)},
        cost=_wo.cost,
        contract=_wo.CONTRACT,
        dtypes=_wo.DTYPES,
        kernels=(_wq_gemm_kernel,),
        plan=_plan,
        tuning_space=lambda shape, dtype: _wo.tuning_space(shape, dtype, 4),
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
