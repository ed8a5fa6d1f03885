"""Communication / computation overlap, as Holistic Trace Analysis defines it
(``get_comm_comp_overlap``): the communication kernels' time (their intervals merged)
during which a computation kernel also runs (merged likewise), as a share of the
communication time. Memory copies and sets count as neither. The rest of the communication
time is **exposed**: the GPU does nothing but communicate, and the step waits for it.

Over the whole trace (one rank: all its devices together, as HTA computes it), and per
device.
"""

from __future__ import annotations

import numpy as np

from kernelab.trace._link import Links, covered, distinct

US = 1e-3


def _overlap(t, comm: np.ndarray, comp: np.ndarray) -> dict:
    cs, ce = t.ts[comm], t.ts[comm] + np.maximum(t.dur[comm], 0)
    ps, pe = t.ts[comp], t.ts[comp] + np.maximum(t.dur[comp], 0)
    comm_t, comp_t = covered(cs, ce), covered(ps, pe)
    union = covered(np.r_[cs, ps], np.r_[ce, pe])
    both = comm_t + comp_t - union  # |A ∩ B| = |A| + |B| - |A ∪ B|
    return {
        "communication_us": round(comm_t * US, 3),
        "overlapped_us": round(both * US, 3),
        "exposed_us": round((comm_t - both) * US, 3),
        "overlap_share": round(both / comm_t, 4) if comm_t else None,
    }


def comm_overlap(links: Links) -> dict:
    """``{"trace": {...}, "devices": [{"device": d, ...}]}``: communication time, the part
    overlapped by computation, the exposed part, and the overlapped share."""
    t = links.trace
    gpu = links.gpu
    cat = links.category
    comm, comp = gpu[cat == 2], gpu[cat == 0]  # Links.category: 0 compute, 2 communication
    devices = []
    for dev in distinct(t.pid[gpu]).tolist():
        devices.append(
            {"device": int(dev), **_overlap(t, comm[t.pid[comm] == dev], comp[t.pid[comp] == dev])}
        )
    return {"trace": _overlap(t, comm, comp), "devices": devices}
