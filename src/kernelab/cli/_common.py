"""Helpers shared by commands: versions, consoles, JSON output, error handling."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import TYPE_CHECKING

import click
import orjson

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


#: The ``--ledger`` option of every command that reads or writes the results ledger.
ledger_option = click.option(
    "--ledger",
    "ledger_url",
    help="Ledger path or URL (default: KERNELAB_LEDGER or the data dir).",
)


def _console(name: str) -> Console:
    """``console`` (stdout) or ``err_console`` (stderr), made (with rich) on first use: a
    command printing JSON never loads rich. A new one is made when ``COLUMNS`` changes (rich
    reads it once), so tables are laid out for the width asked for."""
    key = (name, os.environ.get("COLUMNS"))
    if key not in _CONSOLES:
        from rich.console import Console

        _CONSOLES[key] = Console(stderr=name == "err_console")
    return _CONSOLES[key]


_CONSOLES: dict[tuple[str, str | None], Console] = {}


def __getattr__(name: str) -> Console:
    if name in ("console", "err_console"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def versions(device: str | None = None) -> dict[str, str]:
    import torch
    import triton

    import kernelab
    from kernelab.hardware import detect

    info = detect(device)
    dev = info.name if info.type == "cpu" else f"{info.name} ({info.arch}, {info.sm_count} SMs)"
    return {
        "kernelab": kernelab.__version__,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "device": f"{info.type}: {dev}",
    }


def emit_json(data) -> None:
    """Write ``data`` as JSON to stdout (for programs)."""
    sys.stdout.write(
        orjson.dumps(
            data,
            option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
            default=str,
        ).decode()
    )
    sys.stdout.write("\n")


def user_errors(fn: Callable) -> Callable:
    """Turn bad input (ValueError, TypeError, FileNotFoundError) into one line and exit 2."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError, FileNotFoundError, PermissionError) as exc:
            from rich.markup import escape

            _console("err_console").print(
                f"[bold red]error:[/] {escape(str(exc))}",
                markup=True,
                highlight=False,
                soft_wrap=True,
            )
            raise click.exceptions.Exit(2) from None

    return wrapper


def select_ops(names: list[str] | None):
    """Ops by name (all when none given); an unknown name is an error naming the choices."""
    from kernelab import ops

    if not names:
        return ops.all_ops()
    return [ops.get(n) for n in names]


def transient_progress(disable: bool = False) -> Progress:
    """A spinner with a message and the elapsed time, on stderr, gone when done."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=_console("err_console"),
        transient=True,
        disable=disable,
    )


@contextmanager
def spinner(first: str = "starting", disable: bool = False) -> Iterator[Callable[[str], None]]:
    """``with spinner() as say: ... say("message")`` — long work shows what it is doing."""
    from rich.markup import escape

    with transient_progress(disable) as progress:
        task = progress.add_task(escape(first), total=None)
        yield lambda msg: progress.update(task, description=escape(msg))
