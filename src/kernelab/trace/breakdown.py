"""GPU time per device and stream by category, and the idle time between busy periods,
attributed to what the GPU was waiting for.

Definitions (docs/trace.md):
- span of a device: first GPU activity start to last GPU activity end on it;
- kernel time of a category: the sum of its events' durations (overlaps counted twice);
- launched kernel time: the kernel time of events whose launch call is in the trace (what
  HTA counts when the trace has ProfilerStep annotations);
- busy time of a category: the union of its events' intervals (overlaps counted once);
- idle: span minus the union of all GPU activity.

An idle gap ends when some GPU event E starts. It is attributed to:
- ``sync``: the thread that launched E returned from a device, stream or event
  synchronisation inside the gap, before calling E's launch (the host blocked until the GPU
  drained, then had to refill it);
- ``host``: otherwise, when E's launch call ended after the gap began (the GPU waited for the
  host to launch);
- ``other``: E was launched before the gap began (cross-stream dependencies, waits on events,
  graph-internal gaps) or E has no launch call in the trace.
"""

from __future__ import annotations

import numpy as np

from kernelab.trace._link import CATEGORY_ORDER, Links, covered, distinct, merge

US = 1e-3  # ns -> us


def _us(ns) -> float:
    return round(float(ns) * US, 3)


def breakdown(links: Links) -> list[dict]:
    """Per device: span, kernel and busy time per category, idle, and per stream."""
    t = links.trace
    gpu = links.gpu
    cat = links.category
    out = []
    dev_of = t.pid[gpu]
    launched_all = links.launch_of >= 0
    for dev in distinct(dev_of):
        sel = dev_of == dev
        rows = gpu[sel]
        c = cat[sel]
        launched = launched_all[sel]
        s, e = t.ts[rows], t.ts[rows] + np.maximum(t.dur[rows], 0)
        span = int(e.max() - s.min())
        ms, me = merge(s, e)
        busy = int((me - ms).sum())
        cats = {}
        for ci, name in enumerate(CATEGORY_ORDER):
            m = c == ci
            cs, ce = merge(s[m], e[m])
            cats[name] = {
                "kernel_time_us": _us((e[m] - s[m]).sum()),
                "launched_kernel_time_us": _us((e[m & launched] - s[m & launched]).sum()),
                "busy_us": _us((ce - cs).sum()),
                "count": int(m.sum()),
                "share_of_span": round(float((ce - cs).sum()) / span, 4) if span else 0.0,
            }
        streams = []
        stream_of = t.tid[rows]
        for st in distinct(stream_of):
            ms_ = stream_of == st
            ss, se = s[ms_], e[ms_]
            per = {
                name: _us((se - ss)[c[ms_] == ci].sum()) for ci, name in enumerate(CATEGORY_ORDER)
            }
            streams.append(
                {
                    "stream": int(st),
                    "count": int(ms_.sum()),
                    "kernel_time_us": per,
                    "busy_us": _us(covered(ss, se)),
                    "share_of_span": round(covered(ss, se) / span, 4) if span else 0.0,
                }
            )
        streams.sort(key=lambda r: -r["busy_us"])
        out.append(
            {
                "device": int(dev),
                "start_ns": int(s.min()),
                "span_us": _us(span),
                "busy_us": _us(busy),
                "idle_us": _us(span - busy),
                "idle_share": round((span - busy) / span, 4) if span else 0.0,
                "categories": cats,
                "streams": streams,
            }
        )
    return out


#: Host-caused idle gaps shorter than this (ns) are launch overhead (the host launches as
#: fast as it can and the GPU finishes first); longer ones are the host doing other work.
LAUNCH_GAP_NS = 100_000


def idle_gaps(links: Links, min_gap_ns: int = 0) -> list[dict]:
    """Per device: idle gaps with their attribution, summed, plus the largest gaps."""
    t = links.trace
    gpu = links.gpu
    launch = links.launch_of
    out = []
    sync = links.sync_rows
    sync_thread = t.pid[sync] * 1_000_003 + t.tid[sync]
    sync_end = t.ts[sync] + t.dur[sync]
    order = np.lexsort((sync_end, sync_thread))
    sync_thread, sync_end, sync = sync_thread[order], sync_end[order], sync[order]
    sync_kind = links.sync_kind
    for dev in distinct(t.pid[gpu]):
        sel = np.flatnonzero(t.pid[gpu] == dev)
        rows = gpu[sel]
        s = t.ts[rows]
        e = s + np.maximum(t.dur[rows], 0)
        ms, me = merge(s, e)
        gap_a, gap_b = me[:-1], ms[1:]
        keep = (gap_b - gap_a) > min_gap_ns
        gap_a, gap_b = gap_a[keep], gap_b[keep]
        # The event that ends each gap: the first GPU row (by start) starting at gap_b.
        first = np.searchsorted(s, gap_b, side="left")  # rows are sorted by start
        ender = sel[first]
        lrow = launch[ender]
        kind = np.full(len(gap_a), 2, dtype=np.int8)  # 0 sync, 1 host, 2 other
        sync_of = np.full(len(gap_a), -1, dtype=np.int64)
        has = lrow >= 0
        lr = np.maximum(lrow, 0)
        l_start = t.ts[lr]
        l_end = l_start + t.dur[lr]
        thread = t.pid[lr] * 1_000_003 + t.tid[lr]
        if len(sync):
            # The latest sync on the launching thread ending by the launch call's start:
            # did it end inside the gap?
            for th in distinct(sync_thread):
                lo, hi = np.searchsorted(sync_thread, [th, th + 1])
                ends_t = sync_end[lo:hi]
                q = np.flatnonzero(has & (thread == th))
                if not len(q):
                    continue
                j = np.searchsorted(ends_t, l_start[q], side="right") - 1
                ok = j >= 0
                hit = q[ok][ends_t[j[ok]] >= gap_a[q[ok]]]
                kind[hit] = 0
                sync_of[hit] = sync[lo + j[ok][ends_t[j[ok]] >= gap_a[q[ok]]]]
        host = has & (kind == 2) & (l_end > gap_a)
        kind[host] = 1
        length = gap_b - gap_a
        totals = {
            name: _us(length[kind == k].sum()) for k, name in enumerate(("sync", "host", "other"))
        }
        host_len = np.sort(length[kind == 1])
        short_host = host_len[host_len < LAUNCH_GAP_NS]
        host_gaps = {
            "count": len(host_len),
            "p50_us": _us(host_len[len(host_len) // 2]) if len(host_len) else 0.0,
            "max_us": _us(host_len[-1]) if len(host_len) else 0.0,
            "short_us": _us(short_host.sum()),
        }
        sync_by_kind: dict[str, float] = {}
        for i in np.flatnonzero(kind == 0):
            sk = sync_kind.get(int(t.name[sync_of[i]]), "device")
            sync_by_kind[sk] = round(sync_by_kind.get(sk, 0.0) + float(length[i]) * US, 3)
        top = np.argsort(-length, kind="stable")[:10]
        out.append(
            {
                "device": int(dev),
                "gaps": len(length),
                "idle_us": _us(length.sum()),
                "by_cause_us": totals,
                "sync_by_kind_us": sync_by_kind,
                "host_gaps": host_gaps,
                "largest": [
                    {
                        "start_us": _us(gap_a[i] - ms[0]),
                        "length_us": _us(length[i]),
                        "cause": ("sync", "host", "other")[kind[i]],
                        "next": t.strings[t.name[gpu[ender[i]]]],
                    }
                    for i in top
                ],
                "_gaps": (gap_a, gap_b, kind),  # for annotations; dropped from JSON
            }
        )
    return out
