"""The null-kernel audit: trivial candidates that every op's verification must reject.

Each null candidate computes the right answer (the float64 reference, stored in the output's
dtype), updates in-place arguments correctly, writes ``out=`` when given, and then spoils one
target (one output or one in-place argument) in one way:

- ``zeros``: all zeros;
- ``input copy``: a copy of an input with as many elements (not applicable if none has);
- ``lower precision``: the reference rounded to half the significant bits of the target's
  format (float32 → 12 bits, float16 → 6, bfloat16 → 4, float8 → 2);
- ``row dropped``: the last row (index along the first dimension) set to zero.

For every op, target, null and dtype, cases run over the op's shapes until one rejects the
null by its values (out of tolerance, or, for an in-place argument with a declared region,
changed outside it; a NaN-pattern mismatch alone does not count). A null
that no case rejects means the op's tolerance or inputs cannot tell a trivial kernel from a
correct one: the op definition is broken, and the audit says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kernelab.core import dtype_name
from kernelab.ops import Op
from kernelab.verify._case import Subject, expected, run_case
from kernelab.verify._runner import (
    DEFAULT_TRIALS,
    _check_common,
    _ops,
    cpu_threads,
    default_device,
    new_seed,
    shapes_for,
)
from kernelab.verify._types import AuditEntry, Report

NULLS = ("zeros", "input copy", "lower precision", "row dropped")

_SIGNIFICANT = {
    torch.float64: 26,
    torch.float32: 12,
    torch.float16: 6,
    torch.bfloat16: 4,
}


def lower_precision(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``ref`` rounded to half the significant bits of ``dtype`` (2 for float8 formats)."""
    keep = _SIGNIFICANT.get(dtype, 2)
    r = ref.to(torch.float64)
    mantissa, exponent = torch.frexp(r)
    rounded = torch.ldexp(torch.round(mantissa * 2.0**keep) / 2.0**keep, exponent)
    return torch.where(torch.isfinite(r), rounded, r)


def _spoil(kind: str, value: torch.Tensor, inputs: dict) -> torch.Tensor | None:
    """``value`` (the right answer, in its final dtype) spoiled in way ``kind``."""
    if kind == "zeros":
        return torch.zeros_like(value)
    if kind == "input copy":
        for v in inputs.values():
            if isinstance(v, torch.Tensor) and v.numel() == value.numel() and v.numel():
                return v.detach().reshape(value.shape).to(value.dtype).clone()
        return None
    if kind == "lower precision":
        if not value.is_floating_point():
            return None
        return lower_precision(value, value.dtype).to(value.dtype)
    if kind == "row dropped":
        if value.dim() == 0 or value.numel() == 0:
            return None
        spoiled = value.clone()
        spoiled[-1] = 0
        return spoiled
    raise ValueError(f"kind: expected one of {NULLS}, got {kind!r}")


#: The classes that count as rejecting a null candidate: its values are out of tolerance, or it
#: changed elements of an in-place argument outside the declared region (compared bitwise, so
#: no tolerance can let a spoiled value through). Other classes alone do not count: a
#: NaN-pattern mismatch (a null kernel that propagates NaN would pass), a cached result (a
#: constant output within a loose tolerance is "right" once).
_REJECTING = {"wrong values", "wrote outside its in-place region"}


class NotApplicable(Exception):
    """The null candidate cannot be built for this target (no input of its size, say)."""


def null_candidate(op: Op, kind: str, target: str, baseline: Callable | None) -> Callable:
    """A candidate that gets everything right except ``target``, spoiled as ``kind``."""

    def null(**kwargs):
        if isinstance(op.out_arg, str):
            out = kwargs.pop(op.out_arg, None)
        elif op.out_arg:
            outs = [kwargs.pop(n, None) for n in op.out_arg]
            out = None if any(o is None for o in outs) else tuple(outs)
        else:
            out = None
        ref_out, ref_inplace = op.run_reference(kwargs)
        dtype = next(
            (
                v.dtype
                for v in kwargs.values()
                if isinstance(v, torch.Tensor) and v.is_floating_point()
            ),
            torch.float32,
        )
        exp = expected(op, kwargs, None, dtype, "cpu") if baseline is None else None
        specs = exp.specs if exp is not None else None
        if specs is None:
            base = baseline(
                **{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            )
            base = base if isinstance(base, tuple | list) else (base,)
            specs = [
                (n, tuple(b.shape), b.dtype, b.device)
                for n, b in zip(op.outputs, base, strict=False)
            ]
        outputs = []
        for (name, _, out_dtype, device), ref in zip(specs, ref_out, strict=True):
            value = ref.to(device=device, dtype=out_dtype)
            if name == target:
                value = _spoil(kind, value, kwargs)
                if value is None:
                    raise NotApplicable(f"{kind} does not apply to {target}")
            outputs.append(value)
        for name, ref in ref_inplace.items():
            arg = kwargs[name]
            value = ref.to(device=arg.device, dtype=arg.dtype)
            if name == target:
                value = _spoil(kind, value, {k: v for k, v in kwargs.items() if k != name})
                if value is None:
                    raise NotApplicable(f"{kind} does not apply to {target}")
            arg.copy_(value)
        if out is not None:
            outs = out if isinstance(out, tuple | list) else (out,)
            for o, v in zip(outs, outputs, strict=True):
                o.copy_(v)
            outputs = list(outs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    null.__name__ = f"null_{kind.replace(' ', '_')}"
    return null


def _targets(op: Op) -> list[str]:
    return list(op.outputs) + list(op.contract.inplace)


def audit(
    ops=None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    trials: int = DEFAULT_TRIALS,
    cap: int | None = None,
    shape_sets=("representative", "edge"),
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Run every null candidate against every op (module docstring); see ``Report.audit``."""
    _check_common(trials, seed)
    device = str(device or default_device())
    seed = new_seed() if seed is None else seed
    report = Report(seed, device, trials, list(shape_sets))
    started = time.perf_counter()
    with cpu_threads(device):
        _audit_ops(report, _ops(ops), shape_sets, device, seed, trials, cap, progress)
    report.seconds = time.perf_counter() - started
    return report


def _audit_ops(report, ops, shape_sets, device, seed, trials, cap, progress) -> None:
    for op in ops:
        baseline = op.eager.fn if op.eager is not None else None
        shapes = [
            (s, shape)
            for s in shape_sets
            if s in op.shape_sets
            for shape in shapes_for(op, s, device, cap)
        ]
        for target in _targets(op):
            for kind in NULLS:
                subject = Subject(f"null: {kind}", null_candidate(op, kind, target, baseline))
                for dtype in op.dtypes:
                    if progress:
                        progress(f"audit {op.name} {kind} on {target} {dtype_name(dtype)}")
                    report.audit.append(
                        _audit_one(
                            op, subject, kind, target, dtype, shapes, device, seed, trials, baseline
                        )
                    )


def _audit_one(op, subject, kind, target, dtype, shapes, device, seed, trials, baseline):
    ran, worst, applicable = 0, 0.0, False
    for i, (shape_set, shape) in enumerate(shapes):
        case = run_case(op, subject, shape, shape_set, dtype, device, seed, trials, baseline, i)
        if any("NotApplicable" in f.message for f in case.failures):
            continue
        applicable = True
        ran += 1
        worst = max(worst, case.worst_ratio)
        if _REJECTING & set(case.classes):
            return AuditEntry(
                op.name,
                kind,
                target,
                dtype_name(dtype),
                True,
                next(c for c in case.classes if c in _REJECTING),
                case.worst_ratio,
                ran,
                f"{shape_set}: {shape.label}",
            )
    if not applicable:
        return AuditEntry(
            op.name, kind, target, dtype_name(dtype), True, None, 0.0, 0, "not applicable"
        )
    return AuditEntry(
        op.name,
        kind,
        target,
        dtype_name(dtype),
        False,
        None,
        worst,
        ran,
        f"passed all {ran} case(s): the op's tolerance or inputs cannot reject it",
    )
