"""Verdicts: failure classes, per-case results, and the report of a whole verify run."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Failure classes, most specific first: a case's class is the first of these it shows.
CLASSES = (
    "race",
    "interpreter error",
    "contract",
    "out-of-bounds write",
    "mutated input",
    "wrote outside its in-place region",
    "unwritten elements",
    "nondeterministic",
    "cached result",
    "full size",
    "wrong values",
    "NaN mismatch",
)

#: How many offending elements a failure lists.
SHOWN = 5


def json_float(value):
    """``value`` for JSON: a non-finite float as the string "nan", "inf" or "-inf" (JSON has
    no such numbers; an encoder would write both NaN and Inf as null), lists element-wise."""
    if isinstance(value, list | tuple):
        return [json_float(v) for v in value]
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


@dataclass
class Failure:
    """One thing a candidate got wrong, with the first offending elements.

    ``target`` names the output or argument concerned; ``indices`` are element indices in it
    (for canaries: offsets from the start of the buffer's first element, negative before it);
    ``got`` and ``expected`` are the values at those indices.
    """

    cls: str
    target: str
    message: str
    indices: list[list[int]] = field(default_factory=list)
    got: list = field(default_factory=list)
    expected: list = field(default_factory=list)
    trial: int = 0
    call: str = ""

    def __post_init__(self):
        if self.cls not in CLASSES:
            raise ValueError(f"cls: expected one of {CLASSES}, got {self.cls!r}")

    def as_dict(self) -> dict:
        return {
            "class": self.cls,
            "target": self.target,
            "message": self.message,
            "indices": self.indices,
            "got": json_float(self.got),
            "expected": json_float(self.expected),
            "trial": self.trial,
            "call": self.call,
        }

    def line(self, trial: dict | None = None) -> str:
        """One line; with the ``trial`` it happened in (a case's ``trials`` entry), the input
        distribution and where NaN/Inf were put are named."""
        where = ""
        if self.indices:
            shown = ", ".join(
                f"{tuple(i)}: {g!r} (expected {e!r})"
                for i, g, e in zip(self.indices, self.got, self.expected, strict=False)
            )
            where = f" — first at {shown}"
        inputs = ""
        if trial is not None:
            inputs = f" [{trial['dist']} inputs" + (
                f", NaN/Inf in {trial['specials']}]" if trial.get("specials") else "]"
            )
        return f"{self.cls}: {self.target}: {self.message}{where}{inputs}"


@dataclass
class Measure:
    """Worst error of one output or in-place argument over a case's trials."""

    target: str
    rel_l2: float
    max_abs: float
    max_rel: float
    worst_index: list[int] | None
    worst_got: float | None
    worst_expected: float | None
    tolerance: float
    tolerance_source: str
    eager_error: float | None

    @property
    def ratio(self) -> float:
        if self.tolerance > 0:
            return self.rel_l2 / self.tolerance
        return 0.0 if self.rel_l2 == 0 else float("inf")

    def as_dict(self) -> dict:
        return {
            "target": self.target,
            "rel_l2": json_float(self.rel_l2),
            "max_abs": json_float(self.max_abs),
            "max_rel": json_float(self.max_rel),
            "worst_index": self.worst_index,
            "worst_got": json_float(self.worst_got),
            "worst_expected": json_float(self.worst_expected),
            "tolerance": self.tolerance,
            "tolerance_source": self.tolerance_source,
            "eager_error": json_float(self.eager_error),
            "ratio": json_float(self.ratio),
        }


@dataclass
class CaseResult:
    """One op × variant × shape × dtype, over all its trials."""

    op: str
    variant: str
    shape_set: str
    shape: str
    shape_key: str
    dtype: str
    trials: list[dict] = field(default_factory=list)  # {seed, dist, specials}
    measures: dict[str, Measure] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: A full-size case: the output rows (and columns) the reference was computed on, drawn
    #: from ``seed`` (derived from the run seed): {seed, rows, of_rows, cols, of_cols}.
    sample: dict | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def failure_class(self) -> str | None:
        """The most specific failure class shown, or None when the case passed."""
        found = {f.cls for f in self.failures}
        return next((c for c in CLASSES if c in found), None)

    @property
    def classes(self) -> list[str]:
        found = {f.cls for f in self.failures}
        return [c for c in CLASSES if c in found]

    @property
    def worst_ratio(self) -> float:
        return max((m.ratio for m in self.measures.values()), default=0.0)

    def trial_of(self, f: Failure) -> dict | None:
        """The ``trials`` entry a failure happened in (None for an unknown trial)."""
        return self.trials[f.trial] if 0 <= f.trial < len(self.trials) else None

    def add_measure(self, m: Measure) -> None:
        old = self.measures.get(m.target)
        if old is None or m.ratio > old.ratio:
            self.measures[m.target] = m

    def as_dict(self) -> dict:
        return {
            "op": self.op,
            "variant": self.variant,
            "shape_set": self.shape_set,
            "shape": self.shape,
            "shape_key": self.shape_key,
            "dtype": self.dtype,
            "passed": self.passed,
            "failure_class": self.failure_class,
            "classes": self.classes,
            "worst_ratio": json_float(self.worst_ratio),
            "trials": self.trials,
            "measures": [m.as_dict() for m in self.measures.values()],
            "failures": [f.as_dict() for f in self.failures],
            "notes": self.notes,
            "sample": self.sample,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class AuditEntry:
    """One null candidate against one op: it must fail; if it passes the op is broken."""

    op: str
    null: str
    target: str
    dtype: str
    caught: bool
    failure_class: str | None
    worst_ratio: float
    cases: int = 0
    note: str = ""

    def as_dict(self) -> dict:
        return {
            "op": self.op,
            "null": self.null,
            "target": self.target,
            "dtype": self.dtype,
            "cases": self.cases,
            "caught": self.caught,
            "failure_class": self.failure_class,
            "worst_ratio": json_float(self.worst_ratio),
            "note": self.note,
        }


@dataclass
class Report:
    """Everything a verify run found; ``passed`` is True only if every case passed."""

    seed: int
    device: str
    trials: int
    shape_sets: list[str]
    cases: list[CaseResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    audit: list[AuditEntry] = field(default_factory=list)
    seconds: float = 0.0
    #: Full-size cases run smaller than declared (too big to be cheap): "op/variant label: cut".
    cut: list[str] = field(default_factory=list)
    #: numpy's floating-point warnings inside interpreted launches during the run, by message
    #: (an all-NaN row of scores where a query holds a planted NaN): counted, not printed.
    interpreter_warnings: dict[str, int] = field(default_factory=dict)

    def warnings_note(self) -> str | None:
        """One line summing up ``interpreter_warnings`` (None when there were none)."""
        if not self.interpreter_warnings:
            return None
        return (
            "the interpreter's numpy warnings, counted (NaN and Inf propagating through a "
            "kernel): " + ", ".join(f"{m} ×{n}" for m, n in self.interpreter_warnings.items())
        )

    @property
    def broken_ops(self) -> list[str]:
        """Ops with a null candidate that passed: their contract or inputs are too weak."""
        return list(dict.fromkeys(a.op for a in self.audit if not a.caught))

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases) and not self.broken_ops

    def groups(self) -> dict[tuple[str, str, str], list[CaseResult]]:
        """Cases grouped by (op, variant, shape set), in the order they ran."""
        out: dict[tuple[str, str, str], list[CaseResult]] = {}
        for c in self.cases:
            out.setdefault((c.op, c.variant, c.shape_set), []).append(c)
        return out

    def as_dict(self) -> dict:
        groups = []
        for (op, variant, shape_set), cases in self.groups().items():
            failed = [c for c in cases if not c.passed]
            classes = [k for c in failed for k in c.classes]
            groups.append(
                {
                    "op": op,
                    "variant": variant,
                    "shape_set": shape_set,
                    "passed": not failed,
                    "cases": len(cases),
                    "failed": len(failed),
                    "classes": list(dict.fromkeys(classes)),
                    "worst_ratio": json_float(max((c.worst_ratio for c in cases), default=0.0)),
                }
            )
        return {
            "schema": "kernelab.verify/1",
            "passed": self.passed,
            "versions": _versions(),
            "seed": self.seed,
            "device": self.device,
            "trials": self.trials,
            "shape_sets": self.shape_sets,
            "seconds": round(self.seconds, 3),
            "groups": groups,
            "cases": [c.as_dict() for c in self.cases],
            "skipped": self.skipped,
            "cut": self.cut,
            "interpreter_warnings": self.interpreter_warnings,
            "audit": [a.as_dict() for a in self.audit],
            "broken_ops": self.broken_ops,
        }


def _versions() -> dict:
    import platform

    import torch
    import triton

    import kernelab

    return {
        "kernelab": kernelab.__version__,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }
