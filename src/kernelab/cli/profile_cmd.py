"""``kernelab profile``: run a callable or script under the PyTorch profiler and summarise it."""

from __future__ import annotations

import click

from kernelab.cli._common import device_option, json_option, kept, lost, user_errors


def register(app: click.Group) -> None:
    @app.command("profile")
    @click.argument("target")
    @click.option("--steps", default=5, help="Profiled steps (calls of the target).")
    @click.option("--warmup", default=2, help="Warm-up steps before profiling.")
    @click.option(
        "--out",
        help="Where to write the trace (.json or .json.gz); default: a file named by the "
        "target and the time under the cache dir's profiles/ (the path is printed).",
    )
    @device_option("auto, cpu or cuda: which activities to record.", default="auto")
    @json_option
    @click.option("--top", default=15, help="Rows in the summary tables.")
    @click.option(
        "--memory/--no-memory",
        default=True,
        show_default=True,
        help="Record allocations (profile_memory): peak, timeline, live tensors by op.",
    )
    @user_errors
    def profile_command(target, steps, warmup, out, device, as_json, top, memory):
        """Profile a workload with shapes recorded, write its trace, and summarise it.

        TARGET is module:function, path/to/file.py:function, or path/to/script.py.
        """
        from kernelab.cli._trace import run_summary
        from kernelab.trace.profile import profile

        lost("the trace: written when every step is profiled")
        if as_json:
            path = profile(
                target, steps=steps, warmup=warmup, out=out, device=device, memory=memory
            )
            click.echo(f"trace written: {path}", err=True)  # stdout stays JSON
        else:
            from rich.progress import Progress

            from kernelab.cli._common import console, echo

            with Progress(console=console, transient=True) as bar:
                task = bar.add_task("profiling", total=steps + warmup)
                path = profile(
                    target,
                    steps=steps,
                    warmup=warmup,
                    out=out,
                    device=device,
                    memory=memory,
                    progress=lambda i, n: bar.update(task, completed=i),
                )
            echo(f"trace written: {path}")
        lost(None)
        kept(f"trace {path}")
        code = run_summary(str(path), as_json=as_json, top=top)
        if code:
            raise click.exceptions.Exit(code)
