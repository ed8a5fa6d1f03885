"""``kernelab trace summary|diff``: where a workload's time goes in a PyTorch profiler trace."""

from __future__ import annotations

import os
import sys

import click

from kernelab.cli._common import json_option, user_errors


def _one_blas_thread() -> None:
    """Trace analysis never multiplies matrices: keep numpy's BLAS from starting a thread per
    core (they spin for a while at start, competing with the decoding workers). Only this
    command's process, and only if numpy is not loaded yet."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _limit_options(fn):
    """--max-bytes, --max-events, --max-depth: how much of an untrusted trace is read."""
    fn = click.option(
        "--max-depth",
        help="Deepest JSON nesting read, at most 900 [default: 128; KERNELAB_TRACE_MAX_DEPTH].",
    )(fn)
    fn = click.option(
        "--max-events",
        help="Most events a trace may hold [default: 5000000; KERNELAB_TRACE_MAX_EVENTS].",
    )(fn)
    return click.option(
        "--max-bytes",
        help="Most bytes a trace may decompress to, e.g. 4G [default: 2G; "
        "KERNELAB_TRACE_MAX_BYTES].",
    )(fn)


def _limits(max_bytes, max_events, max_depth):
    from kernelab.trace import Limits

    return Limits.resolve(
        max_bytes=max_bytes,
        max_events=None if max_events is None else _whole(max_events, "--max-events"),
        max_depth=None if max_depth is None else _whole(max_depth, "--max-depth"),
    )


def _whole(value: str, option: str) -> int:
    from kernelab.trace import parse_limit

    return parse_limit(value, option)


def register(app: click.Group) -> None:
    @app.group("trace")
    def trace_group() -> None:
        """Analyse PyTorch profiler (Kineto) traces: breakdown, idle, launches, roofline,
        fusion, occupancy."""

    @trace_group.command("summary")
    @click.argument("trace")
    @json_option
    @click.option("--top", default=15, help="Rows in the top-kernel, roofline and CPU tables.")
    @click.option("--short-us", default=5.0, help="Kernels shorter than this (us) are 'short'.")
    @click.option(
        "--perfetto", help="Also write the trace annotated with the findings (.json or .json.gz)."
    )
    @click.option(
        "--html", help="Also write the summary as a self-contained HTML page (memory timeline)."
    )
    @click.option(
        "--workers",
        type=click.IntRange(min=1),
        help="Processes that decode a large trace [default: 1; KERNELAB_TRACE_WORKERS].",
    )
    @_limit_options
    @user_errors
    def summary_command(
        trace, as_json, top, short_us, perfetto, html, workers, max_bytes, max_events, max_depth
    ):
        """Summarise a trace: GPU time, idle causes, launches, top kernels, what to change.

        TRACE is a .json or .json.gz trace, or a folder of per-rank traces.
        """
        _one_blas_thread()
        from kernelab.cli._trace import run_summary

        code = run_summary(
            trace,
            as_json=as_json,
            top=top,
            short_us=short_us,
            perfetto=perfetto,
            html=html,
            workers=workers,
            limits=_limits(max_bytes, max_events, max_depth),
        )
        if code:
            raise click.exceptions.Exit(code)

    @trace_group.command("diff")
    @click.argument("a")
    @click.argument("b")
    @json_option
    @click.option("--top", default=20, help="Kernel groups to show.")
    @_limit_options
    @user_errors
    def diff_command(a, b, as_json, top, max_bytes, max_events, max_depth):
        """Kernel time and count deltas per kernel group and category, ranked by impact.

        A is the baseline trace, B the trace compared with it.
        """
        _one_blas_thread()
        from kernelab.cli._trace import run_diff

        run_diff(a, b, as_json=as_json, top=top, limits=_limits(max_bytes, max_events, max_depth))
