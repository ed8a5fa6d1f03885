"""Row independence: which outputs can be checked on a sample of their rows (and columns).

An op declares ``Op(sampling=Sampling(...))`` when every output row depends only on the same
row of its row-indexed inputs (a norm, an activation, rope, a per-row or per-group
quantizer), and for a GEMM when every output element (i, j) depends only on row i of A and
column j of B. verify then calls a non-interpreted candidate on a shape at its full size and
computes the float64 reference on a random sample of rows (× columns) only.

Ops with a reduction across rows (attention over a sequence, a per-tensor scale, MoE routing
and alignment) declare nothing, or return False from ``applies`` for the shapes concerned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

Dim = int | Callable[[dict], int | None]


@dataclass(frozen=True)
class Sampling:
    """How rows (and columns) of an op's tensors line up.

    ``rows``: tensor name (an input, an output of ``Op.outputs`` or an in-place argument) → the
    dimension indexed by the row, the shape's ``batch_dim``. ``cols``: the same for columns,
    which run over the shape's ``col_dim`` (a GEMM's N); a dimension may be a function of the
    inputs (a weight's layout argument). A tensor whose dimension there is not the full size
    (a broadcast scale of size 1) is passed whole.

    ``tile``: the largest tile along each dimension that the op's kernels use (powers of two);
    on CPU an interpreted edge shape is never cut below two of them, and keeps the remainder.
    ``applies(inputs)``: False for inputs where rows are not independent (a per-tensor scale).
    ``cut``: sizes halved first when a full-size case is too big (see the field).
    ``outputs``: row dimensions of outputs and in-place arguments where they differ from
    ``rows`` (an output named like an input, with another layout).
    """

    rows: Mapping[str, Dim]
    cols: Mapping[str, Dim] = field(default_factory=dict)
    col_dim: str | None = None
    tile: Mapping[str, int] = field(default_factory=dict)
    applies: Callable[[dict], bool] | None = None
    outputs: Mapping[str, Dim] = field(default_factory=dict)
    #: Sizes a full-size case too big to be cheap may halve first (to multiples of the given
    #: step, never below it), before its rows: the columns of a row-wise op. A GEMM halves its
    #: ``Shape.reduce_to`` sizes (N, K).
    cut: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self):
        if self.cols and self.col_dim is None:
            raise ValueError("col_dim: Sampling with cols needs the shape size they run over")
        bad = [k for k, v in self.tile.items() if not isinstance(v, int) or v < 1]
        if bad:
            raise ValueError(f"tile: expected positive integers, got {bad}")

    def holds(self, inputs: dict) -> bool:
        return self.applies is None or bool(self.applies(inputs))

    @staticmethod
    def _dim(spec: Dim, inputs: dict) -> int | None:
        return spec(inputs) if callable(spec) else spec

    def take(self, name: str, t, inputs: dict, rows, cols, n_rows: int, n_cols, output=False):
        """``t`` (named ``name``; ``output``: an output or in-place result) restricted to the
        sampled ``rows`` and ``cols`` (index tensors); unchanged where ``name`` has no such
        dimension or it is not full size."""
        if not isinstance(t, torch.Tensor):
            return t
        row_specs = {**self.rows, **self.outputs} if output else self.rows
        for specs, idx, full in ((row_specs, rows, n_rows), (self.cols, cols, n_cols)):
            spec = specs.get(name)
            if spec is None or idx is None:
                continue
            dim = self._dim(spec, inputs)
            if dim is None or t.dim() == 0 or t.shape[dim] != full:
                continue
            t = t.index_select(dim, idx.to(t.device))
        return t

    def sub_inputs(self, inputs: dict, rows, cols, n_rows: int, n_cols: int | None) -> dict:
        """The inputs of the sampled rows and columns only (the reference runs on these)."""
        return {k: self.take(k, v, inputs, rows, cols, n_rows, n_cols) for k, v in inputs.items()}


def two_tiles(full: int, cap: int, tile: int) -> int:
    """The size an interpreted edge shape of ``full`` is cut to under ``cap``: at least two
    tiles of ``tile`` with the same remainder modulo ``tile`` (its last, partial tile kept),
    never more than ``full``."""
    if full <= cap:
        return full
    rem = full % tile
    target = max(cap, tile + rem if rem else 2 * tile)
    return min(full, target - (target - rem) % tile)
