"""``summarize(path)``: every analysis of one trace as one JSON-ready dict, with verdicts.

The schema is documented in docs/trace.md (``schema: "kernelab.trace.summary/1"``). Keys
starting with ``_`` hold arrays for annotations and are removed by :func:`public`.
"""

from __future__ import annotations

from kernelab.trace._ingest import KIND_NAMES, Trace, TraceError, load
from kernelab.trace._limits import Limits
from kernelab.trace._link import Links
from kernelab.trace.advice import SETUP_OPS, pageable_copies, warmup
from kernelab.trace.breakdown import breakdown, idle_gaps
from kernelab.trace.cpu import cpu_breakdown
from kernelab.trace.fusion import fusion_candidates
from kernelab.trace.integrity import integrity
from kernelab.trace.kernels import occupancy_table, top_kernels
from kernelab.trace.launch import launch_analysis
from kernelab.trace.memory import memory_analysis
from kernelab.trace.overlap import comm_overlap
from kernelab.trace.roofline import match_device, roofline

SCHEMA = "kernelab.trace.summary/1"

#: Thresholds behind the verdicts (shares of a device's span).
HOST_BOUND_SHARE = 0.2  # idle waiting on the host (any gap length): a host stall
LAUNCH_IDLE_SHARE = 0.1  # idle in short host gaps (launch overhead)
SYNC_SHARE = 0.05  # idle after host synchronisations
SHORT_SHARE = 0.5  # kernels shorter than the short threshold
#: Set-up (context, allocator growth, module loading, algorithm search) as a share of the
#: host window: the trace shows warm-up, not the step.
SETUP_SHARE = 0.2
#: Pageable copies as a share of a device's GPU time.
PAGEABLE_SHARE = 0.1


class NothingToAnalyse(ValueError):
    """The trace is readable but holds nothing this analysis can use."""


def summarize(
    source: str | Trace,
    *,
    top: int = 15,
    short_us: float = 5.0,
    registered: set[str] | None = None,
    workers: int | None = 1,
    limits: Limits | None = None,
) -> dict:
    """Analyse one trace (a path or a loaded :class:`Trace`; ``workers`` and ``limits`` as
    in :func:`~kernelab.trace.load`)."""
    trace = source if isinstance(source, Trace) else load(source, workers=workers, limits=limits)
    if len(trace) == 0:
        raise NothingToAnalyse(
            f"nothing to analyse: {trace.path!r} holds no complete events of known categories"
        )
    links = Links(trace)
    out: dict = {
        "schema": SCHEMA,
        "trace": trace.path,
        "rank": trace.rank(),
        "events": {KIND_NAMES[k]: int((trace.kind == k).sum()) for k in range(len(KIND_NAMES))},
        "ingest": dict(trace.ingest),
        "devices": _devices(trace),
        "integrity": integrity(links),
        "cpu": cpu_breakdown(links, top),
        "memory": memory_analysis(links),
    }
    if len(links.gpu) == 0:
        out["gpu"] = None
        out["verdicts"] = [
            {
                "finding": "the trace has no GPU activity; only the CPU side is summarised",
                "fix": None,
            }
        ]
        return out
    out["gpu"] = {
        "breakdown": breakdown(links),
        "idle": idle_gaps(links),
        "launch": launch_analysis(links, short_us),
        "top_kernels": top_kernels(links, top),
        "roofline": roofline(links, top),
        "fusion": fusion_candidates(links, 10, registered),
        "occupancy": occupancy_table(links, top),
        "communication": comm_overlap(links),
        "warmup": warmup(links),
        "pageable_copies": pageable_copies(links),
    }
    out["verdicts"] = verdicts(out)
    out["_links"] = links
    return out


def _devices(trace: Trace) -> list[dict]:
    out = []
    for i, p in enumerate(trace.device_properties()):
        spec = match_device(p)
        out.append(
            {
                "id": p.get("id", i),
                "name": p.get("name"),
                "sms": p.get("numSms"),
                "memory_bytes": p.get("totalGlobalMem"),
                "compute_capability": f"{p.get('computeMajor')}.{p.get('computeMinor')}"
                if "computeMajor" in p
                else None,
                "hardware_table": spec.name if spec else None,
            }
        )
    return out


def _warmup_verdict(summary: dict) -> dict | None:
    w = summary["gpu"]["warmup"]
    window = w["window_us"]
    if not window or w["setup_us"] < SETUP_SHARE * window:
        return None
    parts = [f"{c['name']} {_time(c['total_us'])}" for c in w["calls"][:3]]
    if w["slow_launches"]["count"]:
        sl = w["slow_launches"]
        parts.append(f"{sl['count']} launch calls over 1 ms: {_time(sl['total_us'])}")
    ops = [o for o in summary["cpu"]["ops"] if o["name"] in SETUP_OPS and o["self_us"] > 0]
    within = ", ".join(f"{o['name']} ({_time(o['self_us'])} self)" for o in ops[:2])
    return {
        "finding": f"the trace is mostly warm-up: {_time(w['setup_us'])} of the "
        f"{_time(window)} host window is set-up ({'; '.join(parts)})"
        + (f", inside {within}" if within else ""),
        "fix": "record after warm-up: run a few steps first, or use torch.profiler.schedule("
        "wait=1, warmup=2, active=3); the times here measure set-up, not the step",
        "severity": round(min(w["setup_us"] / window, 1.0), 4),
        "evidence": {"setup_us": w["setup_us"], "window_us": window},
    }


def _time(us: float) -> str:
    return (
        f"{us / 1e6:.3g} s" if us >= 1e5 else f"{us / 1e3:.3g} ms" if us >= 100 else f"{us:.3g} us"
    )


def verdicts(summary: dict) -> list[dict]:
    """Findings with the change that addresses each, most important first. Each verdict
    states the evidence that defines it and fires only with that evidence."""
    gpu = summary["gpu"]
    out = []
    launch = gpu["launch"]
    warm = _warmup_verdict(summary)
    if warm:
        out.append(warm)
    for dev, idle in zip(gpu["breakdown"], gpu["idle"], strict=False):
        span = dev["span_us"] or 1.0
        host = idle["by_cause_us"]["host"] / span
        sync = idle["by_cause_us"]["sync"] / span
        hg = idle["host_gaps"]
        short_idle = hg["short_us"] / span
        # Launch-bound: short kernels, the stream empty between them, and the short host
        # gaps (launch overhead) holding most of the idle time.
        if (
            launch["short_share"] >= SHORT_SHARE
            and short_idle >= LAUNCH_IDLE_SHARE
            and hg["short_us"] >= 0.5 * (idle["idle_us"] or 1.0)
        ):
            fix = []
            if launch["graph_replays"] == 0:
                fix.append("capture the steady-state step in a CUDA graph")
            if gpu["fusion"]["candidates"]:
                fix.append("fuse the runs of memory-bound kernels listed under fusion")
            fix.append("move host work (Python, data loading) off the launch path")
            out.append(
                {
                    "finding": f"device {dev['device']} is launch-bound: {short_idle:.0%} of its "
                    f"span is idle in host gaps shorter than 100 us (median "
                    f"{hg['p50_us']:g} us), between kernels of which "
                    f"{launch['short_share']:.0%} are shorter than "
                    f"{launch['short_threshold_us']:g} us",
                    "fix": "; ".join(fix),
                    "severity": round(short_idle, 4),
                }
            )
        elif host >= HOST_BOUND_SHARE:
            largest = next((g for g in idle["largest"] if g["cause"] == "host"), None)
            where = f" (largest {_time(largest['length_us'])})" if largest else ""
            out.append(
                {
                    "finding": f"device {dev['device']} waits on the host for {host:.0%} of its "
                    f"span in {hg['count']} gaps{where}; not launch overhead "
                    f"({launch['short_share']:.0%} of kernels shorter than "
                    f"{launch['short_threshold_us']:g} us, {short_idle:.0%} of the span in "
                    "gaps under 100 us)",
                    "fix": "see the warm-up finding: record the steady state"
                    if warm
                    else "find the host work in the long gaps (CPU ops by self time: data "
                    "loading, Python, preprocessing) and overlap it with the GPU or move it out "
                    "of the step",
                    "severity": round(host, 4),
                }
            )
        if sync >= SYNC_SHARE:
            kinds = ", ".join(sorted(idle["sync_by_kind_us"]))
            out.append(
                {
                    "finding": f"device {dev['device']}: {sync:.0%} of its span is idle after "
                    f"host synchronisations ({kinds})",
                    "fix": "remove synchronisations from the step (.item(), .cpu(), prints, "
                    "explicit synchronize); use non-blocking copies and events",
                    "severity": round(sync, 4),
                }
            )
    for c in gpu["pageable_copies"]:
        if c["share_of_gpu_time"] >= PAGEABLE_SHARE:
            out.append(
                {
                    "finding": f"device {c['device']}: {c['count']} copies from pageable host "
                    f"memory take {_time(c['time_us'])}, {c['share_of_gpu_time']:.0%} of its GPU "
                    f"time ({', '.join(c['names'])})",
                    "fix": "pin the host buffers (DataLoader(pin_memory=True), "
                    "tensor.pin_memory()) and copy with .to(device, non_blocking=True): pinned "
                    "copies are not staged by the driver and can overlap compute",
                    "severity": round(c["share_of_gpu_time"], 4),
                }
            )
    comm = [d["categories"]["communication"]["share_of_span"] for d in gpu["breakdown"]]
    if comm and max(comm) >= 0.3:
        out.append(
            {
                "finding": f"communication kernels occupy up to {max(comm):.0%} of a device's span",
                "fix": "overlap communication with compute (bucketed all-reduce, async "
                "collectives) or reduce the bytes communicated",
                "severity": round(max(comm), 4),
            }
        )
    for cand in gpu["fusion"]["candidates"][:3]:
        if cand["occurrences"] < 2:
            continue
        use = f" with kernelab's {cand['kernelab_op']}" if cand["kernelab_op"] else ""
        out.append(
            {
                "finding": f"{cand['occurrences']} runs of {' -> '.join(cand['ops'])} "
                f"({cand['kernel_time_us']:.0f} us) could be one kernel",
                "fix": f"fuse them{use}: saves {cand['launches_saved']} launches"
                + (
                    f" and {cand['bytes_saved'] / 1e6:.1f} MB of traffic"
                    if cand["bytes_saved"]
                    else ""
                ),
                "severity": 0.0,
            }
        )
    low = [o for o in gpu["roofline"]["ops"] if o.get("roofline_share") is not None]
    for o in sorted(low, key=lambda o: -o["gpu_time_us"])[:3]:
        if o["roofline_share"] < 0.3:
            out.append(
                {
                    "finding": f"{o['op']} {o['input_dims']} reaches {o['roofline_share']:.0%} of "
                    f"its {o['bound']}-bound roofline ({o['gpu_time_us']:.0f} us)",
                    "fix": "tune or replace the kernel (kernelab tune / a kernelab op), or "
                    "batch the calls into larger ones",
                    "severity": 0.0,
                }
            )
    out.sort(key=lambda v: -v["severity"])
    return out


def public(summary: dict) -> dict:
    """The summary without private (``_``) keys, ready for JSON."""
    if isinstance(summary, dict):
        return {k: public(v) for k, v in summary.items() if not str(k).startswith("_")}
    if isinstance(summary, list):
        return [public(v) for v in summary]
    return summary


__all__ = ["SCHEMA", "NothingToAnalyse", "TraceError", "public", "summarize", "verdicts"]
