"""Tables for people, laid out for 80 columns first (:class:`kernelab._table.Sheet`): no
kernel, op or device name and no number is ever cut; long names move below their row and
secondary columns give way on narrow terminals. Every name from a trace is untrusted text:
control characters are shown as escapes (a kernel name must not move the cursor or recolour
the terminal); table cells are plain text and prose has its markup escaped
(``rich.markup.escape``), never interpreted."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape as _markup_escape

from kernelab._table import Col, Sheet

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


def _us(v, sign: bool = False) -> str:
    """Microseconds in the unit that suits them; ``sign``: a leading + on a positive change."""
    if v is None:
        return "-"
    v = float(v)
    lead = "-" if v < 0 else "+" if sign and v > 0 else ""
    v = abs(v)
    if v >= 1e6:
        return f"{lead}{v / 1e6:.3f} s"
    if v >= 1e3:
        return f"{lead}{v / 1e3:.3f} ms"
    return f"{lead}{v:.1f} us"


def _share(us, share) -> str:
    """``12.854 s 99.5%``: a time and its share of the span, in one cell."""
    return f"{_us(us)} {_pct(share)}"


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


def device_sheet(gpu: dict) -> Sheet:
    """Busy and idle time per device, each with its share of the span; at 80 columns the idle
    causes (and communication) move under each device's row."""
    sheet = Sheet(
        "GPU time by device (share of the span)",
        [
            Col("device"),
            Col("span", right=True),
            Col("compute", right=True),
            Col("memory", right=True),
            Col("communication", right=True, give="below", step=2),
            Col("idle", right=True),
            Col("host idle", right=True, give="below", step=1),
            Col("sync idle", right=True, give="below", step=1),
            Col("other idle", right=True, give="below", step=1),
        ],
    )
    for b, idle in zip(gpu["breakdown"], gpu["idle"], strict=False):
        c = b["categories"]
        span = b["span_us"] or 1
        sheet.row(
            printable(b["device"]),
            _us(b["span_us"]),
            *(
                _share(c[k]["busy_us"], c[k]["share_of_span"])
                for k in ("compute", "memory", "communication")
            ),
            _share(b["idle_us"], b["idle_share"]),
            *(
                _share(idle["by_cause_us"][k], idle["by_cause_us"][k] / span)
                for k in ("host", "sync", "other")
            ),
        )
    return sheet


def top_kernels_sheet(gpu: dict) -> Sheet:
    """The kernels with the most GPU time; a long kernel name (then op) moves under its row."""
    sheet = Sheet(
        "Top kernels (normalised names)",
        [
            Col("kernel", give="spill", step=1),
            Col("count", right=True),
            Col("total", right=True),
            Col("mean", right=True),
            Col("share", right=True),
            Col("category"),
            Col("op", give="below", step=2),
        ],
    )
    for k in gpu["top_kernels"]:
        sheet.row(
            printable(k["name"]),
            str(k["count"]),
            _us(k["total_us"]),
            _us(k["mean_us"]),
            _pct(k["share"]),
            printable(k["category"]),
            printable(k["op"] or "-"),
        )
    return sheet


def roofline_sheet(roof: dict) -> Sheet:
    """Achieved throughput of the ops with recorded shapes; the shapes move under the row."""
    sheet = Sheet(
        "Roofline (ops with recorded shapes)",
        [
            Col("op", give="spill", step=2),
            Col("shapes", give="below", step=1),
            Col("calls", right=True),
            Col("GPU time", right=True),
            Col("TFLOP/s", right=True),
            Col("GB/s", right=True),
            Col("bound", hide_empty=True),
            Col("% roof", right=True, hide_empty=True),
        ],
    )
    for o in roof["ops"]:
        sheet.row(
            printable(o["op"]),
            printable(o["input_dims"]),
            str(o["calls"]),
            _us(o["gpu_time_us"]),
            f"{o['achieved_tflops']:.2f}",
            f"{o['achieved_gbps']:.1f}",
            printable(o.get("bound", "-")),
            _pct(o.get("roofline_share")),
        )
    return sheet


def fusion_sheet(fusion: list[dict]) -> Sheet:
    """Runs of memory-bound kernels that could be one; the chain of ops moves under the row
    (broken between ops, never inside one)."""
    sheet = Sheet(
        "Fusion candidates (consecutive memory-bound kernels, one stream)",
        [
            Col("ops", give="spill", step=1),
            Col("runs", right=True),
            Col("time", right=True),
            Col("launches saved", right=True),
            Col("bytes saved", right=True, hide_empty=True),
            Col("kernelab op", hide_empty=True, give="below", step=2),
        ],
    )
    for c in fusion:
        sheet.row(
            " → ".join(printable(op) for op in c["ops"]),
            str(c["occurrences"]),
            _us(c["kernel_time_us"]),
            str(c["launches_saved"]),
            "-" if c["bytes_saved"] is None else f"{c['bytes_saved'] / 1e6:.2f} MB",
            printable(c["kernelab_op"] or c["fused_form"] or "-"),
        )
    return sheet


def occupancy_sheet(rows: list[dict]) -> Sheet:
    """Theoretical occupancy per kernel; a long kernel name moves under its row."""
    sheet = Sheet(
        "Theoretical occupancy (real shared-memory carveouts)",
        [
            Col("kernel", give="spill", step=1),
            Col("block", right=True),
            Col("regs", right=True),
            Col("smem", right=True),
            Col("occupancy", right=True),
            Col("limiter"),
            Col("time", right=True),
        ],
    )
    for k in rows:
        sheet.row(
            printable(k["name"]),
            str(k["block"]),
            str(k["registers"]),
            str(k["shared_bytes"]),
            _pct(k["occupancy"]),
            printable(k["limiter"]),
            _us(k["time_us"]),
        )
    return sheet


def _gpu_tables(console: Console, gpu: dict) -> None:
    device_sheet(gpu).print(console)
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
    top_kernels_sheet(gpu).print(console)
    roof = gpu["roofline"]
    if roof["ops"]:
        roofline_sheet(roof).print(console)
    if roof.get("note"):
        console.print(f"roofline: {escape(roof['note'])}")
    fusion = gpu["fusion"]["candidates"]
    if fusion:
        fusion_sheet(fusion).print(console)
    occ = gpu["occupancy"]
    rows = [k for k in occ["kernels"] if k.get("occupancy") is not None]
    if rows:
        occupancy_sheet(rows).print(console)
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
        sheet = Sheet(
            "Live at the peak, by the op that allocated",
            [
                Col("op", give="spill", step=1),
                Col("allocations", right=True),
                Col("bytes", right=True),
            ],
        )
        for r in m["live_at_peak_by_op"]:
            sheet.row(printable(r["op"]), str(r["allocations"]), _mb(r["bytes"]))
        sheet.print(console)
    nf = m["never_freed"]
    if nf["allocations"]:
        ops = ", ".join(f"{r['op']} {_mb(r['bytes'])}" for r in nf["by_op"][:3])
        console.print(
            f"never freed in the window: {nf['allocations']} allocations, {_mb(nf['bytes'])} "
            f"({escape(ops)})"
        )


#: Rows of the CPU-op table (the JSON lists ``--top`` of them).
CPU_ROWS = 10


def _cpu_table(console: Console, cpu: dict) -> None:
    if not cpu["ops"]:
        return
    sheet = Sheet(
        "CPU ops by self time",
        [
            Col("op", give="spill", step=1),
            Col("count", right=True),
            Col("total", right=True),
            Col("self", right=True),
            Col("share", right=True),
        ],
    )
    for o in cpu["ops"][:CPU_ROWS]:
        sheet.row(
            printable(o["name"]),
            str(o["count"]),
            _us(o["total_us"]),
            _us(o["self_us"]),
            _pct(o["self_share"]),
        )
    sheet.print(console)
    if cpu.get("overhead_share") is not None:
        console.print(
            f"framework overhead (step time outside any op): {_pct(cpu['overhead_share'])} of "
            f"{_us(cpu['window_us'])} over {cpu['steps'] or 'the whole'} step(s)"
        )


def render_diff(console: Console, d: dict) -> None:
    console.print(f"[bold]kernelab trace diff[/] {escape(d['a'])} → {escape(d['b'])}")
    for w in d.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(w)}")
    categories_sheet(d).print(console)
    kernel_groups_sheet(d).print(console)


def categories_sheet(d: dict) -> Sheet:
    sheet = Sheet(
        "Per category (kernel time)",
        [
            Col("category"),
            Col("A", right=True),
            Col("B", right=True),
            Col("Δ", right=True),
            Col("Δ count", right=True),
        ],
    )
    for c in d["categories"]:
        sheet.row(
            printable(c["category"]),
            _us(c["a_us"]),
            _us(c["b_us"]),
            _us(c["delta_us"], sign=True),
            f"{c['delta_count']:+d}",
        )
    return sheet


def kernel_groups_sheet(d: dict) -> Sheet:
    """Kernel groups by the size of their change; a long kernel name moves under its row."""
    sheet = Sheet(
        "Kernel groups ranked by |Δ time|",
        [
            Col("kernel", give="spill", step=1),
            Col("A", right=True),
            Col("B", right=True),
            Col("Δ", right=True),
            Col("A count", right=True),
            Col("B count", right=True),
        ],
    )
    for k in d["kernels"]:
        sheet.row(
            printable(k["name"]),
            _us(k["a_us"]),
            _us(k["b_us"]),
            _us(k["delta_us"], sign=True),
            str(k["a_count"]),
            str(k["b_count"]),
        )
    return sheet


def render_ranks(console: Console, r: dict) -> None:
    console.print(f"[bold]kernelab trace summary[/] {escape(r['folder'])}: {len(r['ranks'])} ranks")
    ranks_sheet(r).print(console)
    for s in r["stragglers"]:
        console.print(f"[yellow]straggler:[/] {escape(s['reason'])}")
    for v in r.get("verdicts", []):
        console.print(f" • {escape(v)}")


def ranks_sheet(r: dict) -> Sheet:
    """One row per rank; at 80 columns the file name and the overlap figures move under it."""
    sheet = Sheet(
        "Per rank",
        [
            Col("rank", right=True),
            Col("file", give="below", step=1),
            Col("span", right=True),
            Col("compute", right=True),
            Col("communication", right=True),
            Col("idle", right=True),
            Col("comm share", right=True),
            Col("overlapped", right=True, give="below", step=3),
            Col("exposed", right=True, give="below", step=2),
        ],
    )
    for row in r["ranks"]:
        sheet.row(
            printable(row["rank"]),
            printable(row["file"]),
            _us(row["span_us"]),
            _us(row["compute_us"]),
            _us(row["communication_us"]),
            _us(row["idle_us"]),
            _pct(row["communication_share"]),
            _pct(row.get("comm_overlap_share")),
            _us(row.get("exposed_communication_us")),
        )
    return sheet
