"""``kernelab sweep``: an instrument over ops × shapes × dtypes × configs × targets, as tasks on
a local process pool or on Ray, every result stored in the ledger."""

from __future__ import annotations

import time

import click

from kernelab.cli._common import (
    _names,
    _shared,
    dtype_option,
    echo,
    emit_json,
    json_option,
    kept,
    ledger_option,
    max_rows_option,
    op_names,
    plain_progress,
    shape_option,
    shape_set_option,
    user_errors,
    variant_option,
)

#: Flags that become spec keys (the flag's parameter name -> the key).
_FLAG_KEYS = {
    "ops": "ops",
    "variants": "variants",
    "shape_sets": "shape_sets",
    "shapes": "shapes",
    "dtype": "dtypes",
    "configs": "configs",
    "target": "targets",
    "seeds": "seeds",
    "trials": "trials",
    "max_rows": "max_rows",
    "mode": "mode",
    "retries": "retries",
}


def spec_from(kind, spec_file, flags: dict) -> dict:
    """The raw spec: the file's table (if any), then the flags given, then the kind."""
    from kernelab.sweep import SpecError, load

    raw = load(spec_file) if spec_file else {}
    for name, key in _FLAG_KEYS.items():
        value = flags.get(name)
        if value is None or value == ():
            continue
        if name == "shapes" and any("=" in v for v in value):  # sizes, as bench's --shape
            if not all("=" in v for v in value):
                raise SpecError("spec.sizes: give sizes (name=value) or label filters, not both")
            raw["sizes"] = list(value)  # one size set per --shape (commas separate its dims)
            continue
        if name == "seeds":
            try:
                value = [int(s) for s in _names(value)]
            except ValueError:
                raise SpecError(f"spec.seeds: expected integers, got {value!r}") from None
        elif isinstance(value, tuple | str) and name not in ("configs", "mode"):
            value = list(_names(value))
        raw[key] = value
    if kind is not None:
        if raw.get("kind") not in (None, kind):
            raise SpecError(f"spec.kind: the file says {raw['kind']!r}, the command {kind!r}")
        raw["kind"] = kind
    return raw


class _Bar:
    """Progress: a rich bar (done, failed, running, queued) on a terminal, else a plain line
    per tenth of the tasks and per failure."""

    def __init__(self, total: int, disable: bool):
        self.plain = plain_progress()
        self.disable = disable
        self.started = time.perf_counter()
        self.tenth = -1
        self.failed = 0
        self.progress = None
        if not disable and not self.plain:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            from kernelab.cli._common import err_console

            self.progress = Progress(
                TextColumn("sweep"),
                BarColumn(),
                TextColumn("{task.fields[counts]}", markup=False),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            )
            self.task = self.progress.add_task("sweep", total=total, counts="")

    def __enter__(self):
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def __call__(self, p) -> None:
        todo = p.total - p.stored
        finished = p.done + p.failed + p.duplicates
        counts = (
            f"{finished}/{todo} — done {p.done}, failed {p.failed}, running {p.running}, "
            f"queued {p.queued}"
        )
        if self.progress is not None:
            self.progress.update(self.task, total=todo, completed=finished, counts=counts)
            return
        if self.disable:
            return
        tenth = finished * 10 // todo if todo else 10
        if tenth != self.tenth or p.failed != self.failed:
            self.tenth, self.failed = tenth, p.failed
            echo(f"[{time.perf_counter() - self.started:6.1f} s] sweep: {counts}", err=True)


def _dry_run(spec, tasks, skipped, ledger_url, as_json) -> None:
    from kernelab.sweep import estimate, sweep_id

    est = estimate(tasks)
    stored = None
    try:
        from kernelab import ledger
        from kernelab.ledger.sweeps import done_keys

        with ledger.open(ledger_url, readonly=True) as db:
            stored = len(done_keys(db, [t.key for t in tasks]))
    except (ValueError, OSError):  # no ledger yet: nothing stored
        stored = 0
    out = {"sweep": sweep_id(spec), **est, "already_stored": stored, "skipped": skipped}
    if as_json:
        emit_json({"dry_run": True, "spec": spec.as_dict(), **out})
        return
    from kernelab._table import Col, Sheet
    from kernelab.cli._common import console

    sheet = Sheet(
        f"sweep {out['sweep']} (dry run: nothing runs)",
        [Col("kind"), Col("tasks", right=True), Col("GPU tasks", right=True)],
    )
    gpu = {}
    for t in tasks:
        gpu[t.kind] = gpu.get(t.kind, 0) + t.gpu
    for kind, n in est["tasks"].items():
        sheet.row(kind, str(n), str(gpu.get(kind, 0)))
    sheet.print(console)
    echo(
        f"estimated cost: {est['core_seconds']:.0f} core-seconds "
        f"(rough constants, kernelab.sweep.tasks.COST_S); {stored} already stored"
    )
    for line in skipped:
        echo(("skipped:", "yellow"), f" {line}")


def _print(result) -> None:
    d = result.as_dict()
    echo(
        f"sweep {d['sweep']} ({d['kind']}, engine {d['engine']}): {d['tasks']} tasks, "
        f"{d['already_stored']} already stored, {d['done']} done, {d['failed']} failed"
        + (f", {d['retried']} retried" if d["retried"] else "")
        + (
            f", {d['duplicates_dropped']} stored meanwhile by another sweep"
            if d["duplicates_dropped"]
            else ""
        )
        + f" — {d['seconds']:.1f} s"
    )
    if result.failures:
        echo((f"{len(result.failures)} failed:", "bold red"))
        for f in result.failures:
            echo("  ", ("✗", "red"), f" {f['task']}: {f['reason']}")
    for line in result.skipped:
        echo(("skipped:", "yellow"), f" {line}")
    echo((f"results: kernelab history --sweep {d['sweep']}", "dim"))


def _unstored(result) -> None:
    """The ledger failed mid-sweep: its error, and where each finished result is kept."""
    n, files = len(result.unrecorded), result.unrecorded
    click.echo(result.ledger_error.splitlines()[0] if n else result.ledger_error, err=True)
    if n:
        click.echo(f"{n} finished task result(s) the ledger could not store, kept in:", err=True)
        for path in files:
            click.echo(f"  {path}", err=True)
    click.echo(
        f"the sweep stopped: {result.progress.done} result(s) stored, {result.cancelled} "
        "task(s) not run; run the same sweep again once the ledger takes writes",
        err=True,
    )


def register(app: click.Group) -> None:
    @app.command("sweep")
    @click.argument(
        "kind", required=False, type=click.Choice(["inspect", "verify", "bench", "tune", "floors"])
    )
    @click.option("--spec", "spec_file", help="A spec file (.toml or .json); flags add to it.")
    @click.option("--ops", callback=op_names, help="Comma-separated op names (default: all).")
    @variant_option()
    @shape_set_option(multiple=True, help="Shape set(s): representative, edge (repeatable).")
    @shape_option()
    @dtype_option()
    @click.option("--configs", help="default, space (the whole tuning space); inspect, tune.")
    @_shared(
        "target",
        "--target",
        "--targets",
        "-t",
        "target",
        hidden=("--targets",),
        help="Comma-separated: compile targets (inspect, tune: sm_80, sm_90, ...) or device "
        "types (verify, bench: cpu, H100, ...; floors: GPU types).",
    )
    @click.option("--seeds", help="verify: comma-separated input seeds, a task each.")
    @click.option("--trials", type=int, help="verify: trials per case.")
    @max_rows_option("bench: cap the batch dimension (rows, tokens).")
    @click.option("--mode", type=click.Choice(["auto", "cold", "hot"]), help="bench: timing mode.")
    @click.option("--retries", type=int, help="Tries again of a task whose worker died (2).")
    @click.option(
        "--engine", type=click.Choice(["local", "ray"]), default="local", help="Where tasks run."
    )
    @click.option("--address", help="--engine ray: a cluster's address (default: a local Ray).")
    @click.option("--jobs", "-j", type=int, help="Local workers (default: CPUs); Ray: in flight.")
    @click.option("--dry-run", is_flag=True, help="Print the task count and cost; run nothing.")
    @click.option(
        "--max-tasks",
        type=int,
        help="The most tasks the sweep may have (default: KERNELAB_SWEEP_MAX_TASKS, else "
        "500,000); checked before any task is made.",
    )
    @ledger_option
    @json_option
    @user_errors
    def sweep_command(
        kind, spec_file, engine, address, jobs, dry_run, max_tasks, ledger_url, as_json, **flags
    ):
        """Run KIND (inspect, verify, bench, tune or floors) over every combination of the
        spec as independent tasks; each result goes to the ledger as it finishes, and a re-run
        of the same spec runs only what is not stored yet.
        """
        from kernelab import ledger, sweep
        from kernelab.sweep import engines, runner
        from kernelab.sweep.spec import max_tasks as task_limit

        limit = task_limit(max_tasks)
        spec = sweep.validate(spec_from(kind, spec_file, flags), limit)
        if jobs is not None and jobs < 1:
            raise ValueError(f"jobs: expected at least 1, got {jobs}")
        if address and engine != "ray":
            raise ValueError("address: only --engine ray takes --address")
        tasks, skipped = sweep.expand(spec, limit)
        if dry_run:
            _dry_run(spec, tasks, skipped, ledger_url, as_json)
            return
        if engine == "local" and any(t.gpu for t in tasks):
            raise ValueError(
                "targets: GPU device types need --engine ray (a cluster with gpu:<type> "
                "resources); the local engine runs CPU tasks"
            )
        with ledger.open(ledger_url) as db:
            eng = engines.make(engine, jobs, address)
            try:
                with _Bar(len(tasks), disable=as_json) as bar:
                    result = runner.run(spec, db, eng, bar, tasks=tasks)
            except sweep.SweepInterrupted as exc:
                r = exc.result
                kept(
                    f"sweep {r.id}: {r.progress.done} task result(s) stored in {db.location} "
                    f"({r.cancelled} cancelled; run the same sweep again to finish them)"
                )
                raise KeyboardInterrupt from None
            finally:
                eng.close()
        result.skipped = skipped
        if as_json:
            emit_json(result.as_dict())
        else:
            _print(result)
        if result.ledger_error:
            _unstored(result)
        if result.failures or result.ledger_error:
            raise click.exceptions.Exit(1)


_TASK_COLUMNS = [
    "status",
    "kind",
    "op",
    "variant",
    "shape_key",
    "dtype",
    "target",
    "config",
    "attempts",
    "run_id",
    "reason",
    "key",
]


def show_sweeps(db, limit: int, json: bool, csv: bool) -> None:
    """``kernelab history --sweeps``: the ledger's sweeps, newest first."""
    import sys

    from kernelab.ledger.sweeps import list_sweeps

    rows = list_sweeps(db, limit)
    if json:
        emit_json({"sweeps": rows})
        return
    if csv:
        from kernelab.report import fmt

        flat = [{**r, "kind": r["spec"].get("kind")} for r in rows]
        sys.stdout.write(fmt.to_csv(flat, ["created", "id", "kind", "done", "failed"]))
        return
    from kernelab._table import Col, Sheet
    from kernelab.cli._common import console

    if not rows:
        echo("the ledger holds no sweeps")
        return
    sheet = Sheet(
        "sweeps (newest first; times UTC)",
        [
            Col("time"),
            Col("sweep"),
            Col("kind"),
            Col("done", right=True),
            Col("failed", right=True),
            Col("ops", give="below", step=1),
        ],
    )
    for r in rows:
        sheet.row(
            r["created"][:16].replace("T", " "),
            r["id"],
            str(r["spec"].get("kind")),
            str(r["done"]),
            str(r["failed"]),
            ",".join(r["spec"].get("ops") or []),
        )
    sheet.print(console)


def show_sweep(db, sweep_id: str, json: bool, csv: bool) -> None:
    """``kernelab history --sweep ID``: every task the sweep stored or gave up on; with
    ``--json`` each stored task's cases too (without raw samples)."""
    import sys

    from kernelab.ledger.sweeps import get_sweep

    sw = get_sweep(db, sweep_id)
    tasks = sw["tasks"]
    if json:
        for t in tasks:
            t["cases"] = db.get_run(t["run_id"], samples=False)["cases"] if t["run_id"] else []
        emit_json(sw)
        return
    if csv:
        from kernelab.report import fmt

        sys.stdout.write(fmt.to_csv(tasks, _TASK_COLUMNS))
        return
    from kernelab._table import Col, Sheet
    from kernelab.cli._common import console

    done = sum(t["status"] == "done" for t in tasks)
    sheet = Sheet(
        f"sweep {sw['id']} ({sw['spec'].get('kind')}): {done} done, {len(tasks) - done} failed",
        [
            Col("status"),
            Col("shape", give="below", step=3),
            Col("dtype"),
            Col("target"),
            Col("run"),
            Col("config", give="below", step=1, hide_empty=True),
            Col("reason", give="below", step=2, hide_empty=True),
        ],
    )
    group = None
    for t in sorted(
        tasks, key=lambda t: (t["op"], t["variant"], t["shape_key"], t["dtype"], t["target"])
    ):
        name = f"{t['op']}/{t['variant']}"
        if name != group:
            group = name
            sheet.group(name)
        sheet.row(
            t["status"],
            t["shape_key"],
            t["dtype"],
            t["target"],
            t["run_id"] or "-",
            "" if t["config"] == "default" else t["config"],
            t["reason"] or "",
        )
    sheet.print(console)
