"""Top kernels grouped by a normalised name, the op each comes from, and theoretical
occupancy from the launch configuration the trace records."""

from __future__ import annotations

import numpy as np

from kernelab.trace._ingest import KERNEL
from kernelab.trace._link import CATEGORY_ORDER, Links, normalise

__all__ = ["device_arch", "normalise", "occupancy_table", "top_kernels"]

US = 1e-3


def top_kernels(links: Links, n: int = 15) -> list[dict]:
    """GPU event groups by total time: count, total, mean, share, category, source op."""
    t = links.trace
    ids, names = links.groups
    dur = np.maximum(t.dur[links.gpu], 0)
    total = float(dur.sum())
    if not len(ids):
        return []
    sums = np.bincount(ids, weights=dur, minlength=len(names))
    counts = np.bincount(ids, minlength=len(names))
    order = np.argsort(-sums, kind="stable")[:n]
    ops = links.gpu_op
    out = []
    for g in order:
        if counts[g] == 0:
            break
        members = np.flatnonzero(ids == g)
        op_rows = ops[members]
        linked = op_rows >= 0
        op_name = None
        if linked.any():
            op_names = t.name[op_rows[linked]]
            w = np.bincount(op_names, weights=dur[members][linked])
            op_name = t.strings[int(np.argmax(w))]
        cat = CATEGORY_ORDER[int(np.bincount(links.category[members]).argmax())]
        out.append(
            {
                "name": names[g],
                "category": cat,
                "count": int(counts[g]),
                "total_us": round(float(sums[g]) * US, 3),
                "mean_us": round(float(sums[g]) / counts[g] * US, 3),
                "share": round(float(sums[g]) / total, 4) if total else 0.0,
                "op": op_name,
                "example": t.strings[int(t.name[links.gpu[members[0]]])],
            }
        )
    return out


def device_arch(props: dict) -> str | None:
    """The hardware table's arch key for a trace's deviceProperties entry, if it has one."""
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    name = str(props.get("name", ""))
    if isinstance(major, int) and isinstance(minor, int) and "amd" not in name.lower():
        return {(8, 0): "sm_80", (9, 0): "sm_90", (10, 0): "sm_100"}.get((major, minor))
    gcn = str(props.get("gcnArchName", ""))
    if gcn.startswith("gfx942"):
        return "gfx942"
    return None


def occupancy_table(links: Links, n: int = 15) -> dict:
    """Theoretical occupancy of the kernels that record registers, shared memory and block.

    Uses :func:`kernelab.hardware.occupancy` with the real shared-memory carveouts; Kineto's
    ``est. achieved occupancy %`` is not used (it assumes a 48 KB limit).
    """
    from kernelab.hardware import LIMITS, occupancy

    t = links.trace
    props = {p.get("id", i): p for i, p in enumerate(t.device_properties())}
    gpu = links.gpu
    kern = (t.kind[gpu] == KERNEL) & (t.regs[gpu] >= 0) & (t.block[gpu] > 0)
    rows = np.flatnonzero(kern)
    if not len(rows):
        return {"kernels": [], "note": "the trace records no launch configurations"}
    ids, names = links.groups
    dur = np.maximum(t.dur[gpu], 0)
    key = np.stack(
        [
            t.pid[gpu][rows],
            ids[rows],
            t.block[gpu][rows].astype(np.int64),
            t.regs[gpu][rows].astype(np.int64),
            np.maximum(t.shmem[gpu][rows], 0),
        ],
        axis=1,
    )
    # One int64 code per configuration (np.unique over rows is slow).
    codes = np.zeros(len(rows), dtype=np.int64)
    for col in key.T:
        vals, idx = np.unique(col, return_inverse=True)
        codes = codes * len(vals) + idx.reshape(-1)
    _, first, inv = np.unique(codes, return_index=True, return_inverse=True)
    uniq = key[first]
    inv = inv.reshape(-1)
    time = np.bincount(inv, weights=dur[rows], minlength=len(uniq))
    out = []
    notes = set()
    for u in np.argsort(-time, kind="stable")[:n]:
        dev, g, block, regs, smem = (int(x) for x in uniq[u])
        arch = device_arch(props.get(dev, {}))
        entry = {
            "name": names[g],
            "device": dev,
            "block": block,
            "registers": regs,
            "shared_bytes": smem,
            "time_us": round(float(time[u]) * US, 3),
        }
        if arch is None or arch not in LIMITS:
            notes.add(f"device {dev}: architecture not in the occupancy table")
            entry["occupancy"] = None
        else:
            try:
                occ = occupancy(arch, block, regs, smem)
            except ValueError as exc:
                notes.add(str(exc))
                entry["occupancy"] = None
            else:
                entry.update(
                    arch=arch,
                    occupancy=round(occ.occupancy, 4),
                    blocks_per_sm=occ.blocks_per_sm,
                    limiter=occ.limiter,
                )
        out.append(entry)
    return {"kernels": out, "note": "; ".join(sorted(notes)) or None}
