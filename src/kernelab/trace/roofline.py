"""Roofline placement of the ops whose input shapes the trace records (``record_shapes``).

Each op's FLOPs and minimum bytes (each input read once, each output written once) come from
the formulas below, or from the kernelab op's own cost model when a registered op implements
the aten op (``aten::rms_norm`` -> ``rmsnorm``). The op's GPU time is the summed duration of
the kernels it launched. The device is the trace's ``deviceProperties`` entry (name, SM count,
memory) matched against :mod:`kernelab.hardware`; an unmatched device gets no placement rather
than a wrong peak.
"""

from __future__ import annotations

import math

import numpy as np

from kernelab.trace._link import Links, group_rows

US = 1e-3

ELEMENT_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
}
#: Trace dtype -> the hardware table's compute dtype for peak FLOP/s.
PEAK_DTYPE = {
    "float": "fp32",
    "double": "fp64",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
}

GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul"}
NORMS = {
    "aten::layer_norm",
    "aten::native_layer_norm",
    "aten::rms_norm",
    "aten::_fused_rms_norm",
    "aten::batch_norm",
    "aten::native_batch_norm",
    "aten::cudnn_batch_norm",
    "aten::group_norm",
    "aten::native_group_norm",
}
SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax"}
ATTENTION = {
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
}
#: FLOPs per output element of elementwise ops (a rough count; they are memory-bound).
ELEMENTWISE_FLOPS = {"aten::gelu": 8, "aten::gelu_": 8, "aten::silu": 4, "aten::silu_": 4}
#: RMSNorm as kernelab's rmsnorm op models it (its cost model; a test holds the two equal):
#: reading torch and the ops here would cost seconds per trace.
RMS_NORM = {"aten::rms_norm", "aten::_fused_rms_norm"}


def _numel(dims) -> int:
    return math.prod(dims) if dims else 1


def _tensors(dims: list, types: list) -> list[tuple[list, int]]:
    """(shape, element bytes) of each tensor argument."""
    out = []
    for d, ty in zip(dims, types, strict=False):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d) and ty in ELEMENT_BYTES:
            out.append((d, ELEMENT_BYTES[ty]))
    return out


def op_cost(name: str, dims: list, types: list) -> tuple[float, float, str] | None:
    """(FLOPs, minimum bytes, compute dtype) of one aten op call, or None if not modelled."""
    ts = _tensors(dims, types)
    if not ts:
        return None
    dtype = next((ty for ty in types if ty in PEAK_DTYPE), "float")
    es = ts[0][1]
    if name in RMS_NORM:
        n = _numel(ts[0][0])
        weight = sum(_numel(d) * b for d, b in ts[1:] if len(d) == 1)
        # square, accumulate, scale by rstd, scale by weight; read x and weight, write out
        return 4.0 * n, float(2 * n * es + weight), dtype
    if name in GEMM:
        mats = [(d, b) for d, b in ts if len(d) >= 2]
        if name == "aten::linear" and len(mats) >= 1 and len(ts) >= 2:
            x, w = ts[0][0], ts[1][0]
            if len(w) != 2 or x[-1] != w[1]:
                return None
            m, k, n = _numel(x[:-1]), x[-1], w[0]
            batch = 1
        else:
            if name in ("aten::addmm", "aten::baddbmm"):
                mats = mats[-2:] if len(mats) >= 2 else mats
            if len(mats) < 2:
                return None
            (a, _), (b, _) = mats[0], mats[1]
            if a[-1] != b[-2]:
                return None
            m, k, n = a[-2], a[-1], b[-1]
            batch = _numel(a[:-2]) if len(a) > 2 else 1
        flops = 2.0 * batch * m * n * k
        nbytes = sum(_numel(d) * b for d, b in ts) + batch * m * n * es
        return flops, float(nbytes), dtype
    if name in ATTENTION:
        if len(ts) < 3 or len(ts[0][0]) != 4:
            return None
        q, k_, v = ts[0][0], ts[1][0], ts[2][0]
        b, h, lq, d = q
        lk = k_[2]
        flops = 4.0 * b * h * lq * lk * d  # QK^T and PV; non-causal (masking unknown)
        nbytes = (_numel(q) + _numel(k_) + _numel(v) + b * h * lq * v[3]) * es
        return flops, float(nbytes), dtype
    x = ts[0][0]
    n = _numel(x)
    if name in NORMS or name in SOFTMAX:
        params = sum(_numel(d) * bb for d, bb in ts[1:] if len(d) <= 1)
        return 5.0 * n, float(2 * n * es + params), dtype
    # Elementwise (and copies): the output has the broadcast shape of the tensor inputs.
    out_numel = max(_numel(d) for d, _ in ts)
    inplace = name.endswith("_")
    nbytes = sum(_numel(d) * bb for d, bb in ts) + (0 if inplace else out_numel * es)
    return float(ELEMENTWISE_FLOPS.get(name, 1) * out_numel), float(nbytes), dtype


def output_bytes(name: str, dims: list, types: list) -> float | None:
    """Bytes of an op's (main) output, for fusion estimates; None when not known."""
    ts = _tensors(dims, types)
    if not ts:
        return None
    if name in GEMM or name in ATTENTION:
        return None
    return float(max(_numel(d) for d, _ in ts) * ts[0][1])


def match_device(props: dict):
    """The hardware table's entry for one deviceProperties dict, or None."""
    from kernelab.hardware import lookup

    name = props.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    sms = props.get("numSms") if isinstance(props.get("numSms"), int) else None
    mem = props.get("totalGlobalMem")
    mem_gb = mem / 1e9 if isinstance(mem, (int, float)) and mem > 0 else None
    return lookup(name, sms, mem_gb)


def roofline(links: Links, n: int = 15) -> dict:
    """Ops with shapes and GPU time, grouped by (op, shapes, dtypes), placed on the roofline."""
    t = links.trace
    if not (t.shape >= 0).any():
        return {"ops": [], "note": "the trace has no recorded shapes (record_shapes=False)"}
    props = {p.get("id", i): p for i, p in enumerate(t.device_properties())}
    op_rows = links.gpu_op
    linked = np.flatnonzero(op_rows >= 0)
    if not len(linked):
        return {"ops": [], "note": "no GPU kernels are linked to cpu ops"}
    dur = np.maximum(t.dur[links.gpu[linked]], 0)
    dev = t.pid[links.gpu[linked]]
    ops_ = op_rows[linked]
    uniq, inv = np.unique(ops_, return_inverse=True)
    gpu_time = np.bincount(inv, weights=dur, minlength=len(uniq))
    op_dev = np.zeros(len(uniq), dtype=np.int64)
    op_dev[inv] = dev
    groups: dict[tuple, dict] = {}
    sel = np.flatnonzero(t.shape[uniq] >= 0)
    if len(sel):
        rows = uniq[sel]
        shape = t.shape[rows].astype(np.int64)
        names = t.name[rows].astype(np.int64)
        # One cost and text per (op, shapes, device).
        group, firsts = group_rows(names, shape, op_dev[sel])
        time_g = np.bincount(group, weights=gpu_time[sel], minlength=len(firsts))
        calls_g = np.bincount(group, minlength=len(firsts))
        for g, f in enumerate(firsts.tolist()):
            name = t.strings[int(names[f])]
            dims, types = t.shape_table[shape[f]]
            cost = op_cost(name, dims, types)
            if cost is None:
                continue
            key = (name, str(dims), str(types), int(op_dev[sel[f]]))
            entry = groups.setdefault(
                key, {"flops": cost[0], "bytes": cost[1], "dtype": cost[2], "time": 0.0, "calls": 0}
            )
            entry["time"] += float(time_g[g])
            entry["calls"] += int(calls_g[g])
    devices = {d: match_device(props.get(d, {})) for d in {k[3] for k in groups}}
    out = []
    unmatched = set()
    for (name, dims, types, d), g in sorted(groups.items(), key=lambda kv: -kv[1]["time"]):
        if g["time"] <= 0:
            continue
        secs = g["time"] * 1e-9 / g["calls"]
        entry = {
            "op": name,
            "input_dims": dims,
            "input_types": types,
            "device": d,
            "calls": g["calls"],
            "gpu_time_us": round(g["time"] * US, 3),
            "flops": g["flops"],
            "bytes": g["bytes"],
            "intensity": round(g["flops"] / g["bytes"], 3) if g["bytes"] else None,
            "achieved_tflops": round(g["flops"] / secs / 1e12, 4),
            "achieved_gbps": round(g["bytes"] / secs / 1e9, 3),
        }
        spec = devices.get(d)
        if spec is None:
            unmatched.add(d)
        else:
            peak = spec.peak_for(PEAK_DTYPE.get(g["dtype"], "fp32"))
            bw = spec.hbm_bytes_per_s
            t_mem = g["bytes"] / bw
            t_flop = g["flops"] / peak if peak else 0.0
            entry.update(
                device_name=spec.name,
                bound="compute" if t_flop > t_mem else "memory",
                roofline_share=round(max(t_mem, t_flop) / secs, 4),
            )
        out.append(entry)
    note = None
    if unmatched:
        names = ", ".join(f"{d}: {props.get(d, {}).get('name', '?')}" for d in sorted(unmatched))
        note = f"devices not in the hardware table (no peaks, no placement): {names}"
    return {"ops": out[:n], "modelled_ops": len(out), "note": note}
