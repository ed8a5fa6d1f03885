"""``kernelab report``: a self-contained HTML page from ledger runs."""

from __future__ import annotations

import click

from kernelab.cli._common import kept, kind_option, ledger_option, user_errors


def register(app: click.Group) -> None:
    @app.command("report")
    @click.argument("runs", nargs=-1)
    @click.option("--out", "-o", default="kernelab-report.html", help="HTML file to write.")
    @click.option(
        "--baseline",
        help="A run to chart per-case speedups against ('latest': the newest run before "
        "the first one shown).",
    )
    @click.option(
        "--baseline-variant",
        default="torch",
        help="Variant that per-shape speedups within a run are measured against.",
    )
    @kind_option
    @click.option(
        "--sweep", "sweep_id", help="The bench, verify and inspect runs a sweep stored (its id)."
    )
    @click.option("--title", default="kernelab report", help="Page title.")
    @ledger_option
    @user_errors
    def report_command(runs, out, baseline, baseline_variant, kind, sweep_id, title, ledger_url):
        """Write an HTML report that opens offline (no scripts, no network): for bench runs a
        numbered roofline, latency, raw-sample and speedup charts; for verify runs pass/fail per
        op × variant and the failing cases; for inspect runs registers, spills, shared memory,
        occupancy and findings per op and target; provenance for each.

        RUNS are the runs to show: ids (or unique prefixes), labels, 'latest' (default).
        """
        from kernelab import ledger
        from kernelab.cli._common import echo
        from kernelab.report.html import write

        with ledger.open(ledger_url, readonly=True) as db:
            runs = list(runs or [])
            if sweep_id is not None:
                runs = _sweep_runs(db, sweep_id, runs)
            path = write(db, runs, out, baseline, kind, baseline_variant, title)
        echo(f"wrote {path}")
        kept(f"report {path}")


#: Kinds of sweep runs the report draws (tune and floors runs have tables of their own in
#: ``kernelab history --sweep``).
_DRAWN = ("bench", "verify", "inspect")


def _sweep_runs(db, sweep_id: str, runs: list[str]) -> list[str]:
    """The bench, verify and inspect runs of a sweep, in task order."""
    from kernelab.ledger.sweeps import get_sweep

    if runs:
        raise ValueError("--sweep: give either RUNS or --sweep, not both")
    sw = get_sweep(db, sweep_id)
    found = [t["run_id"] for t in sw["tasks"] if t["status"] == "done" and t["kind"] in _DRAWN]
    if not found:
        raise ValueError(
            f"--sweep: sweep {sw['id']} stored no bench, verify or inspect runs (see "
            f"`kernelab history --sweep {sw['id']}`)"
        )
    return found
