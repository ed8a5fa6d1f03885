"""What the weight-only GEMM tests (test_w4a16, test_w8a16) share: a run against the float64
reference computed from the same quantized weights, within the op's contract."""

import torch

from kernelab.numerics import error


def clone(inputs):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def check(op, inputs, fn, dtype):
    (ref,), _ = op.run_reference(inputs)
    base = op.variants["torch"](**clone(inputs))
    out = fn(**clone(inputs))
    assert type(out) is torch.Tensor and out.dtype == dtype and out.shape == ref.shape
    tol, _ = op.contract.tolerance_for(dtype, error(base, ref).rel_l2)
    err = error(out, ref)
    assert torch.isfinite(out).all(), "non-finite output"
    assert err.rel_l2 <= tol, f"rel L2 {err.rel_l2:.3e} > tolerance {tol:.3e} at {err}"


def decode_and_prefill(shapes):
    return [shapes[0].reduced(1), shapes[2].reduced(8)]  # M = 1 (GEMV path) and M = 128
