"""The verify stage of ``kernelab run``: every variant that runs here, representative and edge
shapes, the default trials, on the quick tier (``_runner.TIERS``; ``full``: every shape on
every dtype, what ``kernelab verify`` does by default); one cell per op × variant: pass or the
failure class, with the worst error / tolerance. Its notes give the run seed (``seed``: a
given one, to repeat a run), for each failing case the command that repeats it, and the
interpreter's numpy warnings, counted."""

from __future__ import annotations

from kernelab.stages import Cell, StageReport
from kernelab.verify._runner import verify


def stage(
    ops, device, progress=None, *, variants=None, ledger_url=None, full=False, seed=None
) -> StageReport:
    dev = _device_name(device)
    tier = "full" if full else "quick"
    report = verify(ops, variants=variants, device=dev, seed=seed, progress=progress, tier=tier)
    out = StageReport("verify")
    again = " --full" if full else ""
    out.notes.append(
        f"verify seed {report.seed} ({tier} tier; kernelab run{again} --seed {report.seed} "
        "repeats it)"
    )
    for case in report.cases:
        if not case.passed:
            again = repeat_command(case, report.seed, dev, tier)
            out.notes.append(f"  {case.failure_class}: {again}")
    warned = report.warnings_note()
    if warned:
        out.notes.append(warned)
    out.skipped = [f"{line}" for line in report.skipped]
    for line in report.skipped:
        key, _, why = line.partition(": ")
        op, _, variant = key.partition("/")
        if variant:
            out.cells[(op, variant)] = Cell("skip", why)
    by_variant: dict[tuple[str, str], list] = {}
    for case in report.cases:
        by_variant.setdefault((case.op, case.variant), []).append(case)
    for key, cases in by_variant.items():
        worst = max((c.worst_ratio for c in cases), default=0.0)
        failed = [c for c in cases if not c.passed]
        data = {
            "cases": len(cases),
            "failed": len(failed),
            "worst_ratio": worst,
            "seed": report.seed,
            "classes": list(dict.fromkeys(k for c in failed for k in c.classes)),
        }
        if failed:
            first = failed[0]
            trial = first.trial_of(first.failures[0]) if first.failures else None
            dist = f", {trial['dist']} inputs" if trial else ""
            text = (
                f"fail: {first.failure_class} ({len(failed)}/{len(cases)} cases), "
                f"worst {worst:.2f}× tol; e.g. {first.shape_set} {first.shape} {first.dtype}"
                f"{dist}"
            )
            out.cells[key] = Cell("fail", text, data)
        else:
            out.cells[key] = Cell("pass", f"pass: {len(cases)} cases, worst {worst:.2f}× tol", data)
    return out


def _device_name(device) -> str:
    kind = getattr(device, "type", None) or str(device)
    index = getattr(device, "index", None)
    return kind if kind == "cpu" or index is None else f"{kind}:{index}"


def repeat_command(case, seed: int, device: str, tier: str) -> str:
    """The command that repeats a failing case: the same op, variant, seed and tier give the
    same inputs (a trial's distribution follows the case's place in its op's run, so the
    whole op is run again; the case's shape set, shape and dtype say where to look)."""
    quick = " --quick" if tier == "quick" else ""
    return (
        f"kernelab verify {case.op} --variant {case.variant} --device {device} --seed {seed}"
        f"{quick}  # {case.shape_set} {case.shape!r} {case.dtype}"
    )
