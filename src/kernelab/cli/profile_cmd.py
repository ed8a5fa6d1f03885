"""``kernelab profile``: run a callable or script under the PyTorch profiler and summarise it."""

from __future__ import annotations

import typer

from kernelab.cli._common import console, user_errors


def register(app: typer.Typer) -> None:
    @app.command("profile")
    @user_errors
    def profile_command(
        target: str = typer.Argument(
            ..., help="module:function, path/to/file.py:function, or path/to/script.py."
        ),
        steps: int = typer.Option(5, help="Profiled steps (calls of the target)."),
        warmup: int = typer.Option(2, help="Warm-up steps before profiling."),
        out: str = typer.Option(None, help="Where to write the trace (.json or .json.gz)."),
        device: str = typer.Option("auto", help="auto | cpu | cuda (which activities to record)."),
        json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        top: int = typer.Option(15, help="Rows in the summary tables."),
    ):
        """Profile a workload with shapes recorded, write its trace, and summarise it."""
        from rich.progress import Progress

        from kernelab.trace.commands import run_summary
        from kernelab.trace.profile import profile

        if json:
            path = profile(target, steps=steps, warmup=warmup, out=out, device=device)
        else:
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task("profiling", total=steps + warmup)
                path = profile(
                    target,
                    steps=steps,
                    warmup=warmup,
                    out=out,
                    device=device,
                    progress=lambda i, n: bar.update(task, completed=i),
                )
            console.print(f"trace written: {path}", markup=False, highlight=False)
        code = run_summary(str(path), as_json=json, top=top)
        if code:
            raise typer.Exit(code)
