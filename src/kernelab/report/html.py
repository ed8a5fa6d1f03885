"""The self-contained HTML report: one file, inline CSS and SVG, no scripts, nothing fetched.

Every string that comes from a run (names, labels, provenance) is escaped; a Content Security
Policy forbids scripts and network access as a second guard.
"""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from kernelab.report import charts, fmt, sections
from kernelab.report.svg import PALETTE, esc, page_head, si

#: Names of measured ceilings in the ledger (written by ``kernelab ceilings``).
_COPY = "copy_bytes_per_s"
_MATMUL = "matmul_flops_"
#: Kinds of runs drawn by :mod:`kernelab.report.sections` (no times, no colours per variant).
_UNTIMED = ("verify", "inspect")
_SPEC_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;
background:#fff;max-width:1500px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 6px;border-bottom:1px solid
#ccc;padding-bottom:4px}h3{font-size:16px;margin:20px 0 4px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left}td.n{text-align:right;
font-variant-numeric:tabular-nums}th{background:#f3f3f3}
.muted{color:#666;font-size:13px}.flag{color:#a00}.charts{display:flex;flex-wrap:wrap;gap:12px}
svg.chart{background:#fff;border:1px solid #ddd;font-family:system-ui,sans-serif}
pre{background:#f7f7f7;border:1px solid #e3e3e3;padding:8px;font-size:11px;overflow:auto;
max-height:420px;white-space:pre-wrap}
"""


def _pos(v) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) and v > 0 else None


def ceilings_of(run: dict, stored: dict | None = None) -> dict:
    """The ceilings a run was judged against: as the run recorded them, else the ledger's
    measured ceilings for its device, else the datasheet of its device; each with a source."""
    prov = run.get("provenance") or {}
    rec = (prov.get("bench") or {}).get("ceilings") if isinstance(prov, dict) else None
    rec = rec or (prov.get("ceilings") if isinstance(prov, dict) else None)
    if isinstance(rec, dict) and ("bandwidth_bytes_per_s" in rec or "flops" in rec):
        return {
            "bandwidth": rec.get("bandwidth_bytes_per_s"),
            "bandwidth_source": rec.get("bandwidth_source") or "recorded with the run",
            "flops": dict(rec.get("flops") or {}),
            "flops_source": dict(rec.get("flops_source") or {}),
        }
    out: dict = {"bandwidth": None, "bandwidth_source": None, "flops": {}, "flops_source": {}}
    for name, row in (stored or {}).items():
        src = f"measured {str(row.get('measured', ''))[:10]}"
        if name == _COPY:
            out["bandwidth"], out["bandwidth_source"] = row["value"], src
        elif name.startswith(_MATMUL):
            dt = name.removeprefix(_MATMUL)
            out["flops"][dt], out["flops_source"][dt] = row["value"], src
    device = prov.get("device") if isinstance(prov, dict) else None
    spec_name = device.get("spec") if isinstance(device, dict) else None
    if spec_name:
        from kernelab.hardware import lookup

        spec = lookup(spec_name)
        if spec is not None:
            src = f"datasheet {spec.name}"
            if out["bandwidth"] is None:
                out["bandwidth"], out["bandwidth_source"] = spec.hbm_bytes_per_s, src
            for dt, short in _SPEC_DTYPES.items():
                peak = spec.peak_for(short)
                if peak and dt not in out["flops"]:
                    out["flops"][dt], out["flops_source"][dt] = peak, src
    return out


class _Colors:
    def __init__(self, names):
        self.map = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}

    def __call__(self, name: str) -> str:
        return self.map.get(name, "#777777")


def _variant_order(runs: list[dict], baseline_variant: str) -> list[str]:
    """Our kernels first, then the baseline, then the rest: stable colours across charts."""
    names = sorted({c["variant"] for r in runs for c in r["cases"]})
    first = [n for n in names if n.startswith("kernelab") or n.startswith("candidate")]
    base = [n for n in names if n == baseline_variant and n not in first]
    return first + base + [n for n in names if n not in first and n not in base]


def _run_title(run: dict) -> str:
    label = f" “{run['label']}”" if run.get("label") else ""
    return f"{run['kind']} run {run['id']}{label}"


def _outcome(run: dict) -> str:
    """A few words on what a run found, whatever its kind."""
    if run["kind"] == "verify":
        return sections.verify_outcome(run)
    if run["kind"] == "inspect":
        return sections.inspect_outcome(run)
    timed = sum(charts.median_of(c) is not None for c in run["cases"])
    bad = sum(charts.invalid(c) for c in run["cases"])
    return f"{timed} timed" + (f", {bad} invalid" if bad else "")


def _summary_table(runs: list[dict], baseline: dict | None) -> str:
    rows = []
    for r in ([baseline] if baseline else []) + runs:
        prov = r.get("provenance") or {}
        git = prov.get("git") or {}
        commit = (git.get("commit") or "-")[:12] + (" (dirty)" if git.get("dirty") else "")
        role = "baseline" if r is baseline else "run"
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{esc(v)}</td>"
                for v in (
                    role,
                    r["id"],
                    r.get("label") or "-",
                    r["kind"],
                    r["created"][:19].replace("T", " "),
                    r.get("device") or "-",
                    commit,
                    len(r["cases"]),
                    _outcome(r),
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("", "id", "label", "kind", "created (UTC)", "device", "commit", "cases", "result")
    )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _identity(c: dict) -> list[tuple[str, str]]:
    """The cells that name a case: op, variant, shape, dtype, mode."""
    return [(c["op"], ""), (c["variant"], ""), (c.get("shape_label") or c["shape_key"], ""),
            (c["dtype"], ""), (c["mode"], "")]  # fmt: skip


def _case_table(cases: list[dict]) -> str:
    cols = (
        "op", "variant", "shape", "dtype", "mode", "median", "q1–q3", "n", "GB/s", "TFLOP/s",
        "% roofline", "bound", "ceiling", "flags",
    )  # fmt: skip
    body = []
    for c in cases:
        m = c["metrics"]
        q1, q3 = charts.quartiles_of(c)
        cells = [
            *_identity(c),
            (fmt.seconds(charts.median_of(c)), "n"),
            (f"{fmt.seconds(q1)} – {fmt.seconds(q3)}" if q1 and q3 else "-", "n"),
            (m.get("n", c.get("n_samples", "-")), "n"),
            (fmt.number(m.get("gbps")), "n"),
            (fmt.number(m.get("tflops")), "n"),
            (fmt.percent(m.get("pct_roofline")), "n"),
            (m.get("bound") or "-", ""),
            (m.get("ceiling_source") or "-", ""),
            (
                "; ".join((["invalid"] if charts.invalid(c) else []) + list(c.get("flags") or [])),
                "flag",
            ),
        ]
        body.append(
            "<tr>"
            + "".join(
                f'<td class="{k}">{esc(v)}</td>' if k else f"<td>{esc(v)}</td>" for v, k in cells
            )
            + "</tr>"
        )
    head = "".join(f"<th>{esc(h)}</th>" for h in cols)
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _variant_speedups(cases: list[dict], baseline_variant: str) -> list[dict]:
    base = {
        (c["shape_key"], c["dtype"], c["mode"]): c
        for c in cases
        if c["variant"] == baseline_variant
    }
    rows = []
    for c in cases:
        b = base.get((c["shape_key"], c["dtype"], c["mode"]))
        tb, t = (charts.median_of(b) if b else None), charts.median_of(c)
        if c["variant"] != baseline_variant and tb and t:
            rows.append({"case": c, "speedup": tb / t, "invalid": charts.invalid(b)})
    return rows


def _run_speedups(baseline: dict, run: dict) -> list[dict]:
    """Per-case speedups of ``run`` over ``baseline`` with their bootstrap intervals."""
    from kernelab.ledger.compare import case_key, compare_runs

    result = compare_runs(baseline, run)
    by_key = {case_key(c): c for c in run["cases"]}
    rows = []
    for r in result.cases:
        key = (r.op, r.variant, r.shape_key, r.dtype, r.device, r.mode)
        if key in by_key and r.ratio:
            rows.append(
                {
                    "case": by_key[key],
                    "speedup": 1 / r.ratio,
                    "lo": 1 / r.ci_high if r.ci_high else None,
                    "hi": 1 / r.ci_low if r.ci_low else None,
                    "verdict": r.verdict,
                    "invalid": r.verdict == "invalid",
                }
            )
    return rows


def _op_charts(name, cases, colors, baseline_variant, baseline, speedups) -> list[str]:
    """Latency, raw-sample and speedup charts of one op's cases (one dtype)."""
    out = [charts.latency(cases, colors, f"{name}: latency per shape")]
    if any(c.get("samples") for c in cases):
        out.append(charts.samples(cases, colors, f"{name}: raw samples per shape"))
    vs = _variant_speedups(cases, baseline_variant)
    if vs:
        title = f"{name}: speedup over {baseline_variant}"
        out.append(charts.speedup(vs, colors, title, f"{baseline_variant} time / variant time"))
    if baseline is not None:
        mine = {id(c) for c in cases}
        rs = [r for r in speedups if id(r["case"]) in mine]
        if rs:
            title = f"{name}: speedup over run {baseline['id']}"
            out.append(charts.speedup(rs, colors, title, "baseline time / this run's time"))
    return out


def _sweep_of(run: dict) -> dict | None:
    """The crossover study a ``bench --sweep`` run stored with its configuration, if any."""
    bench = (run.get("provenance") or {}).get("bench") or {}
    sweep = (bench.get("config") or {}).get("sweep") if isinstance(bench, dict) else None
    return sweep if isinstance(sweep, dict) and isinstance(sweep.get("points"), list) else None


def _number(v) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _study_section(study: dict) -> str:
    """A crossover study: its chart, its sentence and its points, every string escaped."""
    title = f"crossover over {study.get('dim')}: {study.get('b')} vs {study.get('a')}"
    rows = []
    for p in study["points"]:
        if not isinstance(p, dict):
            continue
        cells = [
            esc(p.get("value")),
            fmt.seconds(p.get("a_s")),
            fmt.seconds(p.get("b_s")),
            fmt.ratio(_number(p.get("speedup"))),
            fmt.ratio(_number(p.get("floor_ratio"))),
            esc(p.get("verdict")),
        ]
        rows.append("<tr>" + "".join(f'<td class="n">{c}</td>' for c in cells) + "</tr>")
    head = "".join(
        f"<th>{esc(h)}</th>"
        for h in (study.get("dim"), study.get("a"), study.get("b"), "speedup", "floor ratio",
                  "verdict")
    )  # fmt: skip
    return (
        f"<h3>{esc(title)}</h3>"
        f'<p class="muted">{esc(study.get("summary") or "")} · {esc(study.get("how"))} on '
        f"{esc(study.get('device'))} · base shape {esc(study.get('base'))}</p>"
        f'<div class="charts">{charts.crossover(study, title)}</div>'
        f"<table><tr>{head}</tr>{''.join(rows)}</table>"
    )


def render_study(study: dict, title: str = "kernelab crossover") -> str:
    """A page for one crossover study (``bench --sweep ... --html FILE``)."""
    notes = "".join(f"<li>{esc(n)}</li>" for n in study.get("notes") or [])
    return "\n".join(
        [
            *page_head(title, _CSS),
            _study_section(study),
            f"<ul>{notes}</ul>",
            "</body></html>",
        ]
    )


def _roofline_legend(points, colors) -> str:
    """The numbers on a roofline's points, one row each: what case the number stands for."""
    head = "".join(
        f"<th>{h}</th>"
        for h in ("#", "op", "variant", "shape", "dtype", "mode", "FLOP/byte", "FLOP/s",
                  "% roofline")
    )  # fmt: skip
    rows = []
    for n, ai, perf, c in points:
        cells = [
            *_identity(c),
            (fmt.number(ai) if ai < 1000 else si(ai), "n"),
            (si(perf, "FLOP/s"), "n"),
            (fmt.percent(_number(c["metrics"].get("pct_roofline"))), "n"),
        ]
        rows.append(
            f'<tr class="pt"><td class="n" style="border-left:6px solid {colors(c["variant"])}">'
            f"{n}</td>"
            + "".join(
                f'<td class="{k}">{esc(v)}</td>' if k else f"<td>{esc(v)}</td>" for v, k in cells
            )
            + "</tr>"
        )
    return f'<table class="legend"><tr>{head}</tr>{"".join(rows)}</table>'


def _trend_section(runs: list[dict], colors) -> str:
    """With two or more timed runs: each case's median across them (oldest first), a chart
    per op and dtype, the cases measured in at least two of the runs."""
    if len(runs) < 2:
        return ""
    from kernelab.ledger.compare import case_key

    ordered = sorted(runs, key=lambda r: (r.get("created") or "", r.get("seq") or 0))
    by_key: dict[tuple, list[tuple[int, dict]]] = {}
    for i, run in enumerate(ordered):
        for c in run["cases"]:
            by_key.setdefault(case_key(c), []).append((i, c))
    lasting = [(pts[-1][1], pts) for pts in by_key.values() if len(pts) >= 2]
    if not lasting:
        return ""
    ids = [r["id"] for r in ordered]
    out = ['<section class="trend"><h2>across runs</h2>',
           f'<p class="muted">each case measured in two runs or more, oldest run first: '
           f"{esc(' → '.join(ids))}</p>", '<div class="charts">']  # fmt: skip
    groups: dict[tuple, list] = {}
    for case, pts in lasting:
        groups.setdefault((case["op"], case["dtype"]), []).append((case, pts))
    for (op, dtype), series in groups.items():
        out.append(charts.trend(series, ids, colors, f"{op} · {dtype}: median across runs"))
    out.append("</div></section>")
    return "\n".join(out)


def _bench_body(run, ceil, colors, baseline_variant, baseline) -> str:
    """A bench run: the roofline with its legend, then per op its charts and cases."""
    points = charts.roofline_points(run["cases"])
    out = ['<div class="charts">']
    out.append(charts.roofline(run["cases"], ceil, colors, f"roofline · {run['id']}"))
    out.append("</div>")
    if points:
        out.append(_roofline_legend(points, colors))
    unplaced = len(run["cases"]) - len(points)
    if points and unplaced:
        out.append(
            f'<p class="muted">{unplaced} case(s) not on the roofline: FLOPs, bytes or a time '
            "missing</p>"
        )
    sweep = _sweep_of(run)
    if sweep is not None:
        out.append(_study_section(sweep))
    speedups = _run_speedups(baseline, run) if baseline is not None else []
    for op in dict.fromkeys(c["op"] for c in run["cases"]):
        cases = [c for c in run["cases"] if c["op"] == op]
        out.append(f"<h3>{esc(op)}</h3>")
        dtypes = list(dict.fromkeys(c["dtype"] for c in cases))
        for dtype in dtypes:
            group = [c for c in cases if c["dtype"] == dtype]
            name = f"{op} · {dtype}" if len(dtypes) > 1 else op
            out.append('<div class="charts">')
            out.extend(_op_charts(name, group, colors, baseline_variant, baseline, speedups))
            out.append("</div>")
        out.append(_case_table(cases))
    return "\n".join(out)


def render(
    runs: list[dict],
    baseline: dict | None = None,
    stored_ceilings: dict[str, dict] | None = None,
    baseline_variant: str = "torch",
    title: str = "kernelab report",
) -> str:
    """The report page for ``runs`` (as :meth:`Ledger.get_run` returns them).

    Each run gets a section by its kind: "verify" runs their pass/fail tables and failing
    cases, "inspect" runs their registers, spills, shared memory, occupancy and findings per
    op and target, and any other kind (bench) its roofline and timing charts.
    ``baseline``: a run to draw per-case speedups against; ``stored_ceilings``: the ledger's
    measured ceilings by device key, used when a run did not record its own.
    """
    if not runs:
        raise ValueError("runs: expected at least one run to report")
    timed = [r for r in runs + ([baseline] if baseline else []) if r["kind"] not in _UNTIMED]
    colors = _Colors(_variant_order(timed, baseline_variant))
    timed_note = (
        " · times are medians of raw samples; hollow points and pale bars are times flagged invalid"
        if any(r["kind"] not in _UNTIMED for r in runs)
        else ""
    )
    out = [
        *page_head(title, _CSS, after=timed_note),
        _summary_table(runs, baseline),
        _trend_section([r for r in runs if r["kind"] not in _UNTIMED], colors),
    ]
    for run in runs:
        kind = run["kind"]
        out.append(f'<section class="run {esc(kind)}">')
        out.append(f"<h2>{esc(_run_title(run))} · {esc(run.get('device') or '')}</h2>")
        if kind == "verify":
            out.append(sections.verify(run))
        elif kind == "inspect":
            out.append(sections.inspect(run))
        else:
            ceil = ceilings_of(run, (stored_ceilings or {}).get(run.get("device_key") or ""))
            out.append(_bench_body(run, ceil, colors, baseline_variant, baseline))
        prov = orjson.dumps(run.get("provenance") or {}, option=orjson.OPT_INDENT_2, default=str)
        out.append(f"<h3>provenance</h3><pre>{esc(prov.decode())}</pre></section>")
    if baseline is not None:
        prov = orjson.dumps(
            baseline.get("provenance") or {}, option=orjson.OPT_INDENT_2, default=str
        )
        out.append(
            f"<section><h2>baseline {esc(_run_title(baseline))}: provenance</h2>"
            f"<pre>{esc(prov.decode())}</pre></section>"
        )
    out.append("</body></html>")
    return "\n".join(out)


def write(
    db,
    refs: list[str] | None,
    out: str | Path,
    baseline: str | None = None,
    kind: str = "bench",
    baseline_variant: str = "torch",
    title: str = "kernelab report",
) -> Path:
    """Render the runs ``refs`` (default: the latest) of ledger ``db`` into the file ``out``."""
    ids = [db.resolve(r, kind=kind) for r in (refs or ["latest"])]
    runs = [db.get_run(i) for i in ids]
    base = db.get_run(db.resolve(baseline, kind=kind, before=ids[0])) if baseline else None
    stored = {r["device_key"]: db.ceilings(r["device_key"]) for r in runs if r.get("device_key")}
    html = render(runs, base, stored, baseline_variant, title)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path
