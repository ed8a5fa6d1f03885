"""Memory from ``[memory]`` instants (``torch.profiler.profile(profile_memory=True)``).

Each instant is one allocation (``Bytes`` > 0) or free (``Bytes`` < 0) at ``Addr``, with
the allocator's totals after it: ``Total Allocated`` (bytes in live tensors) and
``Total Reserved`` (bytes the caching allocator holds from the device, 0 on CPU). Per device:

- **peak allocated** and **peak reserved**, and when (µs from the trace's start);
- **slack at the peak**: reserved minus allocated at the moment of peak allocation (memory the
  caching allocator holds but no tensor uses: cached blocks and fragmentation);
- **timeline**: allocated and reserved at up to :data:`TIMELINE_POINTS` times (the maximum
  within each time bin, so that no peak is lost);
- **live at the peak, by op**: the allocations not yet freed at the peak, grouped by the
  innermost CPU op that made them (on the same thread), largest first;
- **never freed**: allocations with no free of their address later in the trace (alive at
  its end: outputs, caches, or leaks if the window spans whole steps).
"""

from __future__ import annotations

import numpy as np

from kernelab.trace._ingest import CPU_OP
from kernelab.trace._link import Links, distinct

US = 1e-3
TIMELINE_POINTS = 64
_DEVICE_TYPES = {0: "cpu", 1: "cuda"}


def _device(kind: int, index: int) -> str:
    name = _DEVICE_TYPES.get(kind, f"device_type_{kind}")
    return name if index < 0 else f"{name}:{index}"


def _owners(links: Links, tid: np.ndarray, ts: np.ndarray) -> list[str | None]:
    """The innermost CPU op on the same thread enclosing each time, by name (None)."""
    t = links.trace
    ops = np.flatnonzero(t.kind == CPU_OP)
    out: list[str | None] = [None] * len(ts)
    for th in distinct(tid).tolist():
        q = np.flatnonzero(tid == th)
        rows = ops[t.tid[ops] == th]
        if not len(rows):
            continue
        rows = rows[np.lexsort((-t.dur[rows], t.ts[rows]))]
        start, end = t.ts[rows], t.ts[rows] + np.maximum(t.dur[rows], 0)
        pos = np.searchsorted(start, ts[q], side="right") - 1
        for i, p in zip(q.tolist(), pos.tolist(), strict=True):
            # The latest-starting op that still contains the time is the innermost one.
            while p >= 0 and end[p] < ts[i]:
                p -= 1
            if p >= 0:
                out[i] = t.strings[int(t.name[rows[p]])]
    return out


def _by_op(names: list, sizes: np.ndarray, top: int) -> list[dict]:
    totals: dict[str, list] = {}
    for n, b in zip(names, sizes.tolist(), strict=True):
        c = totals.setdefault(n or "(outside any op)", [0, 0])
        c[0] += 1
        c[1] += b
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"op": n, "allocations": c, "bytes": b} for n, (c, b) in ranked]


def _timeline(ts: np.ndarray, alloc: np.ndarray, res: np.ndarray, t0: int) -> list[list]:
    if len(ts) <= TIMELINE_POINTS:
        return [
            [round((a - t0) * US, 3), int(b), int(c)]
            for a, b, c in zip(ts, alloc, res, strict=True)
        ]
    edges = np.linspace(ts[0], ts[-1], TIMELINE_POINTS + 1)
    bins = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, TIMELINE_POINTS - 1)
    out = []
    for b in distinct(bins).tolist():
        sel = bins == b
        out.append(
            [round((float(edges[b]) - t0) * US, 3), int(alloc[sel].max()), int(res[sel].max())]
        )
    return out


def memory_analysis(links: Links, top: int = 5) -> list[dict] | None:
    """Per device, as described in the module docstring; None without ``[memory]`` events."""
    m = links.trace.memory
    if m is None or not len(m["ts"]):
        return None
    t = links.trace
    t0 = int(t.ts.min()) if len(t.ts) else int(m["ts"].min())
    out = []
    keys = m["device_type"] * 1_000_003 + m["device_id"]
    for key in distinct(keys).tolist():
        sel = np.flatnonzero(keys == key)
        sel = sel[np.argsort(m["ts"][sel], kind="stable")]  # time order, file order in ties
        ts, alloc, res = m["ts"][sel], m["allocated"][sel], m["reserved"][sel]
        addr, size, tid = m["addr"][sel], m["bytes"][sel], m["tid"][sel]
        ip, ir = int(np.argmax(alloc)), int(np.argmax(res))
        live: dict[int, int] = {}  # address -> index of its allocation
        at_peak: list[int] = []
        for i, (a, b) in enumerate(zip(addr.tolist(), size.tolist(), strict=True)):
            if b > 0:
                live[a] = i
            elif b < 0:
                live.pop(a, None)
            if i == ip:
                at_peak = list(live.values())
        never = np.array(sorted(live.values()), dtype=np.int64)
        at_peak_a = np.array(sorted(at_peak), dtype=np.int64)
        wanted = distinct(np.concatenate([never, at_peak_a]))  # np.union1d loads numpy.ma
        owner = dict(zip(wanted.tolist(), _owners(links, tid[wanted], ts[wanted]), strict=True))
        out.append(
            {
                "device": _device(int(m["device_type"][sel[0]]), int(m["device_id"][sel[0]])),
                "events": len(sel),
                "allocations": int((size > 0).sum()),
                "frees": int((size < 0).sum()),
                "peak_allocated_bytes": int(alloc[ip]),
                "peak_allocated_at_us": round((int(ts[ip]) - t0) * US, 3),
                "peak_reserved_bytes": int(res[ir]),
                "peak_reserved_at_us": round((int(ts[ir]) - t0) * US, 3),
                "reserved_at_peak_bytes": int(res[ip]),
                "slack_at_peak_bytes": int(max(res[ip] - alloc[ip], 0)),
                "live_at_peak_by_op": _by_op(
                    [owner[i] for i in at_peak_a.tolist()], size[at_peak_a], top
                ),
                "never_freed": {
                    "allocations": len(never),
                    "bytes": int(size[never].sum()) if len(never) else 0,
                    "by_op": _by_op([owner[i] for i in never.tolist()], size[never], top),
                },
                "timeline": _timeline(ts, alloc, res, t0),
                "timeline_columns": ["t_us", "allocated_bytes", "reserved_bytes"],
            }
        )
    return out
