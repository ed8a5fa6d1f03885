"""``kernelab bench OP --sweep DIM=...``: a crossover study, timed or from floors."""

from __future__ import annotations

from pathlib import Path

import click

from kernelab.cli._common import doing, emit_json, kept, spinner


def run(
    names, sweep, variants, floors_for, dtypes, shape_set, labels, device, knobs,
    ledger_url, no_ledger, label, as_json, html_out,
):  # fmt: skip
    from kernelab.bench import crossover as cx
    from kernelab.cli._common import select_ops

    dim, values = cx.parse_sweep(sweep)
    ops = select_ops(list(names)) if names else []
    if dtypes is not None and len(dtypes) != 1:
        raise ValueError(f"dtype: a sweep takes one dtype, got {len(dtypes)}")
    if floors_for:
        from kernelab.workloads.model_cost import device_spec

        spec = device_spec(floors_for)  # any device of the table, or an error naming them
        if len(ops) != 2:
            raise ValueError(
                "ops: --sweep with --floors-for compares two ops by their cost models "
                f"(bench gemm w4a16_gemm --sweep M=1..4096 --floors-for h200), got {len(ops)}; "
                "variants of one op share its cost model, so their floors are equal"
            )
        if variants:
            raise ValueError("variants: floors compare ops, not variants; drop --variant")
        a, b = ops
        dtype = dtypes[0] if dtypes else _common_dtype(a, b)
        study = cx.floors(spec, a, b, dim, values, dtype, labels=labels or None)
        run_id = None
    else:
        if len(ops) != 1:
            raise ValueError(
                f"ops: a timed --sweep takes one op and two of its variants, got {len(ops)} op(s)"
                " (two ops: add --floors-for DEVICE)"
            )
        if len(variants or ()) != 2:
            raise ValueError(
                f"variants: a timed --sweep compares two variants (--variants a,b), got "
                f"{list(variants or ())}"
            )
        study, _, run_id = _measure(
            ops[0], variants, dim, values, dtypes, shape_set, labels, device, knobs,
            ledger_url, no_ledger, label,
        )  # fmt: skip
    data = study.as_dict()
    if html_out:
        from kernelab.report.html import render_study

        path = Path(html_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_study(data), encoding="utf-8")
        kept(f"{path}: the study's chart")
    if as_json:
        emit_json({**data, "run_id": run_id})
    else:
        _print(study, run_id, html_out)


def _common_dtype(a, b):
    shared = [d for d in a.dtypes if d in b.dtypes]
    if not shared:
        raise ValueError(f"dtype: {a.name} and {b.name} take no dtype in common")
    import torch

    return torch.bfloat16 if torch.bfloat16 in shared else shared[0]


def _measure(op, variants, dim, values, dtypes, shape_set, labels, device, knobs,
             ledger_url, no_ledger, label):  # fmt: skip
    from dataclasses import replace

    import torch

    from kernelab import bench
    from kernelab.bench import crossover as cx
    from kernelab.bench.runner import CPU_RULE, GPU_RULE, BenchResult
    from kernelab.bench.telemetry import open_telemetry
    from kernelab.bench.timers import timer_for
    from kernelab.cli._common import record_bench
    from kernelab.hardware import detect

    info = detect(device)
    rule = CPU_RULE if info.type == "cpu" else GPU_RULE
    cx.base_shape(op, dim, shape_set, labels or None)  # bad input fails before any timing
    changes = {k: knobs[k] for k in ("rel_ci", "min_samples", "max_time") if knobs[k] is not None}
    if "max_time" in changes:
        changes["min_time"] = min(rule.min_time, changes["max_time"])
    cfg = bench.BenchConfig(
        shape_set=shape_set,
        mode=knobs["mode"],
        rule=replace(rule, **changes),
        seed=knobs["seed"],
        compile=knobs["compile"],
    )
    cx.timed_subjects(op, tuple(variants), info.type, cfg)
    db = None if no_ledger else bench.open_ledger(ledger_url)
    with spinner() as say:

        def progress(msg: str) -> None:
            say(msg)
            doing(msg)

        ceilings, note = bench.ceilings_for(info, db, progress=progress)
        dev = "cpu" if info.type == "cpu" else f"cuda:{info.index}"
        study, cases, skipped = cx.measure(
            op, tuple(variants), dim, values, info, cfg, ceilings,
            timer=timer_for(dev, threads=torch.get_num_threads()),
            dtype=dtypes[0] if dtypes else None, labels=labels or None,
            telemetry=open_telemetry(info), progress=progress,
        )  # fmt: skip
    doing(None)
    if note:
        study.notes.insert(0, note)
    study.notes.extend(dict.fromkeys(skipped))
    run_id = None
    if db is not None and cases:
        config = {"shape_set": shape_set, "mode": cfg.mode, "rule": cfg.rule.as_dict(),
                  "seed": cfg.seed, "sweep": study.as_dict()}  # fmt: skip
        result = BenchResult(info.as_dict(), ceilings.as_dict(), config, cases, list(skipped))
        run_id, _, failure = record_bench(db, info, result, label)
        if run_id is not None:
            kept(f"ledger run {run_id}: {len(cases)} case(s) of the sweep")
        if failure:
            click.echo(failure, err=True)
    return study, cases, run_id


def _num(v) -> str:
    from kernelab.report import fmt

    return fmt.seconds(v)


def _print(study, run_id, html_out) -> None:
    from kernelab._table import Col, Sheet
    from kernelab.cli._common import console, echo

    sheet = Sheet(
        f"{study.b} vs {study.a} over {study.dim} · {study.how} · {study.device}",
        [
            Col(study.dim, right=True),
            Col(study.a, right=True),
            Col(study.b, right=True),
            Col("speedup", right=True),
            Col("interval", right=True, give="drop", step=1),
            Col("floors", right=True),
            Col("verdict"),
        ],
    )
    for p in study.points:
        lo, hi = p.get("lo"), p.get("hi")
        s, f = p.get("speedup"), p.get("floor_ratio")
        sheet.row(
            str(p["value"]),
            _num(p.get("a_s")),
            _num(p.get("b_s")),
            "—" if s is None else f"{s:.2f}×",
            f"{lo:.2f}–{hi:.2f}" if lo and hi else "—",
            "—" if f is None else f"{f:.2f}×",
            p["verdict"],
        )
    echo(("base shape: ", "dim"), study.base)
    sheet.print(console)
    echo((study.summary(), "bold"))
    for n in study.notes:
        echo(("•", "yellow"), f" {n}")
    if run_id:
        echo((f"ledger run {run_id} (kernelab report draws the study)", "dim"))
    if html_out:
        echo((f"chart: {html_out}", "dim"))
