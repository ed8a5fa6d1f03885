"""Inspect every op's launches, and the ``kernelab run`` stage (sm_90 by default)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kernelab.inspect.ops import plan
from kernelab.inspect.report import KernelReport, analyze_jobs
from kernelab.inspect.targets import Target, parse_targets
from kernelab.stages import Cell, StageReport

#: Target of the ``kernelab run`` stage.
RUN_TARGET = "sm_90"
#: The dtype the run card inspects (plain ``kernelab inspect``: every dtype the op takes).
RUN_DTYPE = "bfloat16"


@dataclass
class Inspection:
    reports: list[KernelReport] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    triton: str = ""
    #: Reports taken from the baseline unchanged (same cache key), not compiled.
    trusted: int = 0


def inspect_ops(
    ops,
    targets: str | Sequence[Target] | None = None,
    space: bool = False,
    dtypes: Sequence[str] | None = None,
    jobs: int | None = None,
    use_cache: bool = True,
    progress: Callable[[int, int], None] | None = None,
    trust: dict | None = None,
    shown: bool = False,
) -> Inspection:
    """Compile (or read cached) every kernel each op launches for its representative shapes;
    with ``trust`` (a baseline), not those whose entry there has the same cache key (with
    ``shown``, only entries that keep what their report shows: see ``baseline.trust``)."""
    from kernelab.inspect.baseline import trust as trusted_reports
    from kernelab.inspect.compile import triton_version

    tgts = parse_targets(targets) if targets is None or isinstance(targets, str) else targets
    p = plan(ops, list(tgts), space=space, dtypes=dtypes)
    reports, n_trusted = trusted_reports(p.jobs, trust, shown=shown)
    todo = [i for i, r in enumerate(reports) if r is None]
    if todo:
        fresh = analyze_jobs([p.jobs[i] for i in todo], jobs, use_cache, progress)
        for i, rep in zip(todo, fresh, strict=True):
            reports[i] = rep
    return Inspection(reports, p.skipped, triton_version(), n_trusted)


def stage(ops, device=None, progress=None, *, variants=None, ledger_url=None) -> StageReport:
    """One cell per op: its worst sm_90 kernel summary, or its first finding (``variants`` is
    not used: what is compiled is the op's Triton kernels; nothing goes to the ledger). A
    kernel whose entry in the checkout's committed baseline has its cache key (same source,
    launch, compiler) is read from there, not compiled again; the cell's data counts them."""
    from kernelab.inspect import baseline

    report = StageReport(f"inspect {RUN_TARGET} {RUN_DTYPE}")

    def tick(done: int, total: int) -> None:
        if progress:
            progress(f"inspect: compiled {done}/{total} for {RUN_TARGET}")

    trust, path = None, baseline.project_path()
    if path is not None:
        try:
            trust = baseline.load(path)
        except (OSError, ValueError) as exc:  # a broken baseline costs compiling, not the card
            report.skipped.append(f"inspect baseline not used: {exc}")
    result = inspect_ops(
        ops, RUN_TARGET, dtypes=(RUN_DTYPE,), progress=tick, trust=trust, shown=True
    )
    if progress and result.trusted:
        progress(
            f"inspect: {result.trusted} of {len(result.reports)} kernels read from {path.name} "
            "(cache keys unchanged), not compiled"
        )
    report.skipped.extend(result.skipped)
    by_op: dict[str, list[KernelReport]] = {}
    for rep in result.reports:
        by_op.setdefault(rep.op, []).append(rep)
    for op in ops:
        reps = by_op.get(op.name)
        if not reps:
            if op.launches is None:
                report.cells[(op.name, "*")] = Cell("skip", "no launches declared")
            continue
        # The row of the op's Triton variant (its kernels are what was compiled).
        row = next((v.name for v in op.variants.values() if v.compiles_for(RUN_TARGET)), "*")
        if all(r.unsupported for r in reps):
            report.cells[(op.name, row)] = Cell("skip", reps[0].summary())
            continue
        reps = [r for r in reps if not r.unsupported]
        errors = [r for r in reps if not r.ok]
        warns = [(r, f) for r in reps for f in r.findings if f.severity == "warn"]
        from_baseline = sum(r.trusted is not None for r in reps)
        data = {"kernels": len(reps), "triton": result.triton, "from_baseline": from_baseline}
        if errors:
            r = errors[0]
            text = r.error or next(f.message for f in r.findings if f.severity == "error")
            report.cells[(op.name, row)] = Cell("fail", f"{r.kernel}: {text}", data)
        elif warns:
            r, f = warns[0]
            report.cells[(op.name, row)] = Cell("info", f"{r.kernel}: {f.message}", data)
        else:
            worst = min(reps, key=lambda r: (r.occupancy or {}).get("occupancy", 1.0))
            report.cells[(op.name, row)] = Cell("pass", worst.summary(), data)
    return report
