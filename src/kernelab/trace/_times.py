"""Times that cannot be right: stamps that overflow int64 nanoseconds, and stamps far
outside the bulk of a trace (a ``ts`` of 0 among epoch microseconds)."""

from __future__ import annotations

import numpy as np

#: The largest |ts| or dur kept, in microseconds: times are held as int64 nanoseconds
#: relative to the trace's start, and 2**62 ns leaves room for that subtraction. Kineto's
#: epoch-microsecond stamps are near 1.7e15 (2024); 1e16 or 1e300 is a corrupt stamp.
TIME_LIMIT_US = 2**62 / 1000
#: An edge group of events is an outlier when the gap that separates it from the rest is
#: more than this many times the rest's span (a stamp of 0 among epoch times: 1e8 times).
OUTLIER_GAP = 1000
#: ... and more than this (ns): a tiny trace's few microseconds of lead-in are not outliers.
OUTLIER_MIN_GAP_NS = 10**9
#: At most this share of the events (and 1000) can be outliers at each edge.
OUTLIER_SHARE = 0.01


def times_ok(ts_a: np.ndarray, dur_a: np.ndarray) -> np.ndarray:
    """Per row: both times finite and within :data:`TIME_LIMIT_US`."""
    with np.errstate(invalid="ignore"):
        return (np.abs(ts_a) < TIME_LIMIT_US) & (np.abs(dur_a) < TIME_LIMIT_US)


def outlying(ts: np.ndarray) -> np.ndarray:
    """Rows whose start is far outside the bulk of the trace's start times: those before
    the widest gap near the earliest starts (or after the widest near the latest) when that
    gap exceeds :data:`OUTLIER_GAP` times the span of the rest's starts and
    :data:`OUTLIER_MIN_GAP_NS`. The span leaves out the other edge's candidates, so one stray
    stamp at each end does not hide the other; starts only, because an honest enclosing span
    (a profiler step) ends long after the rest. Returns a boolean mask."""
    n = len(ts)
    out = np.zeros(n, dtype=bool)
    if n < 3:
        return out
    m = max(1, min(int(n * OUTLIER_SHARE), 1000, n - 2))
    order = np.argsort(ts, kind="stable")
    lo = ts[order[: m + 1]].astype(np.float64)  # the m + 1 earliest starts, ascending
    hi = ts[order[n - m - 1 :]].astype(np.float64)  # the m + 1 latest
    bottom, top = lo[m], hi[0]
    low = (lo[1:] - lo[:m], top - lo[1:])
    high = (hi[1:] - hi[:m], hi[:m] - bottom)
    for side, (gaps, rest) in (("low", low), ("high", high)):
        wide = (gaps > OUTLIER_GAP * np.maximum(rest, 1)) & (gaps > OUTLIER_MIN_GAP_NS)
        hit = np.flatnonzero(wide)
        if not len(hit):
            continue
        i = int(hit[np.argmax(gaps[hit])])
        if side == "low":
            out[order[: i + 1]] = True
        else:
            out[order[n - m + i :]] = True
    return out


def drop_outliers(cols: dict, strings: list) -> dict:
    """Remove the rows :func:`outlying` finds from ``cols`` (in place); describe them."""
    ts = cols["ts"]
    mask = outlying(ts)
    count = int(mask.sum())
    if not count:
        return {"count": 0, "examples": []}
    rows = np.flatnonzero(mask)
    bulk = ts[~mask]
    lo, hi = int(bulk.min()), int((bulk + cols["dur"][~mask]).max())
    examples = [
        {
            "name": strings[int(cols["name"][i])],
            "offset_from_bulk_us": round(
                (int(ts[i]) - lo if ts[i] < lo else int(ts[i]) - hi) / 1e3, 3
            ),
        }
        for i in rows[:5].tolist()
    ]
    for k in list(cols):
        cols[k] = cols[k][~mask]
    return {"count": count, "examples": examples, "_mask": mask}
