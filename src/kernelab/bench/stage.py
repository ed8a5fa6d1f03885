"""The bench stage of ``kernelab run``: a short timing of every op that can be timed here.

On the CPU: eager torch (the Triton variant runs through the interpreter there, and
torch.compile takes ~20 s to start), on the first two representative shapes with rows capped,
in the op's first dtype, with a loose stopping rule. On a GPU: every variant, the whole
representative set in bf16 where the op takes it, within a time budget.
"""

from __future__ import annotations

import time

import torch

from kernelab.bench.runner import BenchConfig, bench_case, subjects_for
from kernelab.bench.stats import StopRule
from kernelab.core.runtime.backends import INTERPRETED
from kernelab.stages import Cell, StageReport

CPU_STAGE_RULE = StopRule(rel_ci=0.05, min_samples=5, min_time=0.02, max_time=0.3)
CPU_ROWS, CPU_SHAPES = 64, 2
GPU_BUDGET_S = 120.0


def _short(why: str) -> str:
    if why.startswith(INTERPRETED):
        return "interpreter on CPU: not timed"
    if why.startswith("torch.compile on CPU"):
        return "not timed on CPU (bench --compile)"
    return why[:40]


def _cell(cases: list[dict]) -> Cell:
    bad = [c for c in cases if not c["metrics"]["valid"]]
    if bad:
        c = bad[0]
        return Cell("fail", f"{c['shape_label']}: {c['flags'][0]}", {"invalid": len(bad)})
    pcts = [c["metrics"]["pct_roofline"] for c in cases if c["metrics"].get("pct_roofline")]
    med = sorted(c["metrics"]["median_s"] for c in cases)[len(cases) // 2]
    text = f"{med * 1e6:.1f} µs median"
    if pcts:
        text += f", {min(pcts):.0f}–{max(pcts):.0f}% roofline"
    data = {"cases": len(cases), "median_s": med, "pct_roofline": pcts}
    data["ceiling_source"] = cases[0]["metrics"].get("ceiling_source")
    return Cell("pass", text, data)


def stage_shapes(op, cpu: bool) -> list:
    """The shapes the stage benches: on the CPU the first representative ones, rows capped; on
    a GPU all of them. A size of 0 counts like any other (paged attention's ``window`` 0 is no
    window); an empty shape is skipped by ``bench_case``, saying so."""
    if cpu:
        return [s.reduced(CPU_ROWS) for s in op.shapes("representative")][:CPU_SHAPES]
    return op.shapes("representative")


def stage(ops, device, progress=None, *, variants=None, ledger_url=None) -> StageReport:
    """Cells per op and variant; the timed cases in ``report.cases``, for the ledger."""
    from kernelab.bench.api import ceilings_for, open_ledger
    from kernelab.bench.telemetry import open_telemetry
    from kernelab.bench.timers import timer_for

    report = StageReport("bench")
    if variants is not None:
        known = {v for op in ops for v in op.variants}
        unknown = [v for v in variants if v not in known]
        if unknown:
            raise ValueError(f"variants: expected names among {sorted(known)}, got {unknown}")
    db = None
    try:
        db = open_ledger(ledger_url)
    except Exception as exc:  # a broken ledger must not stop the report card
        report.skipped.append(f"bench: ledger unavailable ({exc}); ceilings not stored")
    ceilings, note = ceilings_for(device, db, progress=progress)
    if note:
        report.skipped.append(f"bench: {note}")
    cpu = device.type == "cpu"
    dev = "cpu" if cpu else f"cuda:{device.index}"
    timer = timer_for(dev)
    telemetry = open_telemetry(device)
    spent = 0.0
    for op in ops:
        names = None if variants is None else tuple(v for v in variants if v in op.variants)
        if names == ():
            continue
        if cpu:
            cfg = BenchConfig(
                rule=CPU_STAGE_RULE, max_rows=CPU_ROWS, energy_window_s=0, variants=names
            )
            dtypes = op.dtypes[:1]
        else:
            cfg = BenchConfig(energy_window_s=0, variants=names)
            dtypes = (torch.bfloat16,) if torch.bfloat16 in op.dtypes else op.dtypes[:1]
        shapes = stage_shapes(op, cpu)
        subjects, skipped = subjects_for(op, device.type, cfg)
        report.skipped.extend(skipped)
        for line in skipped:
            name, why = line.split(": ", 1)
            report.cells[(op.name, name.split("/", 1)[1])] = Cell("skip", _short(why))
        by_variant: dict[str, list[dict]] = {}
        for shape in shapes:
            for dt in dtypes:
                if not cpu and spent > GPU_BUDGET_S:
                    report.skipped.append(f"bench {op.name}: GPU stage budget spent")
                    break
                if progress:
                    progress(f"bench {op.name} {shape.label}")
                t0 = time.perf_counter()
                untimed: list[str] = []
                cases = bench_case(
                    op, shape, dt, subjects, device, timer, ceilings, cfg, telemetry, untimed
                )
                spent += time.perf_counter() - t0
                report.skipped.extend(untimed)
                for line in untimed:
                    name, why = line.split(": ", 1)
                    report.cells[(op.name, name.split("/", 1)[1])] = Cell("skip", _short(why))
                report.cases.extend(cases)
                for c in cases:
                    by_variant.setdefault(c["variant"], []).append(c)
        for name, cases in by_variant.items():
            report.cells[(op.name, name)] = _cell(cases)
    rule = CPU_STAGE_RULE if cpu else None
    report.provenance = {
        "config": {
            "source": "kernelab run (bench stage)",
            "shape_set": "representative",
            "rule": None if rule is None else rule.as_dict(),
            "max_rows": CPU_ROWS if cpu else None,
            "shapes_per_op": CPU_SHAPES if cpu else None,
        },
        "ceilings": ceilings.as_dict(),
    }
    return report
