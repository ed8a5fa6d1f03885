"""What ``kernelab trace summary|diff`` do (``kernelab profile`` summarises through it too),
without importing torch. Bad input raises ValueError; the callers print one line. The analysis
is :mod:`kernelab.trace`'s; here are the console, the JSON and the pages."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from kernelab.trace.diff import diff
from kernelab.trace.multirank import summarize_ranks
from kernelab.trace.perfetto import check_output, write_annotated
from kernelab.trace.summary import NothingToAnalyse, public, summarize

# rich (and the renderers) load only for output meant for people: --json stays light.


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
    html: str | None = None,
    console=None,
    workers: int | None = None,
    limits=None,
) -> int:
    """Summarise a trace file (or a folder of per-rank traces); returns the exit code.
    ``limits``: a :class:`~kernelab.trace.Limits` (None: the environment's or the defaults).
    ``workers``: processes decoding the file (``None``: one, or KERNELAB_TRACE_WORKERS); ``html``:
    also write the summary as a self-contained page there."""
    if top < 1:
        raise ValueError(f"top: expected at least 1, got {top}")
    if short_us <= 0:
        raise ValueError(f"short_us: expected a positive threshold in us, got {short_us}")
    if perfetto:
        check_output(perfetto)  # before the analysis, not after it
    p = Path(path)
    if html:
        from kernelab.report import trace_page

        trace_page.check_output(html)
        if p.is_dir():
            raise ValueError(
                f"html: the page shows one trace; {path!r} is a folder (give one rank's file)"
            )
    if not as_json:
        from rich.console import Console

        console = console or Console()
    if p.is_dir():
        if as_json:
            emit(summarize_ranks(p, top=top, limits=limits))
            return 0
        from kernelab.trace.render import render_ranks

        with console.status("summarising ranks") as status:

            def progress(i, n, name):
                status.update(f"rank trace {i + 1}/{n}: {name}")

            result = summarize_ranks(p, top=top, progress=progress, limits=limits)
        render_ranks(console, result)
        return 0
    try:
        if as_json:
            s = summarize(p, top=top, short_us=short_us, workers=workers, limits=limits)
        else:
            with console.status(f"reading {p.name}"):
                s = summarize(p, top=top, short_us=short_us, workers=workers, limits=limits)
    except NothingToAnalyse as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    if perfetto:
        out = write_annotated(s, perfetto)
        if not as_json:
            console.print(f"annotated trace for Perfetto (ui.perfetto.dev): {out}", markup=False)
    doc = public(s)
    if html:
        page = trace_page.write(doc, html)
        if not as_json:
            console.print(f"HTML report: {page}", markup=False)
    if as_json:
        emit(doc)
    else:
        from kernelab.trace.render import render_summary

        render_summary(console, doc)
    return 0


def run_diff(
    a: str,
    b: str,
    *,
    as_json: bool = False,
    top: int = 20,
    console=None,
    workers: int | None = None,
    limits=None,
) -> int:
    if top < 1:
        raise ValueError(f"top: expected at least 1, got {top}")
    d = diff(a, b, top=top, workers=workers, limits=limits)
    if as_json:
        emit(d)
    else:
        from rich.console import Console

        from kernelab.trace.render import render_diff

        render_diff(console or Console(), d)
    return 0
