"""The ``kernelab`` command line (click).

Each command lives in its own module here, which defines ``register(group)``. :data:`COMMANDS`
is the only place that names them. A module is imported only when its command runs (or when
the full help lists every command), so a quick command such as ``kernelab trace summary``
pays neither for torch and the ops nor for the other commands' imports.
"""

from __future__ import annotations

import gc
import importlib
import sys

import click

#: Command name -> the module that registers it, in the order ``kernelab --help`` lists them.
COMMANDS = {
    "ops": "kernelab.cli.ops_cmd",
    "run": "kernelab.cli.run_cmd",
    "verify": "kernelab.cli.verify_cmd",
    "bench": "kernelab.cli.bench_cmd",
    "inspect": "kernelab.cli.inspect_cmd",
    "trace": "kernelab.cli.trace_cmd",
    "profile": "kernelab.cli.profile_cmd",
    "tune": "kernelab.cli.tune_cmd",
    "sweep": "kernelab.cli.sweep_cmd",
    "compare": "kernelab.cli.compare_cmd",
    "history": "kernelab.cli.history_cmd",
    "report": "kernelab.cli.report_cmd",
    "ceilings": "kernelab.cli.ceilings_cmd",
    "model-bench": "kernelab.cli.model_bench_cmd",
    "model-cost": "kernelab.cli.model_cost_cmd",
    "serve-bench": "kernelab.cli.serve_bench_cmd",
}


class _LazyGroup(click.Group):
    """A group whose commands are built from their module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module = COMMANDS[cmd_name]
            importlib.import_module(module).register(self)
            if cmd_name not in self.commands:
                raise RuntimeError(f"{module}.register did not define the command {cmd_name!r}")
        return self.commands.get(cmd_name)


def _version(ctx: click.Context, _param, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from kernelab.cli._common import versions

    for name, version in versions().items():
        click.echo(f"{name} {version}")
    ctx.exit()


@click.group(
    name="kernelab",
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_version,
    help="Print versions of kernelab, torch, triton and the device, then exit.",
)
def app() -> None:
    """Verified, measured Triton kernels for LLM inference, and the instruments that prove
    them."""


#: Commands that finish in about a second and keep no reference cycles worth collecting: the
#: cyclic collector only costs them time (its passes during the imports).
_NO_CYCLE_COLLECTION = {"trace"}


def main() -> None:
    """The console entry point (the process ends after the command)."""
    if sys.argv[1:2] and sys.argv[1] in _NO_CYCLE_COLLECTION:
        gc.disable()
    app()
