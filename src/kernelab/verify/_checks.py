"""The checks applied after each call of a candidate; each returns failures of one class."""

from __future__ import annotations

import torch

from kernelab.numerics import bits, error, special_mismatch
from kernelab.verify._buffers import Guarded, first, poison_value
from kernelab.verify._types import Failure, Measure


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def contract(result, specs, outs: list[Guarded] | None) -> tuple[list | None, list[Failure]]:
    """The call's result against the expected outputs ``specs`` [(name, shape, dtype, device)].

    A plain ``torch.Tensor`` per output (no subclass: nothing lazy or wrapped), with the
    expected shape, dtype and device; when ``out=`` was passed, the output is that buffer.
    Returns the output tensors (None where unusable) and the failures.
    """
    items = result if isinstance(result, tuple | list) else (result,)
    if len(items) != len(specs):
        names = [s[0] for s in specs]
        return None, [
            Failure(
                "contract",
                "result",
                f"returned {len(items)} value(s), expected {len(specs)} ({', '.join(names)})",
            )
        ]
    got, failures = [], []
    for i, (item, (name, shape, dtype, device)) in enumerate(zip(items, specs, strict=True)):
        problem = None
        if type(item) is not torch.Tensor:
            what = type(item).__module__ + "." + type(item).__qualname__
            problem = f"is a {what}, expected a plain torch.Tensor (no subclass, nothing lazy)"
        elif tuple(item.shape) != tuple(shape):
            problem = f"has shape {tuple(item.shape)}, expected {tuple(shape)}"
        elif item.dtype != dtype:
            problem = f"has dtype {_name(item.dtype)}, expected {_name(dtype)}"
        elif item.device != torch.device(device):
            problem = f"is on {item.device}, expected {device}"
        elif item.layout != torch.strided:
            problem = f"has layout {item.layout}, expected torch.strided"
        elif outs is not None and item.numel() and item.data_ptr() != outs[i].view.data_ptr():
            problem = "is a new tensor: the out= buffer passed in was not written"
        if problem:
            failures.append(Failure("contract", name, problem))
            got.append(None)
        else:
            got.append(item)
    return got, failures


def canaries(guards: list[Guarded]) -> list[Failure]:
    """Canaries around every tensor the candidate saw must be bitwise intact."""
    failures = []
    for g in guards:
        count, offsets, values = g.broken_canaries()
        if not count:
            continue
        span = g.view.numel()
        where = []
        for off in offsets:
            where.append([off])
        after = sum(1 for o in offsets if o >= 0)
        failures.append(
            Failure(
                "out-of-bounds write",
                g.name,
                f"{count} element(s) outside the {span}-element tensor changed "
                f"({after} of the first {len(offsets)} after its first element, in gaps or "
                "past the end; the rest before it); offsets are from its first element",
                where,
                values,
                [g.canary] * len(values),
            )
        )
    return failures


def unchanged(name: str, after: torch.Tensor, before: torch.Tensor) -> list[Failure]:
    """An input the op does not declare in place must be bitwise unchanged."""
    changed = bits(after.detach().cpu()) != bits(before.detach().cpu())
    if not bool(changed.any()):
        return []
    indices, got, expected = first(changed, after, before)
    return [
        Failure(
            "mutated input",
            name,
            f"{int(changed.sum())} element(s) changed by the call, which does not declare "
            f"{name!r} in place",
            indices,
            got,
            expected,
        )
    ]


def outside_region(
    name: str, after: torch.Tensor, before: torch.Tensor, region: torch.Tensor
) -> list[Failure]:
    """An in-place argument with a declared region: every element outside it must be bitwise
    what it was before the call."""
    changed = (bits(after.detach().cpu()) != bits(before.detach().cpu())) & ~region
    if not bool(changed.any()):
        return []
    indices, got, expected = first(changed, after, before)
    return [
        Failure(
            "wrote outside its in-place region",
            name,
            f"{int(changed.sum())} element(s) outside the {int(region.sum())} the call may write "
            f"changed (of {region.numel()}); shown: after the call, expected = before it",
            indices,
            got,
            expected,
        )
    ]


def region_values(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    base: torch.Tensor | None,
    tolerance: tuple[float, str],
    eager_error: float | None,
    region: torch.Tensor,
) -> tuple[Measure, list[Failure]]:
    """``values`` on the elements of ``region`` only; indices refer to the whole tensor."""
    where = torch.nonzero(region)
    m, failures = values(
        name,
        got.detach().cpu()[region],
        ref.detach().cpu()[region],
        None if base is None else base.detach().cpu()[region],
        tolerance,
        eager_error,
    )

    def whole(i):
        return [int(k) for k in where[i[0]]] if where.numel() else list(i)

    if m.worst_index is not None:
        m.worst_index = whole(m.worst_index)
    for f in failures:
        f.indices = [whole(i) for i in f.indices]
    return m, failures


def values(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    base: torch.Tensor | None,
    tolerance: tuple[float, str],
    eager_error: float | None,
) -> tuple[Measure, list[Failure]]:
    """Error against the float64 reference within tolerance, and the NaN/Inf pattern."""
    err = error(got, ref)
    tol, source = tolerance
    m = Measure(
        name,
        err.rel_l2,
        err.max_abs,
        err.max_rel,
        None if err.worst_index is None else list(err.worst_index),
        err.worst_out,
        err.worst_ref,
        tol,
        source,
        eager_error,
    )
    failures = []
    if not err.rel_l2 <= tol:
        idx = [list(err.worst_index)] if err.worst_index is not None else []
        failures.append(
            Failure(
                "wrong values",
                name,
                f"relative L2 error {err.rel_l2:.3e} > tolerance {tol:.3e} ({source}); "
                f"max abs {err.max_abs:.3e}, max rel {err.max_rel:.3e}; worst element shown",
                idx,
                [err.worst_out] if idx else [],
                [err.worst_ref] if idx else [],
            )
        )
    mismatch = special_mismatch(got, _as_stored(ref, got.dtype))
    if base is not None and bool(mismatch.any()):
        # Where eager torch in the same dtype shows the candidate's pattern, the format
        # (not the kernel) decides: excused.
        mismatch &= special_mismatch(got, base)
    if bool(mismatch.any()):
        indices, g, e = first(mismatch, got, ref)
        failures.append(
            Failure(
                "NaN mismatch",
                name,
                f"{int(mismatch.sum())} element(s) whose NaN/Inf status differs from the reference",
                indices,
                g,
                e,
            )
        )
    return m, failures


def _as_stored(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The reference as the output's format would hold it (overflow to Inf included)."""
    if dtype.is_floating_point and ref.is_floating_point() and dtype != ref.dtype:
        with torch.no_grad():
            return ref.to(dtype)
    return ref


def unwritten(name: str, first_call: torch.Tensor, second_call: torch.Tensor) -> torch.Tensor:
    """Elements still holding the poison after both calls (a different poison each)."""
    p0 = bits(torch.full((1,), poison_value(first_call.dtype, 0), dtype=first_call.dtype))
    p1 = bits(torch.full((1,), poison_value(second_call.dtype, 1), dtype=second_call.dtype))
    return (bits(first_call.cpu()) == p0) & (bits(second_call.cpu()) == p1)


def unwritten_failure(name: str, mask: torch.Tensor, got: torch.Tensor, ref) -> Failure:
    indices, g, e = first(mask, got, ref)
    return Failure(
        "unwritten elements",
        name,
        f"{int(mask.sum())} of {mask.numel()} element(s) still hold the poison after two "
        "calls with different poisons: never written",
        indices,
        g,
        e,
    )


def differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elements whose bits differ between two results."""
    return bits(a.detach().cpu()) != bits(b.detach().cpu())
