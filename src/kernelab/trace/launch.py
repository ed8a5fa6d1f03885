"""Launch analysis through correlation ids, with CUDA/HIP graph replays grouped.

For each GPU event with a launch call, ``delay = start - end of the launch call``. When the
event's stream was still busy with earlier work at the end of the launch call, the part of
the delay until that work finished is **queueing**; the rest is **launch latency** (the
stream was empty and the GPU still took that long to start). A kernel that starts before
its launch call returns has zero delay.

A graph replay is one launch call (``cudaGraphLaunch``) correlated with several kernels. Its
first kernel's delay is measured against the call like any launch; the kernels after it are
not launched by the host and carry no launch delay of their own.
"""

from __future__ import annotations

import itertools

import numpy as np

from kernelab.trace._ingest import KERNEL
from kernelab.trace._link import Links, percentile

US = 1e-3


def _pct(a: np.ndarray, q: float) -> float:
    return round(percentile(a, q) * US, 3) if len(a) else 0.0


def launch_analysis(links: Links, short_us: float = 5.0) -> dict:
    t = links.trace
    gpu = links.gpu
    launch = links.launch_of
    s = t.ts[gpu]
    e = s + np.maximum(t.dur[gpu], 0)
    # Queue state: the latest end of earlier work on the same (device, stream).
    stream_key = t.pid[gpu] * 1_000_003 + t.tid[gpu]
    order = np.lexsort((s, stream_key))
    prev_end = np.full(len(gpu), np.iinfo(np.int64).min, dtype=np.int64)
    if len(order):
        ks, ee = stream_key[order], e[order]
        starts = np.r_[True, ks[1:] != ks[:-1]]
        seg = np.cumsum(starts) - 1
        # running max of ends within each stream, shifted by one row
        reach = _segmented_cummax(ee, seg)
        shifted = np.r_[np.iinfo(np.int64).min, reach[:-1]]
        shifted[starts] = np.iinfo(np.int64).min
        prev_end[order] = shifted
    # Graph replays: launch rows naming a graph launch; several GPU rows share one call.
    is_graph = np.zeros(len(gpu), dtype=bool)
    has = launch >= 0
    is_graph[has] = links.graph_runtime[t.name[launch[has]]]
    first_in_call = np.ones(len(gpu), dtype=bool)
    graph_rows = np.flatnonzero(is_graph)
    replays = (graph_rows[:0], np.zeros(1, dtype=np.int64))  # rows by replay, and its bounds
    top: list[dict] = []
    if len(graph_rows):
        calls = launch[graph_rows]
        o = np.lexsort((s[graph_rows], calls))
        gr, cl = graph_rows[o], calls[o]
        head = np.r_[True, cl[1:] != cl[:-1]]
        first_in_call[gr[~head]] = False
        bounds = np.flatnonzero(np.r_[head, True])
        heads = bounds[:-1]
        sg, eg = s[gr], e[gr]
        first = np.minimum.reduceat(sg, heads)
        last = np.maximum.reduceat(eg, heads)
        busy = np.add.reduceat(eg - sg, heads)  # whole nanoseconds: exact in any order
        call_rows = cl[heads]
        # Dicts only for the ten replays the summary lists (most kernel time first, ties
        # in call order); the rest stay arrays (the Perfetto annotation reads them).
        replays = (gr, bounds)
        for i in np.argsort(-busy, kind="stable")[:10].tolist():
            a, b = int(bounds[i]), int(bounds[i + 1])
            top.append(
                {
                    "launch_ts_ns": int(t.ts[call_rows[i]]),
                    "launch_us": round(float(t.dur[call_rows[i]]) * US, 3),
                    "kernels": b - a,
                    "start_ns": int(first[i]),
                    "span_us": round(float(last[i] - first[i]) * US, 3),
                    "kernel_time_us": round(float(busy[i]) * US, 3),
                }
            )
    measured = has & first_in_call
    l_end = np.where(has, t.ts[np.maximum(launch, 0)] + t.dur[np.maximum(launch, 0)], 0)
    delay = np.maximum(s - l_end, 0)
    busy_until = np.minimum(prev_end, s)
    queue = np.where(prev_end > l_end, np.maximum(busy_until - l_end, 0), 0)
    latency = np.maximum(delay - queue, 0)
    kern = t.kind[gpu] == KERNEL
    m = measured & kern
    dur = t.dur[gpu][kern]
    short = dur < short_us * 1000
    result = {
        "kernels": int(kern.sum()),
        "with_launch": int((has & kern).sum()),
        "measured": int(m.sum()),
        "in_graph_replays": int((is_graph & kern).sum()),
        "graph_replays": len(replays[1]) - 1,
        "short_threshold_us": short_us,
        "short_kernels": int(short.sum()),
        "short_share": round(float(short.mean()), 4) if len(dur) else 0.0,
        "short_time_share": round(float(dur[short].sum() / dur.sum()), 4) if dur.sum() else 0.0,
        "delay_us": {"total": round(float(delay[m].sum()) * US, 3), "p50": _pct(delay[m], 50)},
        "latency_us": {
            "total": round(float(latency[m].sum()) * US, 3),
            "p50": _pct(latency[m], 50),
            "p90": _pct(latency[m], 90),
            "max": round(float(latency[m].max()) * US, 3) if m.any() else 0.0,
        },
        "queueing_us": {
            "total": round(float(queue[m].sum()) * US, 3),
            "p50": _pct(queue[m], 50),
            "p90": _pct(queue[m], 90),
            "max": round(float(queue[m].max()) * US, 3) if m.any() else 0.0,
        },
        "queued_share": round(float((queue[m] > 0).mean()), 4) if m.any() else 0.0,
        "replays": top,
    }
    result["_replays"] = replays  # (GPU rows of every replay in call order, bounds)
    result["_per_gpu"] = {"latency": latency, "queue": queue, "measured": measured}
    return result


def _segmented_cummax(values: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Running maximum restarted at each new segment id (segments are contiguous)."""
    if len(values) == 0:
        return values.copy()
    # Shift each segment above all earlier ones so one global cummax stays within segments.
    lo, hi = int(values.min()), int(values.max())
    width = hi - lo + 1
    if width * (int(seg.max()) + 1) < 2**62:
        shifted = (values - lo) + seg.astype(np.int64) * width
        return np.maximum.accumulate(shifted) - seg.astype(np.int64) * width + lo
    out = values.copy()
    bounds = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1], True])
    for a, b in itertools.pairwise(bounds):
        out[a:b] = np.maximum.accumulate(values[a:b])
    return out
