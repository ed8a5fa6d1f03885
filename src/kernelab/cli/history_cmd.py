"""``kernelab history OP``: one op's stored cases over time."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from kernelab.cli._common import (
    csv_option,
    device_option,
    dtype_option,
    emit_json,
    json_option,
    ledger_option,
    shape_option,
    user_errors,
    variant_option,
)

if TYPE_CHECKING:
    from kernelab._table import Sheet

_CSV_COLUMNS = [
    "created",
    "run",
    "label",
    "commit",
    "variant",
    "shape_key",
    "shape_label",
    "dtype",
    "device",
    "mode",
    "median_s",
    "q1_s",
    "q3_s",
    "n",
    "gbps",
    "tflops",
    "pct_roofline",
    "vs_previous",
    "verdict",
    "flags",
]


def verdict(case: dict) -> str | None:
    """A verify case's outcome, ``pass (0.31×)`` or ``fail: wrong values (4.2×)`` (its worst
    error over its bound); None for a timed case."""
    m = case["metrics"]
    if case["mode"] != "verify" or "passed" not in m:
        return None
    ratio = m.get("worst_ratio")
    tail = f" ({ratio:.2g}×)" if isinstance(ratio, int | float) else f" ({ratio})" if ratio else ""
    return ("pass" if m["passed"] else f"fail: {m.get('failure_class')}") + tail


def history_rows(db, op: str, **filters) -> list[dict]:
    """Flat rows, oldest first; ``vs_previous`` is the median over the previous median of the
    same case (variant, shape, dtype, device, mode)."""
    rows = []
    last: dict[tuple, float] = {}
    for run, case in db.history(op, **filters):
        m = case["metrics"]
        median = m.get("median_s")
        key = (case["variant"], case["shape_key"], case["dtype"], case["device"], case["mode"])
        prev = last.get(key)
        rows.append(
            {
                "created": run["created"],
                "run": run["id"],
                "label": run["label"],
                "commit": (run.get("commit") or "")[:10] or None,
                "op": case["op"],
                "variant": case["variant"],
                "shape_key": case["shape_key"],
                "shape_label": case["shape_label"],
                "dtype": case["dtype"],
                "device": case["device"],
                "mode": case["mode"],
                "median_s": median,
                "q1_s": m.get("q1_s"),
                "q3_s": m.get("q3_s"),
                "n": m.get("n", case["n_samples"]),
                "gbps": m.get("gbps"),
                "tflops": m.get("tflops"),
                "pct_roofline": m.get("pct_roofline"),
                "vs_previous": (median / prev) if (median and prev) else None,
                "verdict": verdict(case),
                "flags": case["flags"],
            }
        )
        if isinstance(median, int | float) and median > 0:
            last[key] = median
    return rows


_RUN_COLUMNS = ["created", "id", "kind", "label", "device", "commit", "n_cases"]


def _show_runs(runs: list[dict], json: bool, csv: bool) -> None:
    from kernelab.report import fmt

    if json:
        emit_json({"runs": runs})
        return
    if csv:
        sys.stdout.write(fmt.to_csv(runs, _RUN_COLUMNS))
        return
    from kernelab.cli._common import console, echo

    if not runs:
        echo("the ledger holds no runs")
        return
    runs_sheet(runs).print(console)


def _when(created: str) -> str:
    return created[:16].replace("T", " ")


def runs_sheet(runs: list[dict]) -> Sheet:
    """Recent runs, one row each: the run id (what ``compare`` takes) is never cut."""
    from kernelab._table import Col, Sheet

    sheet = Sheet(
        "recent runs (newest first; times UTC)",
        [
            Col("time"),
            Col("run"),
            Col("kind"),
            Col("label", give="below", step=3, hide_empty=True),
            Col("device", give="below", step=2),
            Col("commit", give="drop", step=1),
            Col("cases", right=True),
        ],
    )
    for r in runs:
        sheet.row(
            _when(r["created"]),
            r["id"],
            r["kind"],
            r["label"] or "-",
            r["device"] or "-",
            (r["commit"] or "-")[:10],
            str(r["n_cases"]),
        )
    return sheet


def history_sheet(op: str, rows: list[dict]) -> Sheet:
    """One op's cases over time: a group per shape, its rows oldest first."""
    from kernelab._table import Col, Sheet
    from kernelab.report import fmt

    sheet = Sheet(
        f"history: {op} (times UTC)",
        [
            Col("time", give="below", step=6),
            Col("run"),
            Col("variant"),
            Col("dtype"),
            Col("mode", give="drop", step=5),
            Col("median", right=True),
            Col("vs prev", right=True),
            Col("GB/s", right=True, give="drop", step=3),
            Col("% roofline", right=True, give="drop", step=4),
            Col("verify", give="below", step=2, hide_empty=True),
            Col("label", give="below", step=2, hide_empty=True),
            Col("flags", give="below", step=1, hide_empty=True),
        ],
    )
    for shape in dict.fromkeys(r["shape_label"] for r in rows):
        sheet.group(shape)
        for r in rows:
            if r["shape_label"] != shape:
                continue
            sheet.row(
                _when(r["created"]),
                r["run"],
                r["variant"],
                r["dtype"],
                r["mode"],
                fmt.seconds(r["median_s"]),
                fmt.ratio(r["vs_previous"]),
                fmt.number(r["gbps"]),
                fmt.percent(r["pct_roofline"]),
                r["verdict"] or "",
                r["label"] or "-",
                ", ".join(r["flags"]),
            )
    return sheet


def select_history(db, op: str, variants=(), shapes=(), dtypes=(), limit=200, **filters):
    """``history_rows`` of the cases matching any of ``variants``, ``dtypes`` and ``shapes``
    (a shape key, or a part of the label), the ``limit`` most recent."""
    one = {"variant": variants, "dtype": dtypes}
    sql = {k: v[0] for k, v in one.items() if len(v) == 1}
    rest = {k: set(v) for k, v in one.items() if len(v) > 1}
    exact = not rest and not shapes
    rows = history_rows(db, op, **sql, **filters, limit=limit if exact else None)
    rows = [
        r
        for r in rows
        if all(r[k] in v for k, v in rest.items())
        and (not shapes or any(s == r["shape_key"] or s in r["shape_label"] for s in shapes))
    ]
    return rows[-limit:]


def register(app: click.Group) -> None:
    @app.command("history")
    @click.argument("op", required=False)
    @variant_option("Only these variants (repeatable or comma-separated).")
    @shape_option("Only shapes with this key, or whose label contains this (repeatable).")
    @dtype_option(help="Only these dtypes (bf16, fp16, fp32, ...; repeatable or comma list).")
    @device_option("Only this device (as stored, e.g. cpu or cuda).")
    @click.option("--mode", help="Only this timing mode (cold, hot, ...).")
    @click.option("--limit", default=200, help="At most this many most recent cases.")
    @click.option("--sweep", "sweep_id", help="A sweep's tasks and their results (an id).")
    @click.option("--sweeps", "list_sweeps", is_flag=True, help="The ledger's sweeps.")
    @ledger_option
    @json_option
    @csv_option
    @user_errors
    def history_command(
        op,
        variants,
        shapes,
        dtype,
        device,
        mode,
        limit,
        sweep_id,
        list_sweeps,
        ledger_url,
        as_json,
        as_csv,
    ):
        """Show how an op's cases measured over time, oldest first; without an op, the
        ledger's recent runs.

        OP is the op name, e.g. rmsnorm (none: list recent runs).
        """
        from kernelab import ledger
        from kernelab.report import fmt

        json, csv = as_json, as_csv
        if json and csv:
            raise ValueError("--json, --csv: choose one output format")
        if limit < 1:
            raise ValueError(f"--limit: expected at least 1, got {limit}")
        if sweep_id is not None or list_sweeps:
            from kernelab.cli.sweep_cmd import show_sweep, show_sweeps

            if op is not None or (sweep_id is not None and list_sweeps):
                raise ValueError("--sweep, --sweeps: give one of them, and no OP")
            with ledger.open(ledger_url, readonly=True) as db:
                if list_sweeps:
                    show_sweeps(db, limit, json, csv)
                else:
                    show_sweep(db, sweep_id, json, csv)
            return
        if op is None:
            with ledger.open(ledger_url, readonly=True) as db:
                runs = db.list_runs(kind=None, limit=limit)
            _show_runs(runs, json, csv)
            return
        with ledger.open(ledger_url, readonly=True) as db:
            rows = select_history(db, op, variants, shapes, dtype, limit, device=device, mode=mode)
        if json:
            emit_json({"op": op, "cases": rows})
            return
        if csv:
            sys.stdout.write(fmt.to_csv(rows, _CSV_COLUMNS))
            return
        from kernelab.cli._common import console, echo

        if not rows:
            echo(f"no stored cases of op {op!r}")
            return
        history_sheet(op, rows).print(console)
