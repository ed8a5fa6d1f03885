"""``kernelab trace summary TRACE --html FILE``: one self-contained page (inline CSS and SVG,
no scripts, nothing fetched) with the summary's tables and, for traces recorded with
``profile_memory=True``, each device's allocated / reserved timeline with its peak marked.

Every name from a trace is untrusted text: all of it is escaped here (:func:`esc`), and a
Content Security Policy forbids scripts and network access as a second guard.
"""

from __future__ import annotations

from pathlib import Path

from kernelab.report import fmt
from kernelab.report.svg import PALETTE, Canvas, Scale, esc, num, page_head

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;
background:#fff;max-width:1300px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:26px 0 6px;border-bottom:1px solid
#ccc;padding-bottom:4px}h3{font-size:15px;margin:18px 0 4px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}
td.name{max-width:640px;word-break:break-all;font-family:ui-monospace,monospace;font-size:11px}
.muted{color:#666;font-size:13px}.warn{color:#a00}.fix{color:#176b2c}
svg.chart{background:#fff;border:1px solid #ddd;font-family:system-ui,sans-serif}
"""

ALLOCATED, RESERVED, PEAK = PALETTE[0], PALETTE[2], PALETTE[1]


def check_output(out_path) -> Path:
    """The page's file: a name ending in .html or .htm, in a folder that exists, not a
    folder itself. Checked before the analysis, so that a bad name costs nothing."""
    out = Path(out_path)
    if not out.name.lower().endswith((".html", ".htm")) or out.name.lower() in (
        ".html",
        ".htm",
    ):
        raise ValueError(f"html: expected a file name ending in .html, got {str(out_path)!r}")
    if out.is_dir():
        raise ValueError(f"html: {str(out_path)!r} is a folder, expected a file name")
    if not out.parent.is_dir():
        raise ValueError(f"html: the folder of {str(out_path)!r} does not exist")
    return out


def _us(v) -> str:
    return "-" if v is None else fmt.seconds(float(v) * 1e-6)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}%"


def _cell(v) -> str:
    """A cell's markup: its text escaped; a ``(text, detail)`` pair shows the detail under it."""
    if isinstance(v, tuple):
        text, detail = v
        more = f'<br><span class="muted">{esc(detail)}</span>' if detail and detail != text else ""
        return esc(text) + more
    return esc(v)


def _table(head: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    """Cells are escaped here; ``numeric``: the columns aligned right."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"n" if i in numeric else "name"}">{_cell(v)}</td>'
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def _steps(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A level held until the next point (the allocator's total is a step function)."""
    out: list[tuple[float, float]] = []
    for x, y in points:
        if out:
            out.append((x, out[-1][1]))
        out.append((x, y))
    return out


def _polyline(c: Canvas, xs: Scale, ys: Scale, pts, color: str, label: str) -> None:
    coords = " ".join(f"{num(xs(x))},{num(ys(y))}" for x, y in _steps(pts))
    c.add(
        f'<polyline class="{esc(label)}" points="{coords}" fill="none" stroke="{color}" '
        f'stroke-width="1.6"><title>{esc(label)}</title></polyline>'
    )


def memory_timeline(m: dict, width: int = 900, height: int = 320) -> str:
    """Allocated (and reserved, where the allocator reports it) over time on one device as
    an SVG chart; the peak of allocated memory marked with its value and time."""
    tl = m["timeline"]
    has_res = bool(m.get("peak_reserved_bytes"))
    t = [p[0] * 1e-6 for p in tl]  # seconds from the trace's start
    peak_t = m["peak_allocated_at_us"] * 1e-6
    top = max([m["peak_allocated_bytes"], m["peak_reserved_bytes"] if has_res else 0, 1])
    c = Canvas(width, height, f"memory on {m['device']}: allocated" + (" and reserved" * has_res))
    xs = Scale.fit([*t, peak_t], c.x0, c.x1, log=False, pad=0.02)
    ys = Scale(0.0, top * 1.12, c.y0, c.y1, log=False)
    c.axes(xs, ys, "time from the trace's start", "bytes (1 MB = 10⁶ B)", xunit="s", yunit="B")
    legend = [("allocated", ALLOCATED)] + ([("reserved", RESERVED)] if has_res else [])
    c.legend([*legend, ("peak allocated", PEAK)])
    if has_res:
        _polyline(c, xs, ys, [(x, p[2]) for x, p in zip(t, tl, strict=True)], RESERVED, "reserved")
    _polyline(c, xs, ys, [(x, p[1]) for x, p in zip(t, tl, strict=True)], ALLOCATED, "allocated")
    px, py = xs(peak_t), ys(m["peak_allocated_bytes"])
    tip = (
        f"peak allocated {fmt.nbytes(m['peak_allocated_bytes'])} at "
        f"{_us(m['peak_allocated_at_us'])}"
    )
    c.line(px, c.y0, px, c.y1, PEAK, 1.0, dash="4 3", tip=tip)
    c.add(
        f'<circle class="peak" cx="{num(px)}" cy="{num(py)}" r="5" fill="{PEAK}">'
        f"<title>{esc(tip)}</title></circle>"
    )
    anchor = "end" if px > (c.x0 + c.x1) / 2 else "start"
    c.text(px + (-8 if anchor == "end" else 8), py - 8, tip, 12, anchor, PEAK, cls="peak-label")
    return c.render()


def _memory_section(m: dict) -> str:
    out = [f"<h3>memory {esc(m['device'])}</h3>"]
    facts = [
        f"peak allocated {fmt.nbytes(m['peak_allocated_bytes'])} at "
        f"{_us(m['peak_allocated_at_us'])}"
    ]
    if m["peak_reserved_bytes"]:
        facts.append(
            f"peak reserved {fmt.nbytes(m['peak_reserved_bytes'])} at "
            f"{_us(m['peak_reserved_at_us'])}"
        )
        facts.append(f"reserved but unallocated at the peak {fmt.nbytes(m['slack_at_peak_bytes'])}")
    else:
        facts.append("no reserved totals (not a caching allocator)")
    facts.append(f"{m['allocations']} allocations, {m['frees']} frees")
    out.append(f"<p>{esc('; '.join(facts))}</p>")
    out.append(memory_timeline(m))
    out.append(
        '<p class="muted">Each point is the largest total within its time bin, so the peak is '
        "never lost; the marked peak is the exact one.</p>"
    )
    if m["live_at_peak_by_op"]:
        out.append("<h3>live at the peak, by the op that allocated</h3>")
        rows = [
            [r["op"], r["allocations"], fmt.nbytes(r["bytes"])] for r in m["live_at_peak_by_op"]
        ]
        out.append(_table(["op", "allocations", "bytes"], rows, {1, 2}))
    nf = m["never_freed"]
    if nf["allocations"]:
        out.append(
            f"<h3>never freed in the window: {nf['allocations']} allocations, "
            f"{esc(fmt.nbytes(nf['bytes']))}</h3>"
        )
        rows = [[r["op"], r["allocations"], fmt.nbytes(r["bytes"])] for r in nf["by_op"]]
        out.append(_table(["op", "allocations", "bytes"], rows, {1, 2}))
    return "\n".join(out)


def _gpu_sections(gpu: dict) -> list[str]:
    out = ["<h2>GPU time by device (share of the span)</h2>"]
    rows = []
    for b, idle in zip(gpu["breakdown"], gpu["idle"], strict=False):
        c, span = b["categories"], b["span_us"] or 1
        rows.append(
            [b["device"], _us(b["span_us"])]
            + [
                f"{_us(c[k]['busy_us'])} {_pct(c[k]['share_of_span'])}"
                for k in ("compute", "memory", "communication")
            ]
            + [f"{_us(b['idle_us'])} {_pct(b['idle_share'])}"]
            + [
                f"{_us(idle['by_cause_us'][k])} {_pct(idle['by_cause_us'][k] / span)}"
                for k in ("host", "sync", "other")
            ]
        )
    head = ["device", "span", "compute", "memory", "communication", "idle"]
    out.append(_table([*head, "host idle", "sync idle", "other idle"], rows, set(range(1, 9))))
    la = gpu["launch"]
    out.append(
        f"<p>{esc(la['measured'])} launches measured of {esc(la['kernels'])} kernels; latency "
        f"p50 {esc(_us(la['latency_us']['p50']))}, p90 {esc(_us(la['latency_us']['p90']))}; "
        f"queueing total {esc(_us(la['queueing_us']['total']))} "
        f"({esc(_pct(la['queued_share']))} of kernels queued); {esc(_pct(la['short_share']))} "
        f"shorter than {esc(la['short_threshold_us'])} us; {esc(la['graph_replays'])} graph "
        f"replays ({esc(la['in_graph_replays'])} kernels)</p>"
    )
    comm = (gpu.get("communication") or {}).get("trace") or {}
    if comm.get("communication_us"):
        out.append(
            f"<p>communication: {esc(_us(comm['communication_us']))} of kernels, "
            f"{esc(_pct(comm['overlap_share']))} overlapped by compute, "
            f"{esc(_us(comm['exposed_us']))} exposed</p>"
        )
    out.append("<h2>top kernels (normalised names)</h2>")
    rows = [
        [
            (k["name"], k.get("example")),
            k["count"],
            _us(k["total_us"]),
            _us(k["mean_us"]),
            _pct(k["share"]),
            k["category"],
            k["op"] or "-",
        ]
        for k in gpu["top_kernels"]
    ]
    head = ["kernel", "count", "total", "mean", "share", "category", "op"]
    out.append(_table(head, rows, {1, 2, 3, 4}))
    roof = gpu["roofline"]
    if roof["ops"]:
        out.append("<h2>roofline (ops with recorded shapes)</h2>")
        rows = [
            [
                o["op"],
                o["input_dims"],
                o["calls"],
                _us(o["gpu_time_us"]),
                f"{o['achieved_tflops']:.2f}",
                f"{o['achieved_gbps']:.1f}",
                o.get("bound", "-"),
                _pct(o.get("roofline_share")),
            ]
            for o in roof["ops"]
        ]
        head = ["op", "shapes", "calls", "GPU time", "TFLOP/s", "GB/s", "bound", "% roof"]
        out.append(_table(head, rows, {2, 3, 4, 5, 7}))
    if roof.get("note"):
        out.append(f'<p class="muted">roofline: {esc(roof["note"])}</p>')
    fusion = gpu["fusion"]["candidates"]
    if fusion:
        out.append("<h2>fusion candidates (consecutive memory-bound kernels, one stream)</h2>")
        rows = [
            [
                " → ".join(c["ops"]),
                c["occurrences"],
                _us(c["kernel_time_us"]),
                c["launches_saved"],
                "-" if c["bytes_saved"] is None else fmt.nbytes(c["bytes_saved"]),
                c["kernelab_op"] or c["fused_form"] or "-",
            ]
            for c in fusion
        ]
        head = ["ops", "runs", "time", "launches saved", "bytes saved", "kernelab op"]
        out.append(_table(head, rows, {1, 2, 3, 4}))
    occ = [k for k in gpu["occupancy"]["kernels"] if k.get("occupancy") is not None]
    if occ:
        out.append("<h2>theoretical occupancy</h2>")
        rows = [
            [
                k["name"],
                k["block"],
                k["registers"],
                k["shared_bytes"],
                _pct(k["occupancy"]),
                k.get("limiter") or "-",
                _us(k["time_us"]),
            ]
            for k in occ
        ]
        head = ["kernel", "block", "regs", "smem", "occupancy", "limiter", "time"]
        out.append(_table(head, rows, {1, 2, 3, 4, 6}))
    return out


def _cpu_section(cpu: dict, rows_shown: int = 15) -> list[str]:
    if not cpu["ops"]:
        return []
    rows = [
        [o["name"], o["count"], _us(o["total_us"]), _us(o["self_us"]), _pct(o["self_share"])]
        for o in cpu["ops"][:rows_shown]
    ]
    out = [
        "<h2>CPU ops by self time</h2>",
        _table(["op", "count", "total", "self", "share"], rows, {1, 2, 3, 4}),
    ]
    if cpu.get("overhead_share") is not None:
        out.append(
            f"<p>framework overhead (step time outside any op): "
            f"{esc(_pct(cpu['overhead_share']))} of {esc(_us(cpu['window_us']))} over "
            f"{esc(cpu['steps'] or 'the whole')} step(s)</p>"
        )
    return out


def render(s: dict) -> str:
    """The page for one trace's summary (the ``--json`` document, :func:`public`'s dict)."""
    title = f"kernelab trace summary: {Path(str(s['trace'])).name}"
    rank = f" · rank {s['rank']}" if s.get("rank") is not None else ""
    out = page_head(title, _CSS, before=f"{s['trace']}{rank} · ")
    if s["devices"]:
        rows = [
            [
                d["id"],
                d["name"],
                d["sms"] if d.get("sms") is not None else "-",
                fmt.nbytes(d["memory_bytes"]),
                d.get("hardware_table") or "not in the table",
            ]
            for d in s["devices"]
        ]
        out.append(_table(["device", "name", "SMs", "memory", "hardware table"], rows, {2, 3}))
    integ = s["integrity"]
    if integ["messages"]:
        items = "".join(f"<li>{esc(m)}</li>" for m in integ["messages"])
        out.append(f'<p class="warn">integrity:</p><ul>{items}</ul>')
    else:
        out.append("<p>integrity: no problems found</p>")
    if s.get("verdicts"):
        out.append("<h2>what to change</h2><ul>")
        for v in s["verdicts"]:
            fix = f'<br><span class="fix">→ {esc(v["fix"])}</span>' if v.get("fix") else ""
            out.append(f"<li>{esc(v['finding'])}{fix}</li>")
        out.append("</ul>")
    if s.get("memory"):
        out.append("<h2>memory</h2>")
        out.extend(_memory_section(m) for m in s["memory"])
    if s.get("gpu"):
        out.extend(_gpu_sections(s["gpu"]))
    out.extend(_cpu_section(s["cpu"]))
    out.append("</body></html>")
    return "\n".join(out)


def write(s: dict, out_path) -> Path:
    """Write :func:`render`'s page for summary ``s`` to ``out_path`` (checked as
    :func:`check_output`); an unwritable file is a ValueError naming it."""
    out = check_output(out_path)
    try:
        out.write_text(render(s), encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"html: cannot write {str(out_path)!r}: {exc.strerror}") from None
    return out
