"""CPU side: op time by name (total and self) and framework overhead.

Self time of an op is its duration minus the durations of the ops directly inside it on the
same thread. Framework overhead is the share of the profiled steps (``ProfilerStep#N``
annotations, or the whole host window without them) that no cpu op covers: Python, the
profiler itself, and everything between ops.
"""

from __future__ import annotations

import numpy as np

from kernelab.trace._ingest import ANNOTATION, CPU_OP, RUNTIME
from kernelab.trace._link import Links, merge

US = 1e-3


def cpu_breakdown(links: Links, n: int = 15) -> dict:
    t = links.trace
    ops, parent = links.op_parent
    if not len(ops):
        return {"ops": [], "overhead_share": None, "steps": 0}
    dur = np.maximum(t.dur[ops], 0)
    child = np.zeros(len(ops), dtype=np.int64)
    has = parent >= 0
    np.add.at(child, parent[has], dur[has])
    self_time = np.maximum(dur - child, 0)
    names = t.name[ops]
    top_level = ~has
    total = np.bincount(names, weights=dur * top_level, minlength=len(t.strings))
    incl = np.bincount(names, weights=dur, minlength=len(t.strings))
    selfs = np.bincount(names, weights=self_time, minlength=len(t.strings))
    counts = np.bincount(names, minlength=len(t.strings))
    all_self = float(self_time.sum())
    order = np.argsort(-selfs, kind="stable")[:n]
    rows = [
        {
            "name": t.strings[i],
            "count": int(counts[i]),
            "total_us": round(float(incl[i]) * US, 3),
            "self_us": round(float(selfs[i]) * US, 3),
            "self_share": round(float(selfs[i]) / all_self, 4) if all_self else 0.0,
        }
        for i in order
        if counts[i]
    ]
    # Profiled steps: ProfilerStep#N annotations if present, else the host window.
    ann = np.flatnonzero(t.kind == ANNOTATION)
    steps = [r for r in ann if t.strings[int(t.name[r])].startswith("ProfilerStep#")]
    if steps:
        st = np.array(steps)
        win_s, win_e = t.ts[st], t.ts[st] + t.dur[st]
    else:
        host = np.flatnonzero((t.kind == CPU_OP) | (t.kind == RUNTIME))
        win_s = np.array([t.ts[host].min()])
        win_e = np.array([(t.ts[host] + t.dur[host]).max()])
    window = float((win_e - win_s).sum())
    ms, me = merge(t.ts[ops][top_level], (t.ts[ops] + dur)[top_level])
    # Op time inside the windows (ops on any thread; overlapping threads count once).
    inside = 0.0
    for a, b in zip(win_s.tolist(), win_e.tolist(), strict=False):
        lo = np.clip(ms, a, b)
        hi = np.clip(me, a, b)
        inside += float((hi - lo).sum())
    return {
        "ops": rows,
        "top_level_us": {t.strings[i]: round(float(total[i]) * US, 3) for i in order if total[i]},
        "steps": len(steps),
        "window_us": round(window * US, 3),
        "overhead_share": round(1 - inside / window, 4) if window else None,
    }
