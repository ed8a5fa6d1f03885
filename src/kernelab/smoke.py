"""The smoke stage of ``kernelab run``: every variant that can run here, once, on a small case of
each shape set, checked against the float64 reference within the op's contract.

It is the floor under the full ``verify`` instrument, not a replacement for it.
"""

from __future__ import annotations

import torch

from kernelab.numerics import error
from kernelab.ops import as_tuple
from kernelab.stages import Cell, StageReport

#: Rows kept per case, so that interpreted kernels finish in seconds.
MAX_ROWS = 8


def _clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def check(op, variant, shape, dtype, device, seed: int = 0) -> tuple[bool, float, float]:
    """Run ``variant`` once; return (within contract, its error, the tolerance)."""
    inputs = op.inputs(shape, dtype, device, seed=seed)
    ref_out, ref_inplace = op.run_reference(inputs)
    eager = _clone(inputs)
    eager_out = as_tuple(op.variants["torch"](**eager)) if "torch" in op.variants else None
    cand = _clone(inputs)
    out = as_tuple(variant(**cand))
    worst, tol = 0.0, 0.0
    pairs = list(zip(out, ref_out, eager_out or [None] * len(out), strict=True))
    pairs += [(cand[n], r, eager[n] if eager_out else None) for n, r in ref_inplace.items()]
    for got, ref, base in pairs:
        base_err = error(base, ref).rel_l2 if base is not None else None
        t, _ = op.contract.tolerance_for(dtype, base_err)
        e = error(got, ref).rel_l2
        if e / t > (worst / tol if tol else 0.0) or tol == 0.0:
            worst, tol = e, t
    return worst <= tol, worst, tol


def stage(ops, device, progress=None) -> StageReport:
    report = StageReport("smoke")
    for op in ops:
        for variant in op.variants.values():
            ok, why = variant.runs_on(device.type)
            if not ok:
                report.cells[(op.name, variant.name)] = Cell("skip", why)
                report.skipped.append(f"{op.name}/{variant.name}: {why}")
                continue
            if variant.kind == "compile" and device.type == "cpu":
                report.cells[(op.name, variant.name)] = Cell("skip", "compile: CPU smoke skips")
                continue
            failures, worst = [], 0.0
            for shape_set in ("representative", "edge"):
                shape = next(
                    s for s in op.shapes(shape_set) if all(v > 0 for v in s.dims.values())
                ).reduced(MAX_ROWS)
                for dtype in op.dtypes:
                    passed, err, tol = check(op, variant, shape, dtype, device.type)
                    worst = max(worst, err / tol)
                    if not passed:
                        failures.append(f"{shape.label} {dtype}: error {err:.2e} > {tol:.2e}")
                if progress:
                    progress(f"smoke {op.name}/{variant.name} {shape_set}")
            cell = (
                Cell("fail", "; ".join(failures))
                if failures
                else Cell("pass", f"✓ err ≤ {worst:.2f}× tol", {"worst_ratio": worst})
            )
            report.cells[(op.name, variant.name)] = cell
    return report
