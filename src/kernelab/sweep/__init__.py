"""Sweeps: inspect, verify, bench and tune over ops × shapes × dtypes × configs × targets, as
independent tasks on a process pool or on Ray, every result in one ledger.

Python API::

    from kernelab import sweep
    spec = sweep.validate({"kind": "inspect", "ops": ["rmsnorm"], "targets": ["sm_90"]})
    tasks, skipped = sweep.expand(spec)
    result = sweep.run_sweep(spec, ledger="l.sqlite", engine="local")

- :mod:`kernelab.sweep.spec`: the spec's keys and their validation (files parsed, never run);
- :mod:`kernelab.sweep.tasks`: tasks, their keys and resource requests, the cost estimate;
- :mod:`kernelab.sweep.work`: one task through the instrument's Python API;
- :mod:`kernelab.sweep.engines`: ``local`` (forked workers) and ``ray``;
- :mod:`kernelab.sweep.runner`: retries, resume, interrupts, the ledger writes.

Nothing is imported from Ray unless the Ray engine is used.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernelab.sweep.runner import Progress, SweepInterrupted, SweepResult, sweep_id
from kernelab.sweep.spec import DEFAULT_MAX_TASKS, KINDS, SpecError, SweepSpec, load, validate
from kernelab.sweep.tasks import Task, count, estimate, expand, resources


def run_sweep(
    spec: SweepSpec | Mapping,
    ledger=None,
    engine: str = "local",
    jobs: int | None = None,
    address: str | None = None,
    progress=None,
    max_tasks: int | None = None,
) -> SweepResult:
    """Validate (a dict), expand and run ``spec`` into the ledger ``ledger`` (a URL, path or
    an open :class:`kernelab.ledger.Ledger`; None: the default ledger). ``max_tasks``: the
    task limit (default: KERNELAB_SWEEP_MAX_TASKS, else :data:`DEFAULT_MAX_TASKS`)."""
    from kernelab import ledger as ledger_mod
    from kernelab.sweep import engines, runner

    if not isinstance(spec, SweepSpec):
        spec = validate(spec, max_tasks)
    tasks, skipped = expand(spec, max_tasks)
    own = not isinstance(ledger, ledger_mod.Ledger)
    db = ledger_mod.open(ledger) if own else ledger
    try:
        eng = engines.make(engine, jobs, address)
        try:
            result = runner.run(spec, db, eng, progress, tasks=tasks)
        finally:
            eng.close()
    finally:
        if own:
            db.close()
    result.skipped = skipped
    return result


__all__ = [
    "DEFAULT_MAX_TASKS",
    "KINDS",
    "Progress",
    "SpecError",
    "SweepInterrupted",
    "SweepResult",
    "SweepSpec",
    "Task",
    "count",
    "estimate",
    "expand",
    "load",
    "resources",
    "run_sweep",
    "sweep_id",
    "validate",
]
