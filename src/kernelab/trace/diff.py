"""``diff(a, b)``: kernel time and count deltas between two traces, per kernel group
(normalised name) and per category, ranked by the size of the time change."""

from __future__ import annotations

import numpy as np

from kernelab.trace._ingest import Trace, load
from kernelab.trace._link import CATEGORY_ORDER, Links

US = 1e-3
SCHEMA = "kernelab.trace.diff/1"


def kernel_groups(links: Links) -> dict[str, tuple[int, float, str]]:
    """Group name -> (count, total us, category) over all GPU events of a trace."""
    ids, names = links.groups
    if not len(ids):
        return {}
    dur = np.maximum(links.trace.dur[links.gpu], 0)
    sums = np.bincount(ids, weights=dur, minlength=len(names))
    counts = np.bincount(ids, minlength=len(names))
    cat = np.zeros(len(names), dtype=np.int64)
    cat[ids] = links.category
    return {
        names[g]: (int(counts[g]), float(sums[g]) * US, CATEGORY_ORDER[int(cat[g])])
        for g in np.flatnonzero(counts)
    }


def _devices(t: Trace) -> list[str]:
    """``'8 × Tesla V100-SXM2-32GB'``-style counts of the devices a trace describes."""
    counts: dict[str, int] = {}
    for p in t.device_properties():
        name = str(p.get("name"))
        counts[name] = counts.get(name, 0) + 1
    return [f"{n} × {name}" for name, n in sorted(counts.items())]


def diff(
    a: str | Trace, b: str | Trace, top: int = 20, workers: int | None = 1, limits=None
) -> dict:
    """Kernel-group and category deltas from ``a`` to ``b`` (``workers`` and ``limits`` as
    in ``load``)."""
    ta = a if isinstance(a, Trace) else load(a, workers=workers, limits=limits)
    tb = b if isinstance(b, Trace) else load(b, workers=workers, limits=limits)
    ga, gb = kernel_groups(Links(ta)), kernel_groups(Links(tb))
    rows = []
    for name in set(ga) | set(gb):
        ca, sa, cat_a = ga.get(name, (0, 0.0, None))
        cb, sb, cat_b = gb.get(name, (0, 0.0, None))
        rows.append(
            {
                "name": name,
                "category": cat_a or cat_b,
                "a_count": ca,
                "b_count": cb,
                "a_us": round(sa, 3),
                "b_us": round(sb, 3),
                "delta_us": round(sb - sa, 3),
                "delta_count": cb - ca,
                "status": "added" if not ca else "removed" if not cb else "changed",
            }
        )
    rows.sort(key=lambda r: (-abs(r["delta_us"]), r["name"]))
    cats = []
    for c in CATEGORY_ORDER:
        sa = sum(v[1] for v in ga.values() if v[2] == c)
        sb = sum(v[1] for v in gb.values() if v[2] == c)
        na = sum(v[0] for v in ga.values() if v[2] == c)
        nb = sum(v[0] for v in gb.values() if v[2] == c)
        cats.append(
            {
                "category": c,
                "a_us": round(sa, 3),
                "b_us": round(sb, 3),
                "delta_us": round(sb - sa, 3),
                "a_count": na,
                "b_count": nb,
                "delta_count": nb - na,
            }
        )
    cats.sort(key=lambda r: -abs(r["delta_us"]))
    da, db = _devices(ta), _devices(tb)
    warnings = []
    if da != db:
        warnings.append(
            f"the traces come from different devices (A: {', '.join(da) or 'none recorded'}; "
            f"B: {', '.join(db) or 'none recorded'}): kernel times differ by hardware too"
        )
    return {
        "schema": SCHEMA,
        "a": ta.path,
        "b": tb.path,
        "devices": {"a": da, "b": db},
        "warnings": warnings,
        "categories": cats,
        "kernels": rows[:top],
        "groups": {
            "a": len(ga),
            "b": len(gb),
            "added": sum(r["status"] == "added" for r in rows),
            "removed": sum(r["status"] == "removed" for r in rows),
        },
    }
