"""Trace analysis: where a workload's time goes in a PyTorch profiler (Kineto) trace, and what
to change. Importing this package loads numpy and orjson only (no torch).

    from kernelab.trace import summarize
    report = summarize("trace.json.gz")
"""

from kernelab.trace._ingest import Trace, TraceError, load
from kernelab.trace._limits import Limits, TraceLimitError
from kernelab.trace._limits import parse as parse_limit
from kernelab.trace.summary import SCHEMA, NothingToAnalyse, public, summarize

__all__ = [
    "SCHEMA",
    "Limits",
    "NothingToAnalyse",
    "Trace",
    "TraceError",
    "TraceLimitError",
    "load",
    "parse_limit",
    "public",
    "summarize",
]
