"""What ``kernelab run`` runs: one stage per instrument, each returning cells for a table.

A stage is a function ``stage(ops, device, progress, *, variants=None, ledger_url=None) ->
StageReport`` (``variants``: the variants asked for, None for the stage's default;
``ledger_url``: the ledger the run reads and writes; a stage that also takes ``full`` gets
``full=True`` from ``kernelab run --full``, for its full sets instead of its quick tier, and
one that takes ``seed`` gets ``kernelab run --seed``'s, to repeat a run).
Instruments expose one and list it in ``RUN_STAGES``; ``kernelab run`` runs them in order,
prints one table, and stores the cases the stages return (``StageReport.cases``) in the ledger
as one run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

#: ``module:function`` of each stage, in the order they run and appear as table columns.
RUN_STAGES: tuple[str, ...] = (
    "kernelab.verify:stage",
    "kernelab.inspect:stage",
    "kernelab.bench:stage",
)


@dataclass
class Cell:
    status: str  # "pass" | "fail" | "skip" | "info"
    text: str
    data: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in ("pass", "fail", "skip", "info"):
            raise ValueError(f"status: expected pass, fail, skip or info, got {self.status!r}")


@dataclass
class StageReport:
    stage: str
    #: (op name, variant name) -> cell; variant "*" for a cell about the whole op.
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    #: What the stage did not do here, and why (one line each), e.g. for lack of a GPU.
    skipped: list[str] = field(default_factory=list)
    #: Ledger cases to store (as ``kernelab bench`` stores them), and their provenance.
    cases: list[dict] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)
    #: Lines printed under the card (the run's seed, a command repeating each failure).
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.cells.values())


def load(path: str) -> Callable:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
