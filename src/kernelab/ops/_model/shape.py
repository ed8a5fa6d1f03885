"""Shapes: one case of a shape set, with the sizes the interpreter may cut."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

#: Shape sets every op declares.
SHAPE_SETS = ("representative", "edge")


@dataclass(frozen=True)
class Shape:
    """One case of a shape set: sizes, options, and a label saying where it comes from.

    ``batch_dim`` names the size (rows, tokens, M) that may be cut down when a kernel runs
    through the interpreter, without changing what each program does. ``reduce_to`` names other
    sizes and the value each is cut to at the same time (a GEMM's N and K, whose full sizes
    would take minutes through the interpreter); empty for most ops.
    """

    label: str
    dims: Mapping[str, int]
    params: Mapping[str, Any] = field(default_factory=dict)
    batch_dim: str | None = None
    reduce_to: Mapping[str, int] = field(default_factory=dict)

    def reduced(self, cap: int) -> Shape:
        """This shape with its batch size at most ``cap`` and the sizes in ``reduce_to`` at most
        their given values (itself if already small enough); the label lists every cut."""
        dims = dict(self.dims)
        cuts = []
        if self.batch_dim is not None and dims[self.batch_dim] > cap:
            dims[self.batch_dim] = cap
            cuts.append(f"{self.batch_dim}→{cap}")
        for name, size in self.reduce_to.items():
            if dims[name] > size:
                dims[name] = size
                cuts.append(f"{name}→{size}")
        if not cuts:
            return self
        return replace(self, dims=dims, label=f"{self.label} [{', '.join(cuts)}]")

    @property
    def key(self) -> str:
        """A stable identity for the ledger: sizes and options, sorted."""
        dims = ",".join(f"{k}={v}" for k, v in self.dims.items())
        params = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{dims};{params}" if params else dims

    def as_dict(self) -> dict:
        return {
            "label": self.label,
            "dims": dict(self.dims),
            "params": dict(self.params),
            "batch_dim": self.batch_dim,
            "reduce_to": dict(self.reduce_to),
        }


ShapeSets = Mapping[str, Callable[[], Sequence[Shape]]]
