"""``kernelab bench``: time ops, variants and a user's candidate, with integrity checks."""

from __future__ import annotations

import sys

import click

from kernelab.cli._common import (
    candidate_option,
    check_custom,
    csv_option,
    custom_op,
    device_option,
    doing,
    dtype_option,
    emit_json,
    inputs_option,
    interrupt_status,
    json_option,
    label_option,
    ledger_option,
    lost,
    max_rows_option,
    no_ledger_option,
    op_names,
    op_option,
    record_bench,
    reference_option,
    select_ops,
    shape_option,
    shape_set_option,
    spinner,
    user_errors,
    variant_option,
)


def _dtypes(names: tuple[str, ...]):
    import torch

    return tuple(getattr(torch, n) for n in names) or None


#: ``bench --csv``: one row per case; metrics flattened (seconds, GB/s, TFLOP/s, %).
CSV_COLUMNS = [
    "run_id",
    "op",
    "variant",
    "shape_key",
    "shape_label",
    "dtype",
    "device",
    "mode",
    "valid",
    "median_s",
    "q1_s",
    "q3_s",
    "min_s",
    "mean_s",
    "n",
    "cv",
    "rel_ci",
    "gbps",
    "tflops",
    "pct_roofline",
    "floor_s",
    "bound",
    "speedup_vs_torch",
    "ceiling_source",
    "flags",
]


FLOOR_CSV_COLUMNS = [
    "op",
    "shape_label",
    "dtype",
    "bytes",
    "flops",
    "floor_s",
    "bound",
    "ceiling_source",
]


def csv_rows(cases: list[dict], run_id: str | None) -> list[dict]:
    return [
        {**c["metrics"], **{k: v for k, v in c.items() if k != "metrics"}, "run_id": run_id}
        for c in cases
    ]


def _us(x) -> str:
    return "—" if x is None else f"{x * 1e6:.2f}"


def register(app: click.Group) -> None:
    @app.command("bench")
    @click.argument("ops", nargs=-1, callback=op_names)
    @device_option()
    @shape_set_option()
    @shape_option(
        "Keep shapes whose label contains this, or give sizes: rows=4096,cols=8192 "
        "(every size of the op; repeatable)."
    )
    @dtype_option()
    @variant_option()
    @candidate_option()
    @op_option()
    @reference_option()
    @inputs_option()
    @click.option("--mode", default="auto", help="auto (cold if memory-bound), cold or hot.")
    @click.option("--compile", is_flag=True, help="Time torch.compile on CPU.")
    @max_rows_option("Cap the batch dimension (rows, tokens); CPU default 128, 0: no cap.")
    @click.option("--rel-ci", type=float, help="Noise target: CI half-width / median.")
    @click.option("--min-samples", type=int, help="Minimum samples per case.")
    @click.option("--max-time", type=float, help="Timeout per case, seconds.")
    @click.option("--budget", type=float, help="Stop starting cases after this many s.")
    @click.option("--energy-window", default=0.3, help="Energy window per case, s (0: off).")
    @click.option("--seed", default=0, help="Input seed.")
    @label_option
    @no_ledger_option("--no-record/--record")
    @ledger_option
    @click.option(
        "--floors-for",
        help="Print datasheet floors for a device (e.g. h200, tpu_v6e) and exit; no timing.",
    )
    @click.option(
        "--sweep",
        help="DIM=v1,v2,... or DIM=lo..hi (powers of two): a crossover study over one size, "
        "of two variants (timed) or, with --floors-for, of two ops (floors).",
    )
    @click.option("--html", "html_out", help="With --sweep: write the study's chart here.")
    @click.option(
        "--ceilings",
        "ceilings_how",
        type=click.Choice(["measure", "stored"]),
        default="measure",
        show_default=True,
        help="A CPU's ceilings: measured now, keeping the best of stored and new, or the "
        "stored ones as they are (measured only when none are stored). A GPU's are always "
        "the stored ones (`kernelab ceilings`), else its datasheet's.",
    )
    @json_option
    @csv_option
    @user_errors
    def bench_command(
        ops,
        device,
        shape_set,
        shapes,
        dtype,
        variants,
        candidate,
        op,
        reference,
        inputs,
        mode,
        compile,
        max_rows,
        rel_ci,
        min_samples,
        max_time,
        budget,
        energy_window,
        seed,
        label,
        no_ledger,
        ledger_url,
        floors_for,
        sweep,
        html_out,
        ceilings_how,
        as_json,
        as_csv,
    ):
        """Time ops with statistics, cold caches, roofline and integrity checks.

        OPS are the ops to time (default: all).
        """
        from dataclasses import replace

        from kernelab import bench
        from kernelab.bench.runner import CPU_RULE, GPU_RULE
        from kernelab.hardware import detect, lookup

        if as_json and as_csv:
            raise ValueError("--json, --csv: choose one output format")
        dtypes = _dtypes(dtype)
        if html_out and not sweep:
            raise ValueError("html: --html writes a --sweep study; give --sweep DIM=...")
        if sweep:
            from kernelab.cli import _sweep

            _sweep.run(
                ops, sweep, variants, floors_for, dtypes, shape_set, shapes, device,
                dict(mode=mode, rel_ci=rel_ci, min_samples=min_samples, max_time=max_time,
                     seed=seed, compile=compile),
                None if no_ledger else ledger_url, no_ledger, label, as_json, html_out,
            )  # fmt: skip
            return
        if floors_for:
            spec = lookup(floors_for)
            if spec is None:
                raise ValueError(
                    "floors-for: expected a device of the table (a100, h100, h200, b200, "
                    f"mi300x, tpu_v5e, tpu_v6e, tpu_v5p, tpu7x), got {floors_for!r}"
                )
            rows = bench.floors(spec, select_ops(ops), shape_set, dtypes)
            if as_csv:
                from kernelab.report import fmt

                sys.stdout.write(fmt.to_csv(rows, FLOOR_CSV_COLUMNS))
                return
            _print_floors(spec, rows, as_json)
            return
        custom = check_custom(candidate, op, ops, reference, inputs)
        if candidate and not op and not custom:
            raise ValueError(
                "op: --candidate needs --op NAME (the op it implements), or --reference and "
                "--inputs for a function kernelab has no op for"
            )
        if op and not candidate:
            raise ValueError("candidate: --op is for a --candidate; name ops as arguments")
        from kernelab.bench.runner import parse_dims

        dims = tuple(parse_dims(s) for s in shapes if "=" in s)
        shapes = tuple(s for s in shapes if "=" not in s)
        if dims and shapes:
            raise ValueError("--shape: give sizes (name=value) or label filters, not both")
        info = detect(device)
        if custom:
            dev = "cpu" if info.type == "cpu" else f"cuda:{info.index}"
            selected = [custom_op(candidate, reference, inputs, dev, dims)]
            dims = ()  # the user's op has the sizes as its shapes
        else:
            selected = select_ops([op] if op else ops)
        rule = CPU_RULE if info.type == "cpu" else GPU_RULE
        changes = {
            k: v
            for k, v in (("rel_ci", rel_ci), ("min_samples", min_samples), ("max_time", max_time))
            if v is not None
        }
        if "max_time" in changes:
            changes["min_time"] = min(rule.min_time, changes["max_time"])
        rule = replace(rule, **changes)
        cfg = bench.BenchConfig(
            shape_set=shape_set,
            dtypes=dtypes,
            variants=variants or None,
            mode=mode,
            rule=rule,
            seed=seed,
            compile=compile,
            max_rows=max_rows,
            shapes=tuple(shapes) or None,
            dims=dims or None,
            energy_window_s=energy_window,
            budget_s=budget,
        )
        subject = bench.candidate(candidate, selected[0]) if candidate else None
        db = None if no_ledger else bench.open_ledger(ledger_url)
        lost(
            "the case being timed (finished cases are stored on Ctrl-C)"
            if db is not None
            else "the cases timed so far (--no-ledger)"
        )
        try:
            with spinner() as say:

                def progress(msg: str) -> None:
                    say(msg)
                    doing(msg)

                result = bench.bench(
                    selected,
                    device,
                    cfg,
                    candidate=subject,
                    db=db,
                    progress=progress,
                    remeasure=ceilings_how == "measure",
                )
        except bench.BenchInterrupted as exc:  # Ctrl-C: keep what was measured
            result = exc.result
        doing(None)
        run_id, unrecorded, failure = None, None, None
        if db is not None and result.cases:
            run_id, unrecorded, failure = record_bench(db, info, result, label)
        lost(None)
        if not result.cases and not result.interrupted:  # selected, but each case skipped
            failure = "error: nothing was timed: every case selected was skipped (lines above)"
        invalid = [c for c in result.cases if not c["metrics"]["valid"]]
        if as_json:
            emit_json(
                {
                    "run_id": run_id,
                    "unrecorded": None if unrecorded is None else str(unrecorded),
                    "interrupted": result.interrupted,
                    "device": result.device,
                    "ceilings": result.ceilings,
                    "config": result.config,
                    "seconds": round(result.seconds, 2),
                    "skipped": result.skipped,
                    "cases": result.cases,
                }
            )
        elif as_csv:
            from kernelab.report import fmt

            sys.stdout.write(fmt.to_csv(csv_rows(result.cases, run_id), CSV_COLUMNS))
        else:
            _print_table(result, run_id)
        if failure:
            click.echo(failure, err=True)
        if result.interrupted:  # Ctrl-C: 130, SIGTERM: 143
            raise click.exceptions.Exit(interrupt_status())
        if invalid or failure:
            raise click.exceptions.Exit(1)


def bench_sheet(result):
    """The bench table: one group per op and shape, one row per dtype and variant."""
    from kernelab._table import Col, Sheet

    sheet = Sheet(
        f"kernelab bench — {result.device['name']}",
        [
            Col("variant"),
            Col("dtype"),
            Col("mode", give="drop", step=6),
            Col("median µs", right=True),
            Col("q1–q3 µs", right=True, give="drop", step=4),
            Col("n", right=True, give="drop", step=3),
            Col("cv", right=True, give="drop", step=2),
            Col("GB/s", right=True, give="drop", step=5),
            Col("% roof", right=True),
            Col("vs torch", right=True),
            Col("flags", give="below", step=1, hide_empty=True),
        ],
    )
    group = None
    for c in result.cases:
        if (c["op"], c["shape_label"]) != group:
            group = (c["op"], c["shape_label"])
            sheet.group(*group)
        m = c["metrics"]
        pct = m.get("pct_roofline")
        speed = m.get("speedup_vs_torch")
        flags = "; ".join(c["flags"])
        sheet.row(
            c["variant"],
            c["dtype"],
            c["mode"],
            "INVALID" if not m["valid"] else _us(m["median_s"]),
            f"{_us(m['q1_s'])}–{_us(m['q3_s'])}",
            str(m["n"]),
            f"{m['cv']:.2f}",
            "—" if m.get("gbps") is None else f"{m['gbps']:.1f}",
            "—" if pct is None else f"{pct:.0f}%",
            "—" if speed is None else f"{speed:.2f}×",
            flags,
            style="bold red" if not m["valid"] else ("yellow" if flags else None),
        )
    return sheet


def _print_table(result, run_id) -> None:
    from kernelab.cli._common import console, echo

    bench_sheet(result).print(console)
    src = {c["metrics"].get("ceiling_source") for c in result.cases} - {None}
    for s in sorted(src):
        echo((f"ceiling: {s}", "dim"))
    for line in dict.fromkeys(result.skipped):
        echo(("•", "yellow"), f" {line}")
    tail = f"{len(result.cases)} case(s), {result.seconds:.1f} s"
    echo((tail + (f", ledger run {run_id}" if run_id else ""), "dim"))


def _print_floors(spec, rows, json: bool) -> None:
    if json:
        emit_json({"device": spec.name, "floors": rows})
        return
    from kernelab._table import Col, Sheet
    from kernelab.cli._common import console, echo

    sheet = Sheet(
        f"speed-of-light floors on {spec.name} (datasheet)",
        [
            Col("dtype"),
            Col("MB moved", right=True),
            Col("MFLOP", right=True),
            Col("floor µs", right=True),
            Col("bound"),
        ],
    )
    group = None
    for r in rows:
        if (r["op"], r["shape_label"]) != group:
            group = (r["op"], r["shape_label"])
            sheet.group(*group)
        sheet.row(
            r["dtype"],
            f"{r['bytes'] / 1e6:.3f}",
            f"{r['flops'] / 1e6:.3f}",
            _us(r["floor_s"]),
            r["bound"] or "—",
        )
    sheet.print(console)
    if rows:
        echo((f"ceiling: {rows[0]['ceiling_source']}", "dim"))
    if spec.source != "HARDWARE.md":
        echo((f"figures: {spec.source}", "dim"))
