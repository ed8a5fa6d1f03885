"""Checks shared by the op tests: a candidate against the float64 reference within the contract."""

from __future__ import annotations

import torch

from kernelab.numerics import error, special_mismatch
from kernelab.ops import as_tuple


def clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def check(op, inputs: dict, fn, dtype: torch.dtype) -> tuple:
    """Run ``fn`` and the op's eager torch on copies of ``inputs``; every output and in-place
    argument must be within the op's contract of the float64 reference (tolerance derived from
    eager torch's own error). Returns the candidate's outputs."""
    ref_out, ref_inplace = op.run_reference(inputs)
    eager, cand = clone(inputs), clone(inputs)
    eager_out = as_tuple(op.variants["torch"](**eager))
    out = as_tuple(fn(**cand))
    assert len(out) == len(ref_out)
    pairs = list(zip(out, eager_out, ref_out, strict=True))
    pairs += [(cand[n], eager[n], ref) for n, ref in ref_inplace.items()]
    for got, base, ref in pairs:
        assert type(got) is torch.Tensor
        assert got.shape == ref.shape
        assert not special_mismatch(got, ref).any(), "NaN/Inf pattern differs from the reference"
        tol, _ = op.contract.tolerance_for(dtype, error(base, ref).rel_l2)
        err = error(got, ref)
        assert err.rel_l2 <= tol, f"rel L2 {err.rel_l2:.3e} > tolerance {tol:.3e} at {err}"
    return out
