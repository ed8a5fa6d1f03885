"""A folder of per-rank traces: each rank summarised, then compared across ranks.

A straggler is a rank whose GPU compute time exceeds the median across ranks by more than
``STRAGGLER``; in collective communication the others wait for it, so its own communication
(waiting) time is usually the lowest.
"""

from __future__ import annotations

from pathlib import Path

from kernelab.trace._ingest import TraceError
from kernelab.trace.summary import NothingToAnalyse, public, summarize

SCHEMA = "kernelab.trace.ranks/1"
STRAGGLER = 0.05


def trace_files(folder: Path) -> list[Path]:
    files = sorted(
        p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))
    )
    if not files:
        raise TraceError(f"trace: folder {str(folder)!r} holds no .json or .json.gz traces")
    return files


def summarize_ranks(folder, top: int = 10, progress=None, limits=None) -> dict:
    """Each rank's trace summarised (``limits`` as in ``load``: a trace over one is skipped
    with the reason), then compared."""
    folder = Path(folder)
    rows, summaries, skipped = [], [], []
    files = trace_files(folder)
    for i, path in enumerate(files):
        if progress is not None:
            progress(i, len(files), path.name)
        try:
            s = public(summarize(path, top=top, limits=limits))
        except (TraceError, NothingToAnalyse) as exc:
            skipped.append({"file": path.name, "reason": str(exc)})
            continue
        summaries.append(s)
        if not s.get("gpu"):
            skipped.append({"file": path.name, "reason": "no GPU activity"})
            continue
        b = s["gpu"]["breakdown"]
        span = max(d["span_us"] for d in b)
        comp = sum(d["categories"]["compute"]["busy_us"] for d in b)
        comm = sum(d["categories"]["communication"]["busy_us"] for d in b)
        rows.append(
            {
                "rank": s["rank"] if s["rank"] is not None else i,
                "file": path.name,
                "span_us": span,
                "compute_us": round(comp, 3),
                "communication_us": round(comm, 3),
                "idle_us": round(sum(d["idle_us"] for d in b), 3),
                "communication_share": round(comm / span, 4) if span else 0.0,
                "comm_overlap_share": s["gpu"]["communication"]["trace"]["overlap_share"],
                "exposed_communication_us": s["gpu"]["communication"]["trace"]["exposed_us"],
            }
        )
    rows.sort(key=lambda r: r["rank"])
    stragglers = []
    if len(rows) >= 2:
        comp = sorted(r["compute_us"] for r in rows)
        median = (
            comp[len(comp) // 2]
            if len(comp) % 2
            else (comp[len(comp) // 2 - 1] + comp[len(comp) // 2]) / 2
        )
        for r in rows:
            if median and r["compute_us"] > median * (1 + STRAGGLER):
                stragglers.append(
                    {
                        "rank": r["rank"],
                        "compute_over_median": round(r["compute_us"] / median - 1, 4),
                        "reason": f"rank {r['rank']} computes {r['compute_us'] / median - 1:.0%} "
                        f"longer than the median rank; the others wait for it in collectives",
                    }
                )
    verdicts = []
    if rows:
        share = max(r["communication_share"] for r in rows)
        if share >= 0.3:
            verdicts.append(
                f"communication takes up to {share:.0%} of a rank's span: overlap it with "
                "compute or reduce what is communicated"
            )
    return {
        "schema": SCHEMA,
        "folder": str(folder),
        "ranks": rows,
        "stragglers": stragglers,
        "verdicts": verdicts,
        "skipped": skipped,
        "per_rank": summaries,
    }
