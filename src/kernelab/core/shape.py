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

    ``declared`` holds the sizes before :meth:`reduced` cut them (empty for a shape as declared;
    :attr:`full_dims` reads either). An op whose launch decisions depend on sizes that a cut
    changes (how many parts split-KV attention splits a context into, say) takes them from the
    declared sizes, so that each program does what it does at full size, over fewer tiles.
    """

    label: str
    dims: Mapping[str, int]
    params: Mapping[str, Any] = field(default_factory=dict)
    batch_dim: str | None = None
    reduce_to: Mapping[str, int] = field(default_factory=dict)
    declared: Mapping[str, int] = field(default_factory=dict)

    @property
    def full_dims(self) -> Mapping[str, int]:
        """The sizes as declared, before any cut for the interpreter."""
        return self.declared or self.dims

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
        return replace(
            self,
            dims=dims,
            label=f"{self.label} [{', '.join(cuts)}]",
            declared=dict(self.full_dims),
        )

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
            "declared": dict(self.declared),
        }


ShapeSets = Mapping[str, Callable[[], Sequence[Shape]]]
