"""``kernelab report``: a self-contained HTML page from ledger runs."""

from __future__ import annotations

import typer

from kernelab.cli._common import console, user_errors


def register(app: typer.Typer) -> None:
    @app.command("report")
    @user_errors
    def report_command(
        runs: list[str] = typer.Argument(
            None, help="Runs to show: ids (or unique prefixes), labels, 'latest' (default)."
        ),
        out: str = typer.Option("kernelab-report.html", "--out", "-o", help="HTML file to write."),
        baseline: str = typer.Option(
            None,
            "--baseline",
            help="A run to chart per-case speedups against ('latest': the newest run before "
            "the first one shown).",
        ),
        baseline_variant: str = typer.Option(
            "torch", help="Variant that per-shape speedups within a run are measured against."
        ),
        kind: str = typer.Option("bench", help="Kind of runs that 'latest' and labels name."),
        title: str = typer.Option("kernelab report", help="Page title."),
        ledger_url: str = typer.Option(
            None, "--ledger", help="Ledger path or URL (default: KERNELAB_LEDGER or the data dir)."
        ),
    ):
        """Write an HTML report (roofline, latency and speedup charts, provenance) that opens
        offline: no scripts, no network."""
        from kernelab import ledger
        from kernelab.report.html import write

        with ledger.open(ledger_url) as db:
            path = write(db, list(runs or []), out, baseline, kind, baseline_variant, title)
        console.print(f"wrote {path}", highlight=False, markup=False)
