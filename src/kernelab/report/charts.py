"""The report's charts: roofline, per-shape latency, raw samples and speedups, as inline SVG."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from kernelab.report import fmt
from kernelab.report.svg import CEILING, Canvas, Placer, Scale, si, text_box

Colors = Callable[[str], str]


def _pos(v) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) and v > 0 else None


def median_of(case: dict) -> float | None:
    m = _pos(case["metrics"].get("median_s"))
    if m is None and case.get("samples"):
        m = _pos(float(np.median(case["samples"])))
    return m


def quartiles_of(case: dict) -> tuple[float | None, float | None]:
    q1, q3 = _pos(case["metrics"].get("q1_s")), _pos(case["metrics"].get("q3_s"))
    if (q1 is None or q3 is None) and len(case.get("samples") or []) >= 4:
        q1, q3 = (float(v) for v in np.quantile(case["samples"], [0.25, 0.75]))
    return q1, q3


def invalid(case: dict) -> bool:
    return any("invalid" in str(f).lower() for f in case.get("flags") or []) or (
        case["metrics"].get("valid") is False
    )


def tip(case: dict, extra: str = "") -> str:
    parts = [
        f"{case['op']} · {case['variant']} · {case.get('shape_label') or case['shape_key']}",
        f"{case['dtype']} · {case['device']} · {case['mode']}",
        f"median {fmt.seconds(median_of(case))}",
    ]
    if extra:
        parts.append(extra)
    if case.get("flags"):
        parts.append("flags: " + ", ".join(case["flags"]))
    return "\n".join(parts)


def roofline_points(cases: list[dict]) -> list[tuple[int, float, float, dict]]:
    """The cases a roofline can place (FLOPs, bytes and a time all known), numbered from 1
    in case order: ``(number, FLOP/byte, FLOP/s, case)``. The chart draws the numbers beside
    the points; the report lists them in a legend table under it."""
    pts = []
    for c in cases:
        m = c["metrics"]
        flops, nbytes, t = _pos(m.get("flops")), _pos(m.get("bytes")), median_of(c)
        if flops and nbytes and t:
            pts.append((len(pts) + 1, flops / nbytes, flops / t, c))
    return pts


#: Size of the numbers beside roofline points, and the radius of the points.
_LABEL_SIZE, _POINT_R = 10, 5


def roofline(cases: list[dict], ceilings: dict, colors: Colors, title: str) -> str:
    """Arithmetic intensity (FLOP/byte) against achieved FLOP/s, under the device's roofs;
    each point numbered as in :func:`roofline_points`, the number placed where it covers no
    other number, point or roof label (joined to its point by a thin line when set apart).

    ``ceilings``: ``{"bandwidth": bytes/s or None, "bandwidth_source": str,
    "flops": {dtype: FLOP/s}, "flops_source": {dtype: str}}``.
    """
    pts = roofline_points(cases)
    bw = _pos(ceilings.get("bandwidth"))
    dtypes = sorted({c["dtype"] for c in cases})
    peaks = {d: p for d in dtypes if (p := _pos((ceilings.get("flops") or {}).get(d)))}
    cv = Canvas(760, 420, title, margin=(56, 30, 50, 80))
    xs_vals = [p[1] for p in pts] + [p / bw for p in peaks.values() if bw]
    ys_vals = [p[2] for p in pts] + list(peaks.values())
    if not pts:
        cv.axes(Scale(0.1, 100, cv.x0, cv.x1), Scale(1e9, 1e12, cv.y0, cv.y1), "", "")
        cv.text(cv.x0 + 20, cv.y1 + 40, "no case has both FLOPs and bytes to place", 13)
        return cv.render("chart roofline")
    xs = Scale.fit(xs_vals, cv.x0, cv.x1, pad=0.15)
    ys = Scale.fit(ys_vals, cv.y0, cv.y1, pad=0.15)
    cv.axes(xs, ys, "arithmetic intensity (FLOP/byte)", "achieved FLOP/s")
    placer = Placer((cv.x0, cv.y1, cv.x1, cv.y0))
    top = max(peaks.values()) if peaks else None
    if bw:
        x_end = top / bw if top else xs.vmax
        x_start = max(xs.vmin, ys.vmin / bw)
        x_end = min(max(x_end, x_start), xs.vmax)
        src = ceilings.get("bandwidth_source") or "?"
        cv.line(
            xs(x_start),
            ys(x_start * bw),
            xs(x_end),
            ys(x_end * bw),
            CEILING,
            2,
            tip=f"memory roof {bw / 1e9:.4g} GB/s ({src})",
        )
        label = f"memory {bw / 1e9:.4g} GB/s · {src}"
        at = (xs(x_start) + 6, ys(x_start * bw) - 8)
        cv.text(*at, label, 11, color=CEILING, cls="roof-label")
        placer.reserve(text_box(*at, label, 11))
    for d, peak in peaks.items():
        x_from = max(xs.vmin, peak / bw) if bw else xs.vmin
        src = (ceilings.get("flops_source") or {}).get(d, "?")
        cv.line(
            xs(x_from),
            ys(peak),
            cv.x1,
            ys(peak),
            CEILING,
            2,
            dash="6 3",
            tip=f"{d} compute roof {si(peak, 'FLOP/s')} ({src})",
        )
        label = f"{d} {si(peak, 'FLOP/s')} · {src}"
        # above its roof, or below it, or further out, where no other roof's label is
        # (two dtypes often share a peak: fp16 and bf16 on every NVIDIA part)
        spots = [(dy, text_box(cv.x1 - 4, ys(peak) + dy, label, 11, "end"))
                 for dy in (-6, 15, -20, 29, -34, 43)]  # fmt: skip
        dy, box = next(((d, b) for d, b in spots if placer.free(b)), spots[0])
        cv.text(cv.x1 - 4, ys(peak) + dy, label, 11, "end", CEILING, cls="roof-label")
        placer.reserve(box)
    if not bw and not peaks:
        cv.text(cv.x0 + 10, cv.y1 + 36, "no ceilings recorded for this run", 12, color="#a00")
    r = _POINT_R
    for _, ai, perf, _ in pts:
        x, y = xs(ai), ys(perf)
        placer.reserve((x - r, y - r, x + r, y + r))
    for n, ai, perf, c in pts:
        pct = c["metrics"].get("pct_roofline")
        extra = f"#{n}: {ai:.3g} FLOP/byte, {si(perf, 'FLOP/s')}" + (
            f", {pct:.1f}% of roofline" if isinstance(pct, int | float) else ""
        )
        x, y = xs(ai), ys(perf)
        cv.circle(x, y, r, colors(c["variant"]), tip(c, extra), hollow=invalid(c))
        cx, cy, dist = placer.place(x, y, str(n), _LABEL_SIZE)
        if dist > Placer.RADII[1]:  # set apart: a leader from the point's edge to the number
            k = (dist - _LABEL_SIZE * 0.6) / dist
            ux, uy = (cx - x) / dist, (cy - y) / dist
            cv.line(x + ux * r, y + uy * r, x + (cx - x) * k, y + (cy - y) * k, "#888", 0.8)
        cv.text(cx, cy + 0.35 * _LABEL_SIZE, str(n), _LABEL_SIZE, "middle", cls="pt")
    cv.legend([(v, colors(v)) for v in sorted({c["variant"] for _, _, _, c in pts})])
    return cv.render("chart roofline")


def _categories(cases: list[dict]) -> list[tuple[tuple, str]]:
    """Distinct (shape, dtype, mode) of the cases in first-seen order, with a short label."""
    dtypes = {c["dtype"] for c in cases}
    modes = {c["mode"] for c in cases}
    out: dict[tuple, str] = {}
    for c in cases:
        key = (c["shape_key"], c["dtype"], c["mode"])
        label = c.get("shape_label") or c["shape_key"]
        if len(dtypes) > 1:
            label += f" {c['dtype']}"
        if len(modes) > 1:
            label += f" {c['mode']}"
        out.setdefault(key, label)
    return list(out.items())


def _bars_frame(cats, series, title, ylabel, values, center=None):
    n_cat, n_ser = max(len(cats), 1), max(len(series), 1)
    width = max(600, min(1400, 140 + n_cat * (22 * n_ser + 18)))
    cv = Canvas(width, 400, title, margin=(56, 20, 110, 120))
    ys = Scale.fit([*values, *([center] if center else [])], cv.y0, cv.y1, pad=0.12)
    cv.axes(None, ys, "", ylabel, "", "s" if center is None else "×")
    band = (cv.x1 - cv.x0) / n_cat
    bar = min(28.0, (band - 12) / n_ser)
    for i, (_, label) in enumerate(cats):
        cx = cv.x0 + band * (i + 0.5)
        short = label if len(label) <= 30 else "…" + label[-29:]
        cv.text(cx, cv.y0 + 14, short, 10, "end", "#333", rotate=-35)
    return cv, ys, band, bar


def latency(cases: list[dict], colors: Colors, title: str) -> str:
    """Median time per shape, one bar per variant, with the interquartile range as a whisker."""
    cats = _categories(cases)
    series = sorted({c["variant"] for c in cases})
    vals = [v for c in cases for v in (median_of(c), *quartiles_of(c)) if v]
    cv, ys, band, bar = _bars_frame(cats, series, title, "median time (lower is better)", vals)
    index = {k: i for i, (k, _) in enumerate(cats)}
    for c in cases:
        t = median_of(c)
        if t is None:
            continue
        i, j = index[(c["shape_key"], c["dtype"], c["mode"])], series.index(c["variant"])
        x = cv.x0 + band * i + (band - bar * len(series)) / 2 + bar * j
        y = ys(t)
        color = colors(c["variant"])
        cv.rect(x + 1, y, bar - 2, cv.y0 - y, color, tip(c), 0.35 if invalid(c) else None)
        q1, q3 = quartiles_of(c)
        if q1 and q3:
            cv.line(x + bar / 2, ys(q3), x + bar / 2, ys(q1), "#111", 1.2)
    cv.legend([(s, colors(s)) for s in series])
    return cv.render("chart latency")


#: Most dots drawn per case in the samples chart; beyond it, evenly spaced order statistics
#: (the minimum and maximum always among them), so the shape of the distribution is kept.
MAX_DOTS = 200
#: Horizontal offsets of the dots within a column: the golden-ratio sequence spreads any
#: number of points evenly and deterministically (the same page for the same run).
_GOLDEN = (math.sqrt(5) - 1) / 2


def shown_samples(samples: list[float]) -> list[float]:
    """The sorted samples a chart draws: all of them, or ``MAX_DOTS`` evenly spaced ranks."""
    vals = sorted(v for v in samples if _pos(v))
    if len(vals) <= MAX_DOTS:
        return vals
    ranks = np.linspace(0, len(vals) - 1, MAX_DOTS).round().astype(int)
    return [vals[i] for i in ranks]


def samples(cases: list[dict], colors: Colors, title: str) -> str:
    """Every raw sample of each case as a dot (a strip plot), over a box from the first to the
    third quartile with the median as a dark line; one column per variant within each shape.
    Invalid cases are drawn pale."""
    cats = _categories(cases)
    series = sorted({c["variant"] for c in cases})
    vals = [v for c in cases for v in c.get("samples") or () if _pos(v)]
    cv, ys, band, bar = _bars_frame(cats, series, title, "time per sample (log)", vals)
    index = {k: i for i, (k, _) in enumerate(cats)}
    for c in cases:
        drawn = shown_samples(c.get("samples") or [])
        if not drawn:
            continue
        i, j = index[(c["shape_key"], c["dtype"], c["mode"])], series.index(c["variant"])
        x = cv.x0 + band * i + (band - bar * len(series)) / 2 + bar * j
        color, pale = colors(c["variant"]), invalid(c)
        all_vals = [v for v in c["samples"] if _pos(v)]
        q1, med, q3 = (float(v) for v in np.quantile(all_vals, [0.25, 0.5, 0.75]))
        shown = "" if len(drawn) == len(all_vals) else f" ({len(drawn)} drawn)"
        extra = (
            f"{len(all_vals)} samples{shown}: min {fmt.seconds(drawn[0])}, "
            f"q1 {fmt.seconds(q1)}, median {fmt.seconds(med)}, q3 {fmt.seconds(q3)}, "
            f"max {fmt.seconds(drawn[-1])}"
        )
        cv.rect(x + 1, ys(q3), bar - 2, ys(q1) - ys(q3), color, tip(c, extra), 0.1 if pale else 0.2)
        cv.line(x + 1, ys(med), x + bar - 1, ys(med), "#111", 1.6)
        inner = max(bar - 6, 1.0)
        for k, v in enumerate(drawn):
            dx = 3 + inner * ((k * _GOLDEN) % 1.0)
            cv.circle(x + dx, ys(v), 1.6, color, opacity=0.2 if pale else 0.6)
    cv.legend([(s, colors(s)) for s in series])
    return cv.render("chart samples")


#: How a speedup bar shows compare's verdict on it (symbol, colour).
VERDICT_MARKS = {
    "faster": ("▲", "#2b8a3e"),
    "slower": ("▼", "#c92a2a"),
    "ambiguous": ("≈", "#666"),
    "unreliable": ("?", "#e67700"),
    "invalid": ("✕", "#c92a2a"),
}


def speedup(rows: list[dict], colors: Colors, title: str, ylabel: str) -> str:
    """Bars from the 1× line: ``rows`` of {case, speedup, lo, hi (optional)}; > 1 is faster."""
    cases = [r["case"] for r in rows]
    cats = _categories(cases)
    series = sorted({c["variant"] for c in cases})
    vals = [v for r in rows for v in (r["speedup"], r.get("lo"), r.get("hi")) if _pos(v)]
    cv, ys, band, bar = _bars_frame(cats, series, title, ylabel, vals, center=1.0)
    one = ys(1.0)
    cv.line(cv.x0, one, cv.x1, one, "#111", 1.5, tip="1× (no change)")
    index = {k: i for i, (k, _) in enumerate(cats)}
    for r in rows:
        c, s = r["case"], _pos(r["speedup"])
        if s is None:
            continue
        i, j = index[(c["shape_key"], c["dtype"], c["mode"])], series.index(c["variant"])
        x = cv.x0 + band * i + (band - bar * len(series)) / 2 + bar * j
        y = ys(s)
        extra = f"speedup {s:.3f}×" + (
            f" ({r['lo']:.3f}–{r['hi']:.3f})" if r.get("lo") and r.get("hi") else ""
        )
        if r.get("verdict"):
            extra += f", {r['verdict']}"
        pale = 0.35 if invalid(c) or r.get("invalid") else None
        cv.rect(
            x + 1, min(y, one), bar - 2, abs(one - y), colors(c["variant"]), tip(c, extra), pale
        )
        if _pos(r.get("lo")) and _pos(r.get("hi")):
            cv.line(x + bar / 2, ys(r["lo"]), x + bar / 2, ys(r["hi"]), "#111", 1.2)
        mark = VERDICT_MARKS.get(r.get("verdict") or "")
        if mark:  # compare's verdict, past the bar's end (and its interval's)
            ends = [ys(v) for v in (r.get("lo"), r.get("hi")) if _pos(v)] + [y]
            up = s >= 1.0
            at = (min(ends) - 4) if up else (max(ends) + 12)
            cv.text(x + bar / 2, at, mark[0], 11, "middle", mark[1], cls=f"verdict {r['verdict']}")
    cv.legend([(s, colors(s)) for s in series])
    if any(r.get("verdict") for r in rows):
        shown = [v for v in VERDICT_MARKS if any(r.get("verdict") == v for r in rows)]
        key = "   ".join(f"{VERDICT_MARKS[v][0]} {v}" for v in shown)
        cv.text(cv.x1, cv.height - 8, f"compare: {key}", 11, "end", "#555", cls="verdict-key")
    return cv.render("chart speedup")


def crossover(study: dict, title: str) -> str:
    """A crossover study (``kernelab.bench.crossover.Study.as_dict()``): B's speedup over A
    against the swept size (log-log), its confidence interval as whiskers, the floors' ratio
    dashed, the 1× line, and each named crossover as a shaded band."""
    pts = [p for p in study.get("points") or [] if _pos(p.get("value"))]
    cv = Canvas(640, 380, title, margin=(56, 24, 60, 80))
    speed = [p.get("speedup") for p in pts]
    floor = [p.get("floor_ratio") for p in pts]
    vals = [v for v in (*speed, *floor, *(p.get("lo") for p in pts), *(p.get("hi") for p in pts))
            if _pos(v)]  # fmt: skip
    xs = Scale.fit([p["value"] for p in pts], cv.x0, cv.x1, pad=0.04)
    ys = Scale.fit([*vals, 1.0], cv.y0, cv.y1, pad=0.12)
    dim = str(study.get("dim", ""))
    cv.axes(xs, ys, dim, f"{study.get('a')} time / {study.get('b')} time", "", "×")
    for c in study.get("crossovers") or []:
        lo, hi = _pos(c.get("low")), _pos(c.get("high"))
        if lo and hi:
            at = f" (at {c['at']})" if c.get("at") is not None else ""
            what = f"crossover: {c.get('from')} → {c.get('to')} between {dim}={lo:g} and {hi:g}"
            cv.rect(xs(lo), cv.y1, xs(hi) - xs(lo), cv.y0 - cv.y1, "#f08c00", what + at, 0.15)
    one = ys(1.0)
    cv.line(cv.x0, one, cv.x1, one, "#111", 1.2, tip="1× (equal)")
    line = [(xs(p["value"]), ys(p["floor_ratio"])) for p in pts if _pos(p.get("floor_ratio"))]
    for (x1, y1), (x2, y2) in itertools.pairwise(line):
        cv.line(x1, y1, x2, y2, CEILING, 2, dash="6 3", tip="ratio of the floors")
    measured = [(p, _pos(p.get("speedup"))) for p in pts]
    done = [(xs(p["value"]), ys(s)) for p, s in measured if s]
    for (x1, y1), (x2, y2) in itertools.pairwise(done):
        cv.line(x1, y1, x2, y2, "#1f6fd1", 1.5)
    for p, s in measured:
        if not s:
            continue
        x = xs(p["value"])
        if _pos(p.get("lo")) and _pos(p.get("hi")):
            cv.line(x, ys(p["lo"]), x, ys(p["hi"]), "#111", 1.2)
        confirmed = p.get("verdict") in ("faster", "slower", "tie")
        extra = f" ({p['lo']:.3g}–{p['hi']:.3g})" if _pos(p.get("lo")) and _pos(p.get("hi")) else ""
        cv.circle(x, ys(s), 4.5, "#1f6fd1", hollow=not confirmed,
                  tip=f"{dim}={p['value']}: {s:.3g}×{extra}, {p.get('verdict')}")  # fmt: skip
    how = "measured" if study.get("how") == "measured" else "floors"
    cv.legend([(f"speedup ({how})", "#1f6fd1"), ("floor ratio (dashed)", CEILING)])
    return cv.render("chart crossover")


def trend(series: list[tuple[dict, list[tuple[int, dict]]]], runs: list[str], colors: Colors,
          title: str) -> str:  # fmt: skip
    """Median time of each case across runs (oldest first, x = the run), one line per case
    in its variant's colour; ``series``: (a case, [(run index, that run's case)]). A point
    flagged invalid is hollow; the run ids label the x axis."""
    cv = Canvas(640, 360, title, margin=(56, 24, 80, 80))
    vals = [median_of(c) for _, pts in series for _, c in pts]
    ys = Scale.fit([v for v in vals if v], cv.y0, cv.y1, pad=0.12)
    cv.axes(None, ys, "", "median time (lower is better)", "", "s")
    n = max(len(runs) - 1, 1)

    def x_of(i: int) -> float:
        return cv.x0 + (cv.x1 - cv.x0) * (0.5 if len(runs) == 1 else i / n)

    for i, run_id in enumerate(runs):
        cv.text(x_of(i), cv.y0 + 16, run_id, 10, "middle", "#444", cls="run-id")
    for case, pts in series:
        color = colors(case["variant"])
        drawn = [(x_of(i), ys(t), c) for i, c in pts if (t := median_of(c))]
        for (x1, y1, _), (x2, y2, _) in itertools.pairwise(drawn):
            cv.line(x1, y1, x2, y2, color, 1.5)
        for x, y, c in drawn:
            cv.circle(x, y, 3.5, color, tip(c), hollow=invalid(c))
    cv.legend([(v, colors(v)) for v in dict.fromkeys(c["variant"] for c, _ in series)])
    return cv.render("chart trend")
