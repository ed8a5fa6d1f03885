"""The ``kernelab`` command line.

Each command lives in its own module here, which defines ``register(app)``; the list below is
the only place that names them.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="kernelab",
    no_args_is_help=True,
    add_completion=False,
    help="Verified, measured Triton kernels for LLM inference, and the instruments that "
    "prove them.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: Command modules, in the order ``kernelab --help`` lists them.
COMMANDS = (
    "kernelab.cli.ops_cmd",
    "kernelab.cli.run_cmd",
    "kernelab.cli.verify_cmd",
    "kernelab.cli.bench_cmd",
    "kernelab.cli.inspect_cmd",
    "kernelab.cli.trace_cmd",
    "kernelab.cli.profile_cmd",
    "kernelab.cli.tune_cmd",
    "kernelab.cli.compare_cmd",
    "kernelab.cli.history_cmd",
    "kernelab.cli.report_cmd",
    "kernelab.cli.ceilings_cmd",
    "kernelab.cli.model_bench_cmd",
)


def _version(value: bool):
    if value:
        from kernelab.cli._common import versions

        for name, version in versions().items():
            typer.echo(f"{name} {version}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="Print versions of kernelab, torch, triton and the device, then exit.",
    ),
):
    """kernelab: kernels and the instruments that prove them."""


for _module in COMMANDS:
    importlib.import_module(_module).register(app)


def main() -> None:
    app()
