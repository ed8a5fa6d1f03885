"""Every environment variable kernelab reads, declared in one place.

| variable            | meaning                                                            |
|---------------------|--------------------------------------------------------------------|
| KERNELAB_INTERPRET  | "1": on CPU tensors, public ops run their Triton kernel through     |
|                     | Triton's interpreter instead of the torch implementation (tests).   |
| KERNELAB_LEDGER     | results ledger: a path to an SQLite file or a database URL.         |
| KERNELAB_CACHE_DIR  | where compiled-artifact and measurement caches live.                |
| KERNELAB_DATA_DIR   | where the default ledger lives (else $XDG_DATA_HOME/kernelab).      |
| KERNELAB_SHARED     | the folder with the shared device facts and traces (tests).         |
| KERNELAB_TRACE_WORKERS | processes that decode a trace (unset: one).                       |
| KERNELAB_SWEEP_MAX_TASKS | the most tasks a sweep may expand to (unset: 500,000).          |


| KERNELAB_TRACE_MAX_BYTES | the most bytes a trace may decompress to (e.g. 4G; unset: 2G).  |
| KERNELAB_TRACE_MAX_EVENTS | the most events a trace may hold (unset: 5000000).             |
| KERNELAB_TRACE_MAX_DEPTH | the deepest nesting of a trace's JSON (unset: 128).             |
"""

from __future__ import annotations

import os
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}


def _get(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def interpret() -> bool:
    """Whether public ops on CPU tensors run the Triton kernel through the interpreter."""
    return (_get("KERNELAB_INTERPRET") or "0").lower() in _TRUE


def cache_dir() -> Path:
    base = _get("KERNELAB_CACHE_DIR")
    if base:
        return Path(base)
    xdg = _get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kernelab"


def data_dir() -> Path:
    """Where kernelab keeps its data (the default ledger)."""
    base = _get("KERNELAB_DATA_DIR")
    if base:
        return Path(base)
    xdg = _get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "kernelab"


def ledger_url() -> str | None:
    return _get("KERNELAB_LEDGER")


def trace_workers() -> int | None:
    """Processes that decode a trace, if set (``None``: the default, one process)."""
    value = _get("KERNELAB_TRACE_WORKERS")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"KERNELAB_TRACE_WORKERS: expected a whole number of processes, got {value!r}"
        ) from None


def sweep_max_tasks() -> int | None:
    """The most tasks a sweep may have, if set (``None``: the default)."""
    value = _get("KERNELAB_SWEEP_MAX_TASKS")
    if value is None:
        return None
    try:
        n = int(value.replace("_", ""))
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(
            f"KERNELAB_SWEEP_MAX_TASKS: expected a positive number of tasks, got {value!r}"
        )
    return n


def trace_limit(name: str) -> str | None:
    """``KERNELAB_TRACE_MAX_<NAME>`` as written (``None``: unset); parsed by
    :mod:`kernelab.trace._limits`."""
    return _get(f"KERNELAB_TRACE_MAX_{name.upper()}")


def shared_dir() -> Path | None:
    """The shared folder (device facts, real traces), if it can be found."""
    explicit = _get("KERNELAB_SHARED")
    if explicit:
        return Path(explicit)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared"
        if (parent / "pyproject.toml").exists() and candidate.is_dir():
            return candidate
    return None
