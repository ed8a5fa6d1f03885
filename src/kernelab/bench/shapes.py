"""Which shapes a bench runs: a set's shapes (filtered, rows capped) or explicit sizes."""

from __future__ import annotations

from kernelab.ops._model import Shape


def parse_dims(text: str, arg: str = "--shape") -> dict[str, int]:
    """``"rows=4096,cols=8192"`` -> ``{"rows": 4096, "cols": 8192}`` (positive integers)."""
    dims = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name.isidentifier() or not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"{arg}: expected sizes as name=positive integer, comma-separated "
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
    if cfg.dims:  # the sizes asked for, cut only by an explicit --max-rows
        shapes = explicit_shapes(op, cfg.dims, cfg.shape_set)
        return [s.reduced(cfg.max_rows) for s in shapes] if cfg.max_rows else shapes
    shapes = [s for s in op.shapes(cfg.shape_set) if all(v > 0 for v in s.dims.values())]
    if cfg.shapes:
        shapes = [s for s in shapes if any(k in s.label for k in cfg.shapes)]
    if max_rows:
        shapes = [s.reduced(max_rows) for s in shapes]
    return shapes
