"""Fusion candidates: runs of consecutive memory-bound kernels on one stream.

A kernel is memory-bound when the op that launched it is (by its cost model on the trace's
device), or, without shapes or device, when its op or kernel name is of an elementwise,
norm, softmax, reduction or copy family. GEMMs and attention never join a run (fusing into
their epilogues is a different change), even when a small GEMM is memory-bound.

In a run of k such kernels, fusing them into one kernel saves k - 1 launches and, where the
ops' shapes are known, the intermediates' round trips through device memory: each
intermediate output is written once and read back once.

Where a kernelab op implements the fused form, it is named; the rules below match by name in
the op registry at run time, so ops that are not registered are simply not suggested.
"""

from __future__ import annotations

import re
import sys

import numpy as np

from kernelab.trace._ingest import KERNEL
from kernelab.trace._link import Links, group_rows
from kernelab.trace.roofline import (
    ATTENTION,
    GEMM,
    PEAK_DTYPE,
    match_device,
    op_cost,
    output_bytes,
)

US = 1e-3
#: Longest run proposed as one fused kernel; longer runs are proposed as several.
MAX_RUN = 4

_MEMORY_NAME = re.compile(
    r"elementwise|vectorized|reduce|norm|softmax|copy|fill|cat|index|gather|scatter|"
    r"triton_(poi|red|per)_|add|mul|relu|gelu|silu|sigmoid|tanh|dropout|where|cast|quant",
    re.IGNORECASE,
)
_COMPUTE_NAME = re.compile(
    r"gemm|gemv|matmul|cutlass|xmma|wgmma|conv|attention|flash|fmha|mm_", re.I
)

#: (description, predicate over the run's op names, kernelab op names to look for).
FUSED_FORMS = (
    (
        "residual add + RMSNorm",
        lambda ops: _seq(ops, ("add",), ("rms_norm", "rmsnorm")),
        ("rmsnorm",),
    ),
    (
        "RMSNorm + fp8 quantisation",
        lambda ops: _seq(ops, ("rms_norm", "rmsnorm"), ("quant", "float8", "_to_copy")),
        ("rmsnorm_fp8_quant", "rmsnorm_quant", "fused_rmsnorm_quant"),
    ),
    ("SiLU and multiply", lambda ops: _seq(ops, ("silu",), ("mul",)), ("silu_and_mul",)),
    ("GELU and multiply", lambda ops: _seq(ops, ("gelu",), ("mul",)), ("gelu_and_mul",)),
)


def _seq(ops: list[str], first: tuple[str, ...], then: tuple[str, ...]) -> bool:
    low = [o.lower() for o in ops]
    for i, o in enumerate(low[:-1]):
        if any(f in o for f in first) and any(t in low[i + 1] for t in then):
            return True
    return False


#: kernelab's own ops among the fused forms' candidates (a test holds this equal to the
#: registry): naming them must not load torch and every op (seconds) in a trace command.
BUILTIN_FUSED_OPS = frozenset({"rmsnorm", "rmsnorm_fp8_quant", "silu_and_mul", "gelu_and_mul"})


def _registered() -> set[str] | None:
    """The registered op names: the live registry where the ops are loaded already (it also
    holds ops registered by the user), else kernelab's own."""
    ops = sys.modules.get("kernelab.ops")
    if ops is None:
        return set(BUILTIN_FUSED_OPS)
    return {o.name for o in ops.all_ops()}


def fused_op_for(op_names: list[str], registered: set[str] | None = None) -> tuple[str, str]:
    """(description, kernelab op or '') for a run of op names, ('', '') if no rule applies.

    The registry is read only when a rule applies and ``registered`` is not given.
    """
    for desc, pred, candidates in FUSED_FORMS:
        if pred(op_names):
            names = _registered() if registered is None else registered
            hit = next((c for c in candidates if names and c in names), "")
            return desc, hit
    return "", ""


def fusion_candidates(links: Links, n: int = 10, registered: set[str] | None = None) -> dict:
    t = links.trace
    gpu = links.gpu
    kern = np.flatnonzero(t.kind[gpu] == KERNEL)
    if len(kern) < 2:
        return {"candidates": [], "runs": 0}
    op_rows = links.gpu_op[kern]
    names = t.name[gpu[kern]]
    ids, group_names = links.groups
    props = {p.get("id", i): p for i, p in enumerate(t.device_properties())}
    specs: dict[int, object] = {}
    strings = t.strings
    name_mem = np.array([_name_memory(x) for x in strings], dtype=bool)
    heavy_op = np.array([_heavy(x) for x in strings], dtype=bool)
    linked = op_rows >= 0
    op_name = np.where(linked, t.name[np.maximum(op_rows, 0)], -1)
    # Without shapes: by the kernel's name, unless the op is a GEMM, convolution or attention;
    # communication kernels never join.
    mem = name_mem[names] & ~(linked & heavy_op[np.maximum(op_name, 0)])
    mem &= links.category[kern] != 2
    out_bytes = np.full(len(kern), np.nan)
    # Labels: the op's name where linked, else the kernel group's name.
    label_ids = np.where(linked, op_name, len(strings) + ids[kern])
    label_text = strings + group_names
    # Ops with shapes: bound from the cost model on the trace's device.
    lk = np.flatnonzero(linked)
    shape = t.shape[op_rows[lk]]
    shaped = lk[shape >= 0]
    if len(shaped):
        shape = shape[shape >= 0].astype(np.int64)
        devs = t.pid[gpu[kern[shaped]]]
        # One cost per (op, shapes, device).
        group, firsts = group_rows(op_name[shaped].astype(np.int64), shape, devs)
        bound_g = np.zeros(len(firsts), dtype=np.int8)  # -1 unknown, 0 compute, 1 memory
        bytes_g = np.full(len(firsts), np.nan)
        for g, f in enumerate(firsts.tolist()):
            oname = strings[int(op_name[shaped[f]])]
            dims, types = t.shape_table[shape[f]]
            dev = int(devs[f])
            if dev not in specs:
                specs[dev] = match_device(props.get(dev, {}))
            spec = specs[dev]
            cost = op_cost(oname, dims, types)
            bound = -1
            if cost is not None and spec is not None:
                peak = spec.peak_for(PEAK_DTYPE.get(cost[2], "fp32"))
                bound = int(cost[1] / spec.hbm_bytes_per_s >= (cost[0] / peak if peak else 0.0))
            b = output_bytes(oname, dims, types)
            bound_g[g] = bound
            if b is not None:
                bytes_g[g] = b
        bound_r = bound_g[group]
        take = (bound_r >= 0) & ~heavy_op[op_name[shaped]]
        mem[shaped[take]] = bound_r[take] == 1
        out_bytes[shaped] = bytes_g[group]
    stream = t.pid[gpu[kern]] * 1_000_003 + t.tid[gpu[kern]]
    order = np.lexsort((t.ts[gpu[kern]], stream))
    m = mem[order]
    st = stream[order]
    # Runs: maximal stretches of memory-bound kernels, consecutive on one stream.
    # A run also breaks where both neighbours' output sizes are known and differ (the later
    # kernel does not consume the earlier one's output element for element).
    ob = out_bytes[order]
    size_change = ~np.isnan(ob[1:]) & ~np.isnan(ob[:-1]) & (ob[1:] != ob[:-1])
    brk = np.r_[True, (st[1:] != st[:-1]) | ~m[1:] | ~m[:-1] | size_change]
    run_id = np.cumsum(brk)
    # Long runs are cut into pieces of at most MAX_RUN kernels (one fused kernel each).
    pos_in_run = np.arange(len(run_id)) - np.flatnonzero(brk)[run_id - 1]
    run_id = run_id * (len(run_id) // MAX_RUN + 2) + pos_in_run // MAX_RUN
    run_id[~m] = 0
    patterns: dict[tuple, dict] = {}
    durs = np.maximum(t.dur[gpu[kern]], 0)
    # Runs are contiguous in ``order``: cut it where the run id changes.
    starts = np.flatnonzero(np.r_[True, run_id[1:] != run_id[:-1]])
    ends = np.r_[starts[1:], len(run_id)]
    real = (run_id[starts] > 0) & (ends - starts >= 2)
    runs = int(real.sum())
    if runs:
        # Sums over every segment (reduceat runs to the next start), then the real runs.
        run_time = np.add.reduceat(durs[order].astype(np.float64), starts)[real]
        # Intermediates: every member's output but the last one's (NaN where unknown).
        ob_sorted = out_bytes[order].copy()
        ob_sorted[ends - 1] = 0.0
        inter = np.add.reduceat(ob_sorted, starts)[real]
        lab_sorted = label_ids[order].tolist()
    starts, ends = starts[real], ends[real]
    for r, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        pat = tuple(lab_sorted[a:b])
        p = patterns.get(pat)
        if p is None:
            p = patterns[pat] = {"count": 0, "time": 0.0, "bytes": 0.0, "known": True, "rows": []}
        p["count"] += 1
        p["time"] += float(run_time[r])
        saved = float(inter[r])
        if saved != saved:
            p["known"] = False
        else:
            p["bytes"] += 2 * saved
        if len(p["rows"]) < 50:
            p["rows"].append(gpu[kern[order[a:b]]])
    spec_bw = next((s.hbm_bytes_per_s for s in specs.values() if s is not None), None)
    out = []
    for ids_, p in sorted(patterns.items(), key=lambda kv: -kv[1]["time"])[:n]:
        pat = [label_text[j] for j in ids_]
        desc, op = fused_op_for(pat, registered)
        if desc and registered is None:
            registered = _registered() or set()
        saved_bytes = p["bytes"] if p["known"] else None
        out.append(
            {
                "ops": list(pat),
                "occurrences": p["count"],
                "kernel_time_us": round(p["time"] * US, 3),
                "launches_saved": (len(pat) - 1) * p["count"],
                "bytes_saved": saved_bytes,
                "est_saving_us": round(saved_bytes / spec_bw * 1e6, 3)
                if saved_bytes and spec_bw
                else None,
                "fused_form": desc or None,
                "kernelab_op": op or None,
                "_rows": p["rows"],
            }
        )
    return {"candidates": out, "runs": runs}


def _heavy(op_name: str) -> bool:
    """GEMM, convolution, attention and collective ops: not part of an elementwise fusion."""
    return (
        op_name in GEMM
        or op_name in ATTENTION
        or "conv" in op_name
        or op_name.startswith(("c10d::", "nccl:"))
        or op_name == "record_param_comms"
    )


def _name_memory(kernel_name: str) -> bool:
    return bool(_MEMORY_NAME.search(kernel_name)) and not _COMPUTE_NAME.search(kernel_name)
