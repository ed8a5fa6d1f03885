"""Which shapes a bench runs: a set's shapes (filtered, rows capped) or explicit sizes.

A size of 0 is a size like any other: some dims are switches whose 0 means "off" (paged
attention's ``window`` and ``chunk``), others make a shape empty (``rows=0``). Which is which
shows only in the inputs, so a shape is judged empty where its inputs are made
(:func:`empty_inputs`), never by its dims.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kernelab.core import Shape


def parse_dims(text: str, arg: str = "--shape") -> dict[str, int]:
    """``"rows=4096,cols=8192"`` -> ``{"rows": 4096, "cols": 8192}`` (integers ≥ 0: a 0 may
    switch a feature off, as ``window=0`` does)."""
    dims = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name.isidentifier() or not value.isdigit():
            raise ValueError(
                f"{arg}: expected sizes as name=integer ≥ 0, comma-separated "
                f"(rows=4096,cols=8192), got {part!r} in {text!r}"
            )
        if name in dims:
            raise ValueError(f"{arg}: {name!r} given twice in {text!r}")
        dims[name] = int(value)
    return dims


def dims_label(dims: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


def explicit_shapes(op, dims_list, shape_set: str = "representative") -> list[Shape]:
    """Shapes of ``op`` with the sizes given: every dim of the op, no other. Options (a norm's
    residual, ...) come from the set's shapes: one shape per distinct set of options."""
    templates = op.shapes(shape_set) or op.shapes("representative")
    shapes = []
    for dims in dims_list:
        want = set(templates[0].dims) if templates else set()
        if set(dims) != want:
            raise ValueError(
                f"--shape: {op.name} takes sizes {sorted(want)}, got {sorted(dims)} "
                f"(a value without '=' filters shape labels instead)"
            )
        seen = []
        for t in templates:
            if t.params in seen:
                continue
            seen.append(t.params)
            options = [
                f"+{k}" if v is True else f"{k}={v}"
                for k, v in t.params.items()
                if isinstance(v, bool | int | float | str) and v is not False
            ]
            ordered = {k: dims[k] for k in t.dims}  # the op's own order: one key per size
            label = " ".join([dims_label(ordered), *options])
            shapes.append(Shape(label, ordered, dict(t.params), t.batch_dim, dict(t.reduce_to)))
    return shapes


def select_shapes(op, cfg, max_rows: int | None) -> list[Shape]:
    """The shapes of ``op`` a bench asks for: the sizes given, or the set's shapes whose label
    contains one of ``cfg.shapes`` (all without a filter), batch cut to ``max_rows``. Empty
    when a filter matches no label of this op (:func:`unmatched` says so)."""
    if cfg.dims:  # the sizes asked for, cut only by an explicit --max-rows
        shapes = explicit_shapes(op, cfg.dims, cfg.shape_set)
        return [s.reduced(cfg.max_rows) for s in shapes] if cfg.max_rows else shapes
    shapes = op.shapes(cfg.shape_set)
    if cfg.shapes:
        shapes = [s for s in shapes if any(k in s.label for k in cfg.shapes)]
    if max_rows:
        shapes = [s.reduced(max_rows) for s in shapes]
    return shapes


#: How many labels an error lists before it counts the rest.
LABELS_SHOWN = 12


def unmatched(op, cfg) -> str:
    """Why a ``--shape`` filter selected nothing of ``op``: the filter and the labels there are."""
    labels = [s.label for s in op.shapes(cfg.shape_set)]
    shown = "; ".join(labels[:LABELS_SHOWN])
    if len(labels) > LABELS_SHOWN:
        shown += f"; … {len(labels) - LABELS_SHOWN} more (kernelab ops {op.name})"
    wanted = " or ".join(repr(k) for k in cfg.shapes)
    return (
        f"--shape: no {cfg.shape_set} shape of {op.name} has a label containing {wanted}; "
        f"its labels: {shown}"
    )


def empty_inputs(inputs: Mapping) -> list[str]:
    """The input tensors with no elements: a shape that has one gives nothing to time."""
    return [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.numel() == 0]


def inputs_key(inputs: Mapping) -> str:
    """A shape key made from the inputs themselves (for an op whose shape has no sizes: a
    user's inputs): each tensor's name, sizes and dtype, each other scalar's value."""
    parts = []
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            sizes = "x".join(map(str, v.shape)) or "scalar"
            parts.append(f"{name}={sizes}:{str(v.dtype).removeprefix('torch.')}")
        elif isinstance(v, bool | int | float | str) or v is None:
            parts.append(f"{name}={v}")
    return ",".join(parts) or "no inputs"
