"""Inline SVG charts written by hand: scales, axes, marks. Every text is escaped here.

Only what the report needs: a log or linear scale per axis, tick labels, points, bars,
lines, whiskers, a legend, and ``<title>`` tooltips. Output is a string of SVG markup meant to
be placed inside an HTML page (no XML namespace needed, nothing fetched).
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timezone
from html import escape

#: Colours of series, in order; the report's tests look for the first ones in screenshots.
PALETTE = ("#1f6fd1", "#d9352b", "#1f9e4a", "#f08c00", "#8e44ad", "#00a3a3", "#6d4c41")
CEILING = "#555555"
GRID = "#e3e3e3"


def esc(value) -> str:
    return escape(str(value), quote=True)


def page_head(title: str, css: str, before: str = "", after: str = "") -> list[str]:
    """The opening lines of a self-contained page: a CSP that allows no script or fetch, the
    title, the stylesheet, the heading and a muted line ``{before}generated {now}{after}``
    (both escaped here)."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">",
        f"<title>{esc(title)}</title><style>{css}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="muted">{esc(before)}generated {esc(now)}{esc(after)}</p>',
    ]


def num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


class Scale:
    """Maps data values onto [lo, hi] pixels, linearly or logarithmically."""

    def __init__(self, vmin: float, vmax: float, lo: float, hi: float, log: bool = True):
        if log:
            vmin, vmax = max(vmin, 1e-300), max(vmax, 1e-300)
        if vmax <= vmin:
            vmin, vmax = (vmin / 2, vmin * 2) if log else (vmin - 1, vmin + 1)
        self.vmin, self.vmax, self.lo, self.hi, self.log = vmin, vmax, lo, hi, log

    @classmethod
    def fit(cls, values, lo: float, hi: float, log: bool = True, pad: float = 0.1) -> Scale:
        vals = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
        if not vals:
            vals = [1.0]
        vmin, vmax = min(vals), max(vals)
        if log:
            span = math.log10(vmax) - math.log10(vmin) if vmax > vmin else 1.0
            f = 10 ** (span * pad) if span else 2.0
            return cls(vmin / f, vmax * f, lo, hi, True)
        span = (vmax - vmin) or abs(vmax) or 1.0
        return cls(min(0.0, vmin - span * pad), vmax + span * pad, lo, hi, False)

    def __call__(self, v: float) -> float:
        if self.log:
            v = max(v, self.vmin * 1e-3)
            t = (math.log10(v) - math.log10(self.vmin)) / (
                math.log10(self.vmax) - math.log10(self.vmin)
            )
        else:
            t = (v - self.vmin) / (self.vmax - self.vmin)
        return self.lo + t * (self.hi - self.lo)

    def ticks(self, max_ticks: int = 8) -> list[float]:
        if self.log:
            a, b = math.floor(math.log10(self.vmin)), math.ceil(math.log10(self.vmax))
            step = max(1, math.ceil((b - a) / max_ticks))
            out = [10.0**e for e in range(a, b + 1, step)]
            inside = [t for t in out if self.vmin <= t <= self.vmax]
            if len(inside) < 3:  # a narrow range: 1-2-5 steps, else evenly spaced values
                out = sorted(m * 10.0**e for e in range(a, b + 1) for m in (1, 2, 5))
                if len([t for t in out if self.vmin <= t <= self.vmax]) < 3:
                    out = _linear_ticks(self.vmin, self.vmax, 6)
        else:
            out = _linear_ticks(self.vmin, self.vmax, max_ticks)
        return [t for t in out if self.vmin <= t <= self.vmax]


def _linear_ticks(vmin: float, vmax: float, max_ticks: int) -> list[float]:
    raw = (vmax - vmin) / max_ticks
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(vmin / step)
    return [round(k * step, 12) for k in range(first, int(vmax / step) + 1)]


def si(v: float, unit: str = "") -> str:
    """1.5k, 20M, 3G ... for tick labels."""
    if v == 0:
        return f"0{unit}"
    for suffix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}{unit}"
    for suffix, scale in (("", 1.0), ("m", 1e-3), ("µ", 1e-6), ("n", 1e-9), ("p", 1e-12)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}{unit}"
    return f"{v:g}{unit}"


class Canvas:
    """An SVG element under construction, with a plot area inside margins."""

    def __init__(self, width: int, height: int, title: str, margin=(56, 20, 60, 80)):
        self.width, self.height = width, height
        self.top, self.right, self.bottom, self.left = margin
        self.parts: list[str] = []
        self.title = title

    @property
    def x0(self) -> float:
        return self.left

    @property
    def x1(self) -> float:
        return self.width - self.right

    @property
    def y0(self) -> float:  # bottom of the plot area (SVG y grows downwards)
        return self.height - self.bottom

    @property
    def y1(self) -> float:
        return self.top

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def text(
        self, x, y, s, size=12, anchor="start", color="#222", rotate=None, weight=None, cls=None
    ):
        tr = f' transform="rotate({rotate} {num(x)} {num(y)})"' if rotate else ""
        w = f' font-weight="{weight}"' if weight else ""
        c = f' class="{esc(cls)}"' if cls else ""
        self.add(
            f'<text{c} x="{num(x)}" y="{num(y)}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{color}"{w}{tr}>{esc(s)}</text>'
        )

    def line(self, x1, y1, x2, y2, color=CEILING, width=1.0, dash=None, tip=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        body = f"<title>{esc(tip)}</title>" if tip else ""
        self.add(
            f'<line x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" '
            f'stroke="{color}" stroke-width="{width}"{d}>{body}</line>'
        )

    def rect(self, x, y, w, h, color, tip=None, opacity=None):
        o = f' fill-opacity="{opacity}"' if opacity is not None else ""
        body = f"<title>{esc(tip)}</title>" if tip else ""
        self.add(
            f'<rect x="{num(x)}" y="{num(y)}" width="{num(max(w, 0.5))}" '
            f'height="{num(max(h, 0.5))}" fill="{color}"{o}>{body}</rect>'
        )

    def circle(self, x, y, r, color, tip=None, hollow=False, opacity=None):
        body = f"<title>{esc(tip)}</title>" if tip else ""
        fill = f'fill="white" stroke="{color}" stroke-width="2"' if hollow else f'fill="{color}"'
        o = f' fill-opacity="{opacity}"' if opacity is not None else ""
        self.add(f'<circle cx="{num(x)}" cy="{num(y)}" r="{num(r)}" {fill}{o}>{body}</circle>')

    def axes(self, xs: Scale | None, ys: Scale, xlabel: str, ylabel: str, xunit="", yunit=""):
        """Frame, grid, ticks and axis titles (``xs=None``: categorical x, no x ticks)."""
        for t in ys.ticks():
            y = ys(t)
            self.line(self.x0, y, self.x1, y, GRID)
            self.text(self.x0 - 6, y + 4, si(t, yunit), 11, "end", "#444")
        if xs is not None:
            for t in xs.ticks():
                x = xs(t)
                self.line(x, self.y0, x, self.y1, GRID)
                self.text(x, self.y0 + 16, si(t, xunit), 11, "middle", "#444")
        self.add(
            f'<rect x="{num(self.x0)}" y="{num(self.y1)}" width="{num(self.x1 - self.x0)}" '
            f'height="{num(self.y0 - self.y1)}" fill="none" stroke="#999"/>'
        )
        self.text((self.x0 + self.x1) / 2, self.height - 8, xlabel, 12, "middle")
        self.text(16, (self.y0 + self.y1) / 2, ylabel, 12, "middle", rotate=-90)
        self.text(self.x0, 22, self.title, 14, "start", weight="bold")

    def legend(self, items: list[tuple[str, str]], y: float = 40):
        """One row of swatches under the title."""
        x = self.x0
        for label, color in items:
            self.rect(x, y - 10, 12, 12, color)
            self.text(x + 16, y, label[:24], 11)
            x += 30 + 7 * min(len(label), 24)

    def render(self, cls: str = "chart") -> str:
        return (
            f'<svg class="{esc(cls)}" width="{self.width}" height="{self.height}" '
            f'viewBox="0 0 {self.width} {self.height}" role="img" aria-label="{esc(self.title)}">'
            + "".join(self.parts)
            + "</svg>"
        )


Box = tuple[float, float, float, float]  # left, top, right, bottom in pixels


def text_box(x: float, y: float, s: str, size: float, anchor: str = "start") -> Box:
    """The box a text drawn at baseline ``(x, y)`` roughly covers (glyphs ~0.6 em wide)."""
    w = 0.6 * size * len(str(s))
    left = x - {"start": 0.0, "middle": w / 2, "end": w}[anchor]
    return (left, y - 0.8 * size, left + w, y + 0.25 * size)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


class Placer:
    """Finds spots for short labels beside points so that no label covers another label, a
    point, or any box reserved before: the first free spot on rings of growing radius around
    the point, starting up and to the right. Reserved boxes are kept in a coarse grid, so
    placing n labels costs about n × spots tried, not n²."""

    RADII = (10, 16, 24, 34, 46, 60, 76, 94, 114, 136)
    ANGLES = tuple(-math.pi / 4 + k * math.pi / 8 for k in range(16))
    GAP = 1.0  # pixels kept free around every label

    def __init__(self, bounds: Box, cell: float = 40.0):
        self.bounds, self.cell = bounds, cell
        self._grid: dict[tuple[int, int], list[Box]] = defaultdict(list)

    def _cells(self, box: Box):
        c = self.cell
        for i in range(math.floor(box[0] / c), math.floor(box[2] / c) + 1):
            for j in range(math.floor(box[1] / c), math.floor(box[3] / c) + 1):
                yield i, j

    def reserve(self, box: Box) -> None:
        for cell in self._cells(box):
            self._grid[cell].append(box)

    def free(self, box: Box) -> bool:
        b = self.bounds
        if box[0] < b[0] or box[1] < b[1] or box[2] > b[2] or box[3] > b[3]:
            return False
        g = self.GAP
        padded = (box[0] - g, box[1] - g, box[2] + g, box[3] + g)
        return not any(_overlap(padded, o) for c in self._cells(padded) for o in self._grid[c])

    def place(self, x: float, y: float, label: str, size: float) -> tuple[float, float, float]:
        """A centre ``(cx, cy)`` for ``label`` near ``(x, y)`` and its distance from the point,
        reserved from now on. When every spot tried is taken, the one farthest from the point
        that stays inside the bounds (labels may then overlap: the chart is saturated)."""
        w, h = 0.6 * size * len(label), 1.05 * size
        last = None
        for r in self.RADII:
            for a in self.ANGLES:
                cx, cy = x + r * math.cos(a), y + r * math.sin(a)
                box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
                if self.free(box):
                    self.reserve(box)
                    return cx, cy, r
                b = self.bounds
                if b[0] <= box[0] and box[2] <= b[2] and b[1] <= box[1] and box[3] <= b[3]:
                    last = (cx, cy, r, box)
        cx, cy, r, box = last or (x, y, 0.0, (x - w / 2, y - h / 2, x + w / 2, y + h / 2))
        self.reserve(box)
        return cx, cy, r
