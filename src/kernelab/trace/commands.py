"""What ``kernelab trace summary|diff`` do, shared by the CLI and ``python -m kernelab.trace``
(which avoids importing torch). Bad input raises ValueError; the callers print one line."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
from rich.console import Console

from kernelab.trace.diff import diff
from kernelab.trace.multirank import summarize_ranks
from kernelab.trace.perfetto import write_annotated
from kernelab.trace.render import render_diff, render_ranks, render_summary
from kernelab.trace.summary import NothingToAnalyse, public, summarize


def emit(data) -> None:
    sys.stdout.write(
        orjson.dumps(
            data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str
        ).decode()
        + "\n"
    )


def run_summary(
    path: str,
    *,
    as_json: bool = False,
    top: int = 15,
    short_us: float = 5.0,
    perfetto: str | None = None,
    console: Console | None = None,
) -> int:
    """Summarise a trace file (or a folder of per-rank traces); returns the exit code."""
    console = console or Console()
    err = Console(stderr=True)
    if top < 1:
        raise ValueError(f"top: expected at least 1, got {top}")
    if short_us <= 0:
        raise ValueError(f"short_us: expected a positive threshold in us, got {short_us}")
    p = Path(path)
    if p.is_dir():
        with console.status("summarising ranks") as status:

            def progress(i, n, name):
                status.update(f"rank trace {i + 1}/{n}: {name}")

            result = summarize_ranks(p, top=top, progress=progress if not as_json else None)
        if as_json:
            emit(result)
        else:
            render_ranks(console, result)
        return 0
    try:
        if as_json:
            s = summarize(p, top=top, short_us=short_us)
        else:
            with console.status(f"reading {p.name}"):
                s = summarize(p, top=top, short_us=short_us)
    except NothingToAnalyse as exc:
        err.print(str(exc), markup=False, highlight=False)
        return 1
    if perfetto:
        out = write_annotated(s, perfetto)
        if not as_json:
            console.print(f"annotated trace for Perfetto (ui.perfetto.dev): {out}", markup=False)
    if as_json:
        emit(public(s))
    else:
        render_summary(console, public(s))
    return 0


def run_diff(a: str, b: str, *, as_json: bool = False, top: int = 20, console=None) -> int:
    console = console or Console()
    if top < 1:
        raise ValueError(f"top: expected at least 1, got {top}")
    d = diff(a, b, top=top)
    if as_json:
        emit(d)
    else:
        render_diff(console, d)
    return 0
