"""Number formatting shared by tables and the HTML report."""

from __future__ import annotations

import csv
import io
import math


def seconds(value: float | None) -> str:
    """1.23 ms, 45.6 µs, 789 ns; "-" for missing."""
    if value is None or not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def number(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int | float):
        return f"{value:.{digits}g}"
    return str(value)


def count(value) -> str:
    """A whole number as digits (2048, not 2.05e+03); "-" for missing."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return str(int(value)) if math.isfinite(value) and value == int(value) else number(value)


def nbytes(value) -> str:
    """0 B, 512 B, 48 KiB, 1.5 MiB; "-" for missing."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{int(value)} B"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}×"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def to_csv(rows: list[dict], columns: list[str]) -> str:
    """Rows as CSV text with a header; values outside ``columns`` are left out."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in columns})
    return out.getvalue()


def _cell(value):
    if isinstance(value, list | tuple):
        return ";".join(str(v) for v in value)
    if value is None:
        return ""
    return value
