"""``kernelab history OP``: one op's stored cases over time."""

from __future__ import annotations

import sys

import click

from kernelab.cli._common import emit_json, ledger_option, user_errors

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
    "flags",
]


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
    from rich.markup import escape
    from rich.table import Table

    from kernelab.cli._common import console

    if not runs:
        console.print("the ledger holds no runs", highlight=False, markup=False)
        return
    table = Table(title="recent runs (newest first)", title_justify="left")
    for col in ("time (UTC)", "run", "kind", "label", "device", "commit", "cases"):
        table.add_column(col, justify="right" if col == "cases" else "left")
    for r in runs:
        table.add_row(
            r["created"][:19].replace("T", " "),
            r["id"],
            escape(r["kind"]),
            escape(r["label"] or "-"),
            escape(r["device"] or "-"),
            (r["commit"] or "-")[:10],
            str(r["n_cases"]),
        )
    console.print(table)


def register(app: click.Group) -> None:
    @app.command("history")
    @click.argument("op", required=False)
    @click.option("--variant", help="Only this variant.")
    @click.option("--shape", help="Only this shape key.")
    @click.option("--dtype", help="Only this dtype.")
    @click.option("--device", help="Only this device.")
    @click.option("--mode", help="Only this timing mode (cold, hot, ...).")
    @click.option("--limit", default=200, help="At most this many most recent cases.")
    @ledger_option
    @click.option("--json", "json", is_flag=True, help="Print JSON instead of a table.")
    @click.option("--csv", "csv", is_flag=True, help="Print CSV.")
    @user_errors
    def history_command(op, variant, shape, dtype, device, mode, limit, ledger_url, json, csv):
        """Show how an op's cases measured over time, oldest first; without an op, the
        ledger's recent runs.

        OP is the op name, e.g. rmsnorm (none: list recent runs).
        """
        from kernelab import ledger
        from kernelab.report import fmt

        if json and csv:
            raise ValueError("--json, --csv: choose one output format")
        if limit < 1:
            raise ValueError(f"--limit: expected at least 1, got {limit}")
        if op is None:
            with ledger.open(ledger_url, readonly=True) as db:
                runs = db.list_runs(kind=None, limit=limit)
            _show_runs(runs, json, csv)
            return
        with ledger.open(ledger_url, readonly=True) as db:
            rows = history_rows(
                db,
                op,
                variant=variant,
                shape_key=shape,
                dtype=dtype,
                device=device,
                mode=mode,
                limit=limit,
            )
        if json:
            emit_json({"op": op, "cases": rows})
            return
        if csv:
            sys.stdout.write(fmt.to_csv(rows, _CSV_COLUMNS))
            return
        from rich.markup import escape
        from rich.table import Table

        from kernelab.cli._common import console

        if not rows:
            console.print(f"no stored cases of op {op!r}", highlight=False, markup=False)
            return
        table = Table(title=escape(f"history: {op}"), title_justify="left")
        for col in ("time (UTC)", "run", "label", "variant", "shape", "dtype", "mode"):
            table.add_column(col)
        for col in ("median", "vs prev", "GB/s", "% roofline"):
            table.add_column(col, justify="right")
        table.add_column("flags")
        for r in rows:
            table.add_row(
                r["created"][:19].replace("T", " "),
                r["run"],
                *(
                    escape(str(x or "-"))
                    for x in (r["label"], r["variant"], r["shape_label"], r["dtype"], r["mode"])
                ),
                fmt.seconds(r["median_s"]),
                fmt.ratio(r["vs_previous"]),
                fmt.number(r["gbps"]),
                fmt.percent(r["pct_roofline"]),
                escape(", ".join(r["flags"])),
            )
        console.print(table)
