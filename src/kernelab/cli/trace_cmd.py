"""``kernelab trace summary|diff``: where a workload's time goes in a PyTorch profiler trace."""

from __future__ import annotations

import typer

from kernelab.cli._common import user_errors


def register(app: typer.Typer) -> None:
    trace_app = typer.Typer(
        name="trace",
        no_args_is_help=True,
        help="Analyse PyTorch profiler (Kineto) traces: breakdown, idle, launches, roofline, "
        "fusion, occupancy.",
    )

    @trace_app.command("summary")
    @user_errors
    def summary_command(
        trace: str = typer.Argument(
            ..., help="A .json or .json.gz trace, or a folder of per-rank traces."
        ),
        json: bool = typer.Option(False, "--json", help="Print JSON (docs/trace.md) instead."),
        top: int = typer.Option(15, help="Rows in the top-kernel, roofline and CPU tables."),
        short_us: float = typer.Option(5.0, help="Kernels shorter than this (us) are 'short'."),
        perfetto: str = typer.Option(
            None, help="Also write the trace annotated with the findings (.json or .json.gz)."
        ),
    ):
        """Summarise a trace: GPU time, idle causes, launches, top kernels, what to change."""
        from kernelab.trace.commands import run_summary

        code = run_summary(trace, as_json=json, top=top, short_us=short_us, perfetto=perfetto)
        if code:
            raise typer.Exit(code)

    @trace_app.command("diff")
    @user_errors
    def diff_command(
        a: str = typer.Argument(..., help="The baseline trace."),
        b: str = typer.Argument(..., help="The trace to compare with it."),
        json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
        top: int = typer.Option(20, help="Kernel groups to show."),
    ):
        """Kernel time and count deltas per kernel group and category, ranked by impact."""
        from kernelab.trace.commands import run_diff

        run_diff(a, b, as_json=json, top=top)

    app.add_typer(trace_app)
