"""The evidence behind the verdicts that need more than the breakdown: one-off set-up work
(warm-up) and copies from pageable host memory.

Warm-up is work a steady-state step does not do: creating the CUDA context and streams,
``cudaMalloc`` / ``cudaFree`` by a caching allocator still growing, loading modules on the
first launch of each kernel (lazy loading makes those launch calls take milliseconds), and
cuDNN's algorithm search (``torch.backends.cudnn.benchmark``). A trace dominated by it says
nothing about the step's speed: it was recorded too early.

A copy from pageable memory (``Memcpy HtoD (Pageable -> Device)``) is staged by the driver
through a pinned bounce buffer and is synchronous with the host; from pinned memory the copy
engine reads the host buffer directly and ``non_blocking=True`` lets it overlap compute.
"""

from __future__ import annotations

import re

import numpy as np

from kernelab.trace._ingest import ANNOTATION, CPU_OP, MEMCPY, RUNTIME
from kernelab.trace._link import Links, distinct

US = 1e-3

#: Runtime/driver calls that belong to set-up, not to a steady-state step.
SETUP_CALLS = re.compile(
    r"^(cuda|hip)(Malloc|MallocHost|MallocManaged|HostAlloc|Free|FreeHost|StreamCreate|"
    r"DeviceGetStreamPriorityRange|GetDeviceProperties|SetDevice|DeviceSetLimit|"
    r"EventCreate|FuncGetAttributes|FuncSetAttribute|StreamCreateWithPriority)|"
    r"^cu(Init|DevicePrimaryCtxRetain|CtxCreate|ModuleLoad|ModuleGetFunction|LibraryLoad|"
    r"MemAlloc|MemFree)|^hipModuleLoad|^cudnnFind|^cudnnCreate|^cublasCreate"
)
#: Launch calls longer than this (ns) load a module (lazy loading) or wait on set-up: a
#: steady-state launch takes microseconds.
SLOW_LAUNCH_NS = 1_000_000
_LAUNCH_CALL = re.compile(r"LaunchKernel|LaunchCooperativeKernel|ModuleLaunchKernel")
#: CPU ops whose self time is set-up when it is long: allocations (they call cudaMalloc
#: when the caching allocator grows) and convolutions (cuDNN's algorithm search).
SETUP_OPS = ("aten::empty_strided", "aten::empty", "aten::cudnn_convolution", "aten::_to_copy")
PAGEABLE = re.compile(r"pageable", re.I)


def warmup(links: Links) -> dict:
    """Set-up time on the host (calls by name, slow launch calls) and the host window (first
    to last host event) it is a share of."""
    t = links.trace
    rt = np.flatnonzero(t.kind == RUNTIME)
    names = np.array([bool(SETUP_CALLS.search(s)) for s in t.strings], dtype=bool)
    launch = np.array([bool(_LAUNCH_CALL.search(s)) for s in t.strings], dtype=bool)
    calls: dict[str, list] = {}
    total = 0
    if len(rt) and len(t.strings):
        setup = rt[names[t.name[rt]]]
        for i in setup.tolist():
            c = calls.setdefault(t.strings[int(t.name[i])], [0, 0])
            c[0] += 1
            c[1] += int(t.dur[i])
        total = int(t.dur[setup].sum())
        lr = rt[launch[t.name[rt]]]
        slow = lr[t.dur[lr] > SLOW_LAUNCH_NS]
    else:
        slow = rt
    slow_ns = int(t.dur[slow].sum())
    host = np.flatnonzero((t.kind == RUNTIME) | (t.kind == CPU_OP) | (t.kind == ANNOTATION))
    window = int((t.ts[host] + t.dur[host]).max() - t.ts[host].min()) if len(host) else 0
    ranked = sorted(calls.items(), key=lambda kv: -kv[1][1])[:5]
    return {
        "setup_us": round((total + slow_ns) * US, 3),
        "window_us": round(window * US, 3),
        "calls": [{"name": n, "count": c, "total_us": round(d * US, 3)} for n, (c, d) in ranked],
        "slow_launches": {"count": len(slow), "total_us": round(slow_ns * US, 3)},
    }


def pageable_copies(links: Links) -> list[dict]:
    """Per device: copies from or to pageable host memory (count, time, bytes, share of the
    device's GPU busy time)."""
    t = links.trace
    gpu = links.gpu
    out = []
    pageable = np.array([bool(PAGEABLE.search(s)) for s in t.strings], dtype=bool)
    if not len(t.strings):
        return out
    for dev in distinct(t.pid[gpu]).tolist():
        rows = gpu[t.pid[gpu] == dev]
        busy = int(np.maximum(t.dur[rows], 0).sum())
        copies = rows[(t.kind[rows] == MEMCPY) & pageable[t.name[rows]]]
        if not len(copies):
            continue
        dur = int(np.maximum(t.dur[copies], 0).sum())
        nbytes = t.nbytes[copies]
        out.append(
            {
                "device": int(dev),
                "count": len(copies),
                "time_us": round(dur * US, 3),
                "bytes": int(nbytes[nbytes > 0].sum()),
                "share_of_gpu_time": round(dur / busy, 4) if busy else 0.0,
                "names": sorted({t.strings[int(i)] for i in t.name[copies]}),
            }
        )
    return out
