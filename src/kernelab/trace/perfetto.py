"""A Perfetto-compatible copy of a trace with kernelab's findings added as tracks: idle gaps
with their cause, graph replays, fusion candidates, and the verdicts."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import orjson

from kernelab.trace._ingest import TraceError, _read_bytes
from kernelab.trace._scan import lenient_loads

PID = "kernelab findings"
MAX_GAPS = 20000


def _ev(name, ts_ns, dur_ns, tid, base_us, args=None) -> dict:
    ev = {
        "ph": "X",
        "cat": "kernelab",
        "name": name,
        "pid": PID,
        "tid": tid,
        "ts": base_us + ts_ns / 1000,
        "dur": dur_ns / 1000,
    }
    if args:
        ev["args"] = args
    return ev


def annotations(summary: dict) -> list[dict]:
    links = summary["_links"]
    t = links.trace
    base = t.meta.get("base_us", 0)
    out = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": PID}}]
    gpu = summary.get("gpu") or {}
    for idle in gpu.get("idle", []):
        a, b, kind = idle["_gaps"]
        for i in range(min(len(a), MAX_GAPS)):
            cause = ("sync", "host", "other")[int(kind[i])]
            out.append(
                _ev(
                    f"idle: {cause}",
                    int(a[i]),
                    int(b[i] - a[i]),
                    f"device {idle['device']} idle",
                    base,
                    {"cause": cause},
                )
            )
    if "launch" in gpu:
        rows_by_replay, bounds = gpu["launch"]["_replays"]
        for a, b in itertools.pairwise(bounds.tolist()):
            rows = links.gpu[rows_by_replay[a:b]]
            s, e = int(t.ts[rows].min()), int((t.ts[rows] + t.dur[rows]).max())
            out.append(_ev("graph replay", s, e - s, "graph replays", base, {"kernels": b - a}))
    for c in gpu.get("fusion", {}).get("candidates", []):
        label = " -> ".join(c["ops"])
        for rows in c["_rows"]:
            s, e = int(t.ts[rows].min()), int((t.ts[rows] + t.dur[rows]).max())
            out.append(
                _ev(
                    f"fusion candidate: {label}",
                    s,
                    e - s,
                    "fusion candidates",
                    base,
                    {"kernelab_op": c["kernelab_op"], "launches_saved": len(rows) - 1},
                )
            )
    start = min((int(t.ts[links.gpu].min()),), default=0) if len(links.gpu) else 0
    for v in summary.get("verdicts", []):
        out.append(
            {
                "ph": "i",
                "s": "g",
                "cat": "kernelab",
                "name": v["finding"],
                "pid": PID,
                "tid": "verdicts",
                "ts": base + start / 1000,
                "args": {"fix": v.get("fix")},
            }
        )
    return out


def check_output(out_path) -> Path:
    """The annotated trace is Chrome-trace JSON: its name must say so (.json or .json.gz)."""
    out = Path(out_path)
    if not out.name.endswith((".json", ".json.gz")) or out.name in (".json", ".json.gz"):
        raise ValueError(
            f"perfetto: expected a .json or .json.gz file name (the annotated trace is "
            f"Chrome-trace JSON, which ui.perfetto.dev opens), got {str(out_path)!r}"
        )
    return out


def write_annotated(summary: dict, out_path) -> Path:
    """Write the original trace plus the findings to ``out_path`` (.json or .json.gz)."""
    out = check_output(out_path)
    src = Path(summary["trace"])
    try:
        doc = lenient_loads(_read_bytes(src))
    except ValueError as exc:
        raise TraceError(f"trace: {str(src)!r} is not valid JSON ({exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    doc["traceEvents"].extend(annotations(summary))
    data = orjson.dumps(doc)  # NaN or Infinity read from the source are written as null
    out.write_bytes(gzip.compress(data) if out.name.endswith(".gz") else data)
    return out
