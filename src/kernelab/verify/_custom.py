"""Verifying a callable against a user's own reference and input generator (unknown ops).

The input generator is called as ``make_inputs(seed=..., dist=..., device=...)`` (each keyword
only if it accepts it) and returns the inputs dict; ``dist`` is one of
``kernelab.core.runtime.inputs.DISTRIBUTIONS``. The reference is called on float64 CPU copies of the
inputs (the truth) and on the inputs as generated (the baseline the tolerance is derived from,
as eager torch is for registered ops). Nothing is declared in place: any change to an input is
reported.

With explicit sizes (``dims``: ``kernelab bench --shape rows=4096,cols=8192``), each size is
passed to the generator as a keyword of that name as well; it must take them all.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from kernelab._loader import check_signature
from kernelab.ops import Contract, Cost, Op, Shape, as_tuple
from kernelab.verify._case import Subject
from kernelab.verify._runner import (
    DEFAULT_TRIALS,
    _check_common,
    candidate_on,
    default_device,
    new_seed,
    run_subject,
)
from kernelab.verify._types import Report


def _kwargs_for(fn: Callable, **available) -> dict:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return available
    return {k: v for k, v in available.items() if k in params}


def custom_op(
    reference: Callable,
    make_inputs: Callable,
    device,
    name: str = "custom",
    dims: Sequence[Mapping[str, int]] = (),
) -> Op:
    """An unregistered op built from a user's reference and input generator; its shapes are
    the ``dims`` given (each passed to the generator by keyword), or one: "user inputs"."""
    for d in dims:
        taken = _kwargs_for(make_inputs, **d)
        missing = [k for k in d if k not in taken]
        if missing:
            raise ValueError(
                f"inputs: the generator takes no argument {', '.join(map(repr, missing))} "
                f"(the sizes given with --shape are passed to it by name)"
            )

    def generate(seed: int, dist: str = "normal", sizes: Mapping[str, int] | None = None) -> dict:
        given = dict(sizes or {})
        inputs = make_inputs(
            **_kwargs_for(make_inputs, seed=seed, dist=dist, device=device, **given)
        )
        if not isinstance(inputs, dict) or not all(isinstance(k, str) for k in inputs):
            raise TypeError(
                f"inputs: expected the generator to return a dict of argument name -> value, "
                f"got {type(inputs).__name__}"
            )
        return inputs

    shapes = [Shape(",".join(f"{k}={v}" for k, v in d.items()), dict(d)) for d in dims] or [
        Shape("user inputs", {})
    ]
    sample = generate(0, sizes=shapes[0].dims)
    floats = [
        v.dtype for v in sample.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
    ]
    dtype = floats[0] if floats else torch.float32
    n_out = len(
        as_tuple(
            reference(
                **{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sample.items()}
            )
        )
    )

    def make(shape_, dtype_, device_, gen, dist):
        return generate(int(gen.initial_seed()), dist, sizes=shape_.dims)

    return Op(
        name,
        description="a user's op: their reference and input generator",
        reference=reference,
        make_inputs=make,
        shapes={"representative": lambda: list(shapes), "edge": lambda: list(shapes)},
        cost=lambda inputs: Cost(0.0, 0.0),
        contract=Contract(),
        dtypes=(dtype,),
        outputs=tuple(f"out{i}" if n_out > 1 else "out" for i in range(n_out)),
        out_arg=None,
    )


def user_op(reference: Callable, make_inputs: Callable, device, name: str = "custom", dims=()):
    """:func:`custom_op`, with a failure of the user's code as one line naming what failed."""
    try:
        return custom_op(reference, make_inputs, device, name=name, dims=dims)
    except (TypeError, ValueError):
        raise
    except Exception as exc:  # the user's code
        raise ValueError(
            f"reference: generating inputs or calling the reference on them raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def verify_custom(
    fn: Callable,
    reference: Callable,
    make_inputs: Callable,
    device: str | torch.device | None = None,
    seed: int | None = None,
    trials: int = DEFAULT_TRIALS,
    name: str = "candidate",
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Verify ``fn`` against ``reference`` on inputs from ``make_inputs`` (module docstring)."""
    _check_common(trials, seed)
    for arg, value in (("fn", fn), ("reference", reference), ("inputs", make_inputs)):
        if not callable(value):
            raise TypeError(f"{arg}: expected a callable, got {type(value).__name__}")
    device = str(device or default_device())
    seed = new_seed() if seed is None else seed
    op = user_op(reference, make_inputs, device)
    sample = op.inputs(op.shapes("representative")[0], op.dtypes[0], device, seed=0)
    check_signature(fn, list(sample))
    report = Report(seed, device, trials, ["representative"])
    started = time.perf_counter()
    run_subject(
        report,
        op,
        Subject(name, candidate_on(fn, device)),
        ["representative"],
        op.dtypes,
        device,
        trials,
        0,
        reference,
        progress,
    )
    report.seconds = time.perf_counter() - started
    return report
