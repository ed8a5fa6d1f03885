"""Rich tables for people. Every name from a trace is untrusted text: control characters
are shown as escapes (a kernel name must not move the cursor or recolour the terminal) and
markup is escaped (``rich.markup.escape``), never interpreted."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape as _markup_escape
from rich.table import Table

#: C0 controls (tab and newline included: a name is one line), DEL and C1 controls.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text) -> str:
    """``text`` with every control character as a visible ``\\xNN`` escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def escape(text) -> str:
    """Safe to print: control characters escaped, then markup."""
    return _markup_escape(printable(text))


def _more_devices(rest: list[dict]) -> str:
    """`` (+7 more: 7 × Tesla V100-SXM2-32GB)``: how many other devices and which."""
    if not rest:
        return ""
    counts: dict[str, int] = {}
    for d in rest:
        key = f"{d['name']} ({d['sms']} SMs)" if d.get("sms") else str(d["name"])
        counts[key] = counts.get(key, 0) + 1
    kinds = ", ".join(f"{n} × {name}" for name, n in counts.items())
    return f" (+{len(rest)} more: {kinds})"


def _short(text: str, width: int = 70) -> str:
    text = str(text)
    return escape(text if len(text) <= width else text[: width - 1] + "…")


def _us(v) -> str:
    if v is None:
        return "-"
    v = float(v)
    if v >= 1e6:
        return f"{v / 1e6:.3f} s"
    if v >= 1e3:
        return f"{v / 1e3:.3f} ms"
    return f"{v:.1f} us"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}%"


def render_summary(console: Console, s: dict) -> None:
    rank = f" (rank {s['rank']})" if s.get("rank") is not None else ""
    console.print(f"[bold]kernelab trace summary[/] {escape(s['trace'])}{rank}")
    for d in s["devices"][:1]:
        table = d["hardware_table"] or "not in the hardware table"
        console.print(
            f"device: {escape(str(d['name']))}, {d['sms']} SMs → {escape(table)}"
            + escape(_more_devices(s["devices"][1:]))
        )
    integ = s["integrity"]
    if integ["messages"]:
        console.print("[yellow]integrity:[/] " + escape("; ".join(integ["messages"])))
    else:
        console.print("[green]integrity: no problems found[/]")
    gpu = s.get("gpu")
    if gpu:
        _gpu_tables(console, gpu)
    for m in s.get("memory") or []:
        _memory(console, m)
    _cpu_table(console, s["cpu"])
    if s.get("verdicts"):
        console.print("[bold]what to change[/]")
        for v in s["verdicts"]:
            console.print(f" • {escape(v['finding'])}")
            if v.get("fix"):
                console.print(f"   [green]→ {escape(v['fix'])}[/]")


def _gpu_tables(console: Console, gpu: dict) -> None:
    t = Table(title="GPU time by device")
    for col in ("device", "span", "compute", "memory", "communication", "idle", "host", "sync"):
        t.add_column(col, justify="right")
    t.add_column("other", justify="right")
    for b, idle in zip(gpu["breakdown"], gpu["idle"], strict=False):
        c = b["categories"]
        span = b["span_us"] or 1
        t.add_row(
            str(b["device"]),
            _us(b["span_us"]),
            *(
                f"{_us(c[k]['busy_us'])} ({_pct(c[k]['share_of_span'])})"
                for k in ("compute", "memory", "communication")
            ),
            f"{_us(b['idle_us'])} ({_pct(b['idle_share'])})",
            *(
                f"{_us(idle['by_cause_us'][k])} ({_pct(idle['by_cause_us'][k] / span)})"
                for k in ("host", "sync", "other")
            ),
        )
    console.print(t)
    la = gpu["launch"]
    console.print(
        f"launches: {la['measured']} measured of {la['kernels']} kernels; latency p50 "
        f"{_us(la['latency_us']['p50'])}, p90 {_us(la['latency_us']['p90'])}; queueing total "
        f"{_us(la['queueing_us']['total'])} ({_pct(la['queued_share'])} of kernels queued); "
        f"{_pct(la['short_share'])} shorter than {la['short_threshold_us']:g} us; "
        f"{la['graph_replays']} graph replays ({la['in_graph_replays']} kernels)"
    )
    comm = gpu.get("communication", {}).get("trace") or {}
    if comm.get("communication_us"):
        console.print(
            f"communication: {_us(comm['communication_us'])} of kernels, "
            f"{_pct(comm['overlap_share'])} overlapped by compute, "
            f"{_us(comm['exposed_us'])} exposed"
        )
    t = Table(title="Top kernels (normalised names)")
    for col in ("kernel", "category", "op", "count", "total", "mean", "share"):
        t.add_column(col, justify="right" if col in ("count", "total", "mean", "share") else "left")
    for k in gpu["top_kernels"]:
        t.add_row(
            _short(k["name"]),
            k["category"],
            _short(k["op"] or "-", 30),
            str(k["count"]),
            _us(k["total_us"]),
            _us(k["mean_us"]),
            _pct(k["share"]),
        )
    console.print(t)
    roof = gpu["roofline"]
    if roof["ops"]:
        t = Table(title="Roofline (ops with recorded shapes)")
        for col in ("op", "shapes", "calls", "GPU time", "TFLOP/s", "GB/s", "bound", "% roof"):
            t.add_column(col)
        for o in roof["ops"]:
            t.add_row(
                _short(o["op"], 30),
                _short(o["input_dims"], 40),
                str(o["calls"]),
                _us(o["gpu_time_us"]),
                f"{o['achieved_tflops']:.2f}",
                f"{o['achieved_gbps']:.1f}",
                o.get("bound", "-"),
                _pct(o.get("roofline_share")),
            )
        console.print(t)
    if roof.get("note"):
        console.print(f"roofline: {escape(roof['note'])}")
    fusion = gpu["fusion"]["candidates"]
    if fusion:
        t = Table(title="Fusion candidates (consecutive memory-bound kernels, one stream)")
        for col in ("ops", "runs", "time", "launches saved", "bytes saved", "kernelab op"):
            t.add_column(col)
        for c in fusion:
            t.add_row(
                _short(" → ".join(c["ops"]), 80),
                str(c["occurrences"]),
                _us(c["kernel_time_us"]),
                str(c["launches_saved"]),
                "-" if c["bytes_saved"] is None else f"{c['bytes_saved'] / 1e6:.2f} MB",
                escape(c["kernelab_op"] or c["fused_form"] or "-"),
            )
        console.print(t)
    occ = gpu["occupancy"]
    rows = [k for k in occ["kernels"] if k.get("occupancy") is not None]
    if rows:
        t = Table(title="Theoretical occupancy (real shared-memory carveouts)")
        for col in ("kernel", "block", "regs", "smem", "occupancy", "limiter", "time"):
            t.add_column(col)
        for k in rows:
            t.add_row(
                _short(k["name"], 50),
                str(k["block"]),
                str(k["registers"]),
                str(k["shared_bytes"]),
                _pct(k["occupancy"]),
                escape(k["limiter"]),
                _us(k["time_us"]),
            )
        console.print(t)
    elif occ.get("note"):
        console.print(f"occupancy: {escape(occ['note'])}")


_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list, width: int = 48) -> str:
    """One character per point (the maximum of each of ``width`` groups), scaled to max."""
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [
            max(values[int(i * step) : max(int((i + 1) * step), int(i * step) + 1)])
            for i in range(width)
        ]
    top = max(values) or 1
    return "".join(_BLOCKS[min(int(v / top * (len(_BLOCKS) - 1) + 0.5), 7)] for v in values)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if abs(n) >= 2**20 else f"{n / 2**10:.1f} KiB"


def _memory(console: Console, m: dict) -> None:
    reserved = (
        f", peak reserved {_mb(m['peak_reserved_bytes'])} at {_us(m['peak_reserved_at_us'])}; "
        f"reserved but unallocated at the peak {_mb(m['slack_at_peak_bytes'])}"
        if m["peak_reserved_bytes"]
        else " (no reserved totals: not a caching allocator)"
    )
    console.print(
        f"[bold]memory {escape(m['device'])}[/]: peak allocated {_mb(m['peak_allocated_bytes'])} "
        f"at {_us(m['peak_allocated_at_us'])}{reserved}; {m['allocations']} allocations, "
        f"{m['frees']} frees"
    )
    console.print(f"allocated over time: {sparkline([p[1] for p in m['timeline']])}")
    if m["live_at_peak_by_op"]:
        t = Table(title="Live at the peak, by the op that allocated")
        for col in ("op", "allocations", "bytes"):
            t.add_column(col, justify="left" if col == "op" else "right")
        for r in m["live_at_peak_by_op"]:
            t.add_row(_short(r["op"], 50), str(r["allocations"]), _mb(r["bytes"]))
        console.print(t)
    nf = m["never_freed"]
    if nf["allocations"]:
        ops = ", ".join(f"{r['op']} {_mb(r['bytes'])}" for r in nf["by_op"][:3])
        console.print(
            f"never freed in the window: {nf['allocations']} allocations, {_mb(nf['bytes'])} "
            f"({escape(ops)})"
        )


def _cpu_table(console: Console, cpu: dict) -> None:
    if not cpu["ops"]:
        return
    t = Table(title="CPU ops by self time")
    for col in ("op", "count", "total", "self", "share"):
        t.add_column(col)
    for o in cpu["ops"][:10]:
        t.add_row(
            _short(o["name"], 50),
            str(o["count"]),
            _us(o["total_us"]),
            _us(o["self_us"]),
            _pct(o["self_share"]),
        )
    console.print(t)
    if cpu.get("overhead_share") is not None:
        console.print(
            f"framework overhead (step time outside any op): {_pct(cpu['overhead_share'])} of "
            f"{_us(cpu['window_us'])} over {cpu['steps'] or 'the whole'} step(s)"
        )


def render_diff(console: Console, d: dict) -> None:
    console.print(f"[bold]kernelab trace diff[/] {escape(d['a'])} → {escape(d['b'])}")
    for w in d.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(w)}")
    t = Table(title="Per category (kernel time)")
    for col in ("category", "A", "B", "Δ", "Δ count"):
        t.add_column(col)
    for c in d["categories"]:
        t.add_row(
            c["category"],
            _us(c["a_us"]),
            _us(c["b_us"]),
            _us(c["delta_us"]),
            f"{c['delta_count']:+d}",
        )
    console.print(t)
    t = Table(title="Kernel groups ranked by |Δ time|")
    for col in ("kernel", "A", "B", "Δ", "A count", "B count"):
        t.add_column(col)
    for k in d["kernels"]:
        t.add_row(
            _short(k["name"]),
            _us(k["a_us"]),
            _us(k["b_us"]),
            _us(k["delta_us"]),
            str(k["a_count"]),
            str(k["b_count"]),
        )
    console.print(t)


def render_ranks(console: Console, r: dict) -> None:
    console.print(f"[bold]kernelab trace summary[/] {escape(r['folder'])}: {len(r['ranks'])} ranks")
    t = Table(title="Per rank")
    cols = ("rank", "file", "span", "compute", "communication", "idle", "comm share")
    for col in (*cols, "overlapped", "exposed"):
        t.add_column(col)
    for row in r["ranks"]:
        t.add_row(
            str(row["rank"]),
            _short(row["file"], 40),
            _us(row["span_us"]),
            _us(row["compute_us"]),
            _us(row["communication_us"]),
            _us(row["idle_us"]),
            _pct(row["communication_share"]),
            _pct(row.get("comm_overlap_share")),
            _us(row.get("exposed_communication_us")),
        )
    console.print(t)
    for s in r["stragglers"]:
        console.print(f"[yellow]straggler:[/] {escape(s['reason'])}")
    for v in r.get("verdicts", []):
        console.print(f" • {escape(v)}")
