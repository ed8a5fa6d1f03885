"""Integrity of a trace, checked before anything is concluded from it."""

from __future__ import annotations

import re

import numpy as np

from kernelab.trace._ingest import ANNOTATION, CPU_OP, KERNEL, RUNTIME
from kernelab.trace._link import Links, member

#: Runtime calls that put work on the GPU (each should correlate with a GPU event).
_LAUNCH = re.compile(
    r"LaunchKernel|LaunchCooperativeKernel|GraphLaunch|ModuleLaunchKernel|Memcpy.*Async|"
    r"Memset.*Async|^cuLaunch|^hipLaunch|^hipExtLaunch"
)


def integrity(links: Links) -> dict:
    t = links.trace
    gpu = links.gpu
    gdur = t.dur[gpu]
    issues: dict[str, int] = {}
    issues["negative_duration"] = int((t.dur < 0).sum())
    issues["zero_duration_gpu"] = int((gdur == 0).sum())
    # The window is what the host side recorded; GPU work beyond it was cut by the profiler.
    host = np.flatnonzero((t.kind == CPU_OP) | (t.kind == RUNTIME) | (t.kind == ANNOTATION))
    if len(host) and len(gpu):
        w0 = int(t.ts[host].min())
        w1 = int((t.ts[host] + t.dur[host]).max())
        gs, ge = t.ts[gpu], t.ts[gpu] + gdur
        issues["gpu_before_window"] = int((gs < w0).sum())
        issues["gpu_after_window"] = int((ge > w1).sum())
    else:
        issues["gpu_before_window"] = issues["gpu_after_window"] = 0
    # Launch calls without a GPU event, GPU events without a launch call.
    rt = links.runtime
    is_launch = np.array([bool(_LAUNCH.search(s)) for s in t.strings], dtype=bool)
    launches = rt[is_launch[t.name[rt]]] if len(rt) and len(t.strings) else rt[:0]
    gcorr = t.corr[gpu][t.corr[gpu] >= 0]
    issues["launch_without_gpu_event"] = int((~member(t.corr[launches], gcorr)).sum())
    issues["gpu_event_without_launch"] = int((links.launch_of < 0).sum())
    # Overlapping kernels on one stream (a stream runs its work in order).
    kern = gpu[t.kind[gpu] == KERNEL]
    key = t.pid[kern] * 1_000_003 + t.tid[kern]
    o = np.lexsort((t.ts[kern], key))
    ks, s, e = key[o], t.ts[kern][o], (t.ts[kern] + t.dur[kern])[o]
    same = ks[1:] == ks[:-1]
    issues["overlapping_on_stream"] = int((same & (s[1:] < e[:-1])).sum())
    issues["malformed_events"] = t.malformed
    issues["time_out_of_range"] = t.out_of_range
    issues["outlying_timestamps"] = t.outliers["count"]
    issues["unknown_category_events"] = int(sum(t.unknown_categories.values()))
    messages = []
    text = {
        "negative_duration": "events with a negative duration",
        "zero_duration_gpu": "GPU events with zero duration",
        "gpu_before_window": "GPU events starting before the host-side window (cut at the start)",
        "gpu_after_window": "GPU events ending after the host-side window (cut at the end)",
        "launch_without_gpu_event": "launch calls without a matching GPU event",
        "gpu_event_without_launch": "GPU events without a launch call",
        "overlapping_on_stream": "kernels overlapping an earlier kernel on the same stream",
        "malformed_events": "events without a usable name, ts or dur (skipped; NaN and "
        "Infinity are not usable, nor are booleans)",
        "time_out_of_range": "events whose ts or dur overflows (beyond 4.6e15 us; skipped)",
        "outlying_timestamps": "events far outside the bulk of the timestamps (left out of "
        "every span and total)",
        "unknown_category_events": "events of unknown categories (skipped)",
    }
    for k, v in issues.items():
        if v:
            messages.append(f"{v} {text[k]}")
            if k == "outlying_timestamps":
                messages[-1] += ": " + ", ".join(
                    f"{e['name']} ({e['offset_from_bulk_us']:+.3g} us)"
                    for e in t.outliers["examples"]
                )
    return {
        "counts": issues,
        "unknown_categories": dict(t.unknown_categories),
        "outliers": list(t.outliers["examples"]),
        "messages": messages,
        "ok": not messages,
    }
