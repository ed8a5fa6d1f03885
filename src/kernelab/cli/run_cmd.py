"""``kernelab run``: the report card. Every instrument on every registered op, one table."""

from __future__ import annotations

import time

import click

from kernelab.cli._common import (
    device_option,
    doing,
    emit_json,
    json_option,
    label_option,
    ledger_option,
    lost,
    no_ledger_option,
    op_names,
    select_ops,
    spinner,
    store_run,
    unstored,
    user_errors,
    variant_option,
)
from kernelab.stages import RUN_STAGES, load

_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "info": "cyan"}


def register(app: click.Group) -> None:
    @app.command("run")
    @click.argument("ops", nargs=-1, callback=op_names)
    @device_option()
    @variant_option(
        "Variant(s) to verify and time, repeatable or comma-separated (default: all that run "
        "here, except compile on CPU)."
    )
    @label_option
    @ledger_option
    @no_ledger_option()
    @click.option(
        "--full",
        is_flag=True,
        help="Verify every shape of the sets on every dtype (default: the quick tier, every edge "
        "shape and the ends of the representative ones, each on one dtype).",
    )
    @click.option(
        "--seed",
        type=click.IntRange(min=0),
        help="verify's run seed, to repeat a card exactly (default: new; the card prints it).",
    )
    @json_option
    @user_errors
    def run_command(ops, device, variants, label, ledger_url, no_ledger, full, seed, as_json):
        """Run every instrument on every registered op and print one table (the report card).

        OPS are the ops to include (default: all).
        """
        from kernelab.core.calling import takes
        from kernelab.hardware import detect

        info = detect(device)
        selected = select_ops(ops)
        reports, started = [], time.perf_counter()
        with spinner(disable=as_json) as say:

            def progress(msg: str) -> None:
                say(msg)
                doing(msg)

            for path in RUN_STAGES:
                stage = load(path)
                extra = {"full": True} if full and takes(stage, "full") else {}
                if seed is not None and takes(stage, "seed"):
                    extra["seed"] = seed
                reports.append(
                    stage(
                        selected,
                        info,
                        progress,
                        variants=variants or None,
                        ledger_url=ledger_url,
                        **extra,
                    )
                )
                done = ", ".join(r.stage for r in reports)
                lost(f"the results of the finished stages ({done}): run prints them at the end")
        doing(None)
        rec = None if no_ledger else _store(reports, info, ledger_url, label)
        run_id = rec.run_id if rec is not None else None
        lost(None)
        elapsed = time.perf_counter() - started
        failed = any(r.failed for r in reports)
        if as_json:
            emit_json(
                {
                    "device": info.as_dict(),
                    "run_id": run_id,
                    "seconds": round(elapsed, 2),
                    "passed": not failed,
                    "notes": [line for r in reports for line in r.notes],
                    "stages": [
                        {
                            "stage": r.stage,
                            "skipped": r.skipped,
                            "cells": [
                                {
                                    "op": o,
                                    "variant": v,
                                    "status": c.status,
                                    "text": c.text,
                                    "data": c.data,
                                }
                                for (o, v), c in r.cells.items()
                            ],
                        }
                        for r in reports
                    ],
                }
            )
        else:
            _print_table(info, selected, reports, elapsed, run_id)
        unstored(rec)
        if failed:
            raise click.exceptions.Exit(1)


def card_sheet(info, selected, reports, width: int):
    """The report card: a column per stage when it fits ``width`` unwrapped; otherwise one
    line per variant and stage (each op's variants grouped under it)."""
    from rich.text import Text

    from kernelab._table import Col, Sheet

    title = f"kernelab report card — {info.type}: {info.name}"
    rows = []
    for op in selected:
        for key in [(op.name, v) for v in op.variants] + [(op.name, "*")]:
            cells = [r.cells.get(key) for r in reports]
            if any(c is not None for c in cells):
                rows.append((op.name, "(op)" if key[1] == "*" else key[1], cells))

    def text(c):
        return "" if c is None else Text(c.text, style=_STYLE[c.status])

    wide = Sheet(title, [Col("op"), Col("variant")] + [Col(r.stage) for r in reports])
    for op, variant, cells in rows:
        wide.row(op, variant, *(text(c) for c in cells))
    if wide.fits(width):
        return wide
    stacked = Sheet(title, [Col("variant"), Col("stage"), Col("result", give="wrap", step=1)])
    group = None
    for op, variant, cells in rows:
        if op != group:
            group = op
            stacked.group(op)
        first = True
        for r, c in zip(reports, cells, strict=True):
            if c is not None:
                stacked.row(variant if first else "", r.stage, text(c))
                first = False
    return stacked


def _store(reports, info, url: str | None, label: str | None):
    """The stages' cases (the bench stage's timings) as one ledger run, kind bench (or kept
    beside the ledger: :func:`store_run`); None when there are none."""
    cases = [c for r in reports for c in r.cases]
    if not cases:
        return None
    from kernelab import ledger

    bench = next((r.provenance for r in reports if r.cases and r.provenance), {})
    prov = ledger.provenance(info, bench=bench)
    return store_run(url, "bench", cases, prov, label, what="bench case(s)")


def _print_table(info, selected, reports, elapsed, run_id=None) -> None:
    from kernelab.cli._common import console, echo

    card_sheet(info, selected, reports, console.width).print(console)
    for line in (line for r in reports for line in r.notes):
        echo(line)
    skipped = [line for r in reports for line in r.skipped]
    if skipped:
        echo(("Not run here:", "yellow"))
        for line in dict.fromkeys(skipped):
            echo(f"  • {line}")
    tail = f"{len(selected)} op(s), {elapsed:.1f} s"
    echo((tail + (f", bench cases stored as ledger run {run_id}" if run_id else ""), "dim"))
