"""The HTML report: self-contained, every name escaped, charts drawn; rendered in chromium."""

import html
import re
import shutil
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

from kernelab import ledger
from kernelab.cli import app
from kernelab.report import charts
from kernelab.report import html as report_html
from kernelab.report.svg import PALETTE, Scale, text_box
from tests.report_fixtures import inspect_cases, provenance, synthetic_cases, verify_cases

runner = CliRunner()
EVIL_OP = "<script>document.body.innerHTML='PWNED'</script>"
EVIL_LABEL = '"><img src=x onerror="document.title=1">'
EVIL_VARIANT = "</title><script>alert(1)</script>"


@pytest.fixture
def db(tmp_path):
    with ledger.open(tmp_path / "l.sqlite") as d:
        yield d


def _evil_run(db):
    cases = synthetic_cases(3, op=EVIL_OP, variants=("kernelab", EVIL_VARIANT, "torch"))
    for c in cases:
        c["shape_label"] = "<b>" + c["shape_label"] + "</b>"
        c["flags"] = ["<i>flag</i>"]
    return db.record_run("bench", cases, provenance(note=EVIL_LABEL), label=EVIL_LABEL)


def test_report_has_roofline_latency_speedup_and_provenance(db, tmp_path):
    base = db.record_run("bench", synthetic_cases(1), provenance(), label="before")
    run = db.record_run("bench", synthetic_cases(2, scale=0.8), provenance(), label="after")
    out = report_html.write(db, ["after"], tmp_path / "r.html", baseline="before")
    page = out.read_text()
    # roofline; rmsnorm: latency, raw samples, speedup over torch, over the run; gemm (one
    # variant): latency, raw samples, speedup over the run
    assert page.count("<svg") == 1 + 4 + 3
    assert 'class="chart roofline"' in page and "chart latency" in page
    assert "speedup over torch" in page and f"speedup over run {base}" in page
    assert run in page and "0123456789ab" in page  # run id and commit in the summary
    # each case drawn: 14 points on the roofline, one per case
    roof = page[page.index('class="chart roofline"') : page.index("</svg>")]
    assert roof.count("<circle") == 14
    # ceilings and where they came from
    assert "4100 GB/s · measured 2026-11-30 (1 GiB device copy)" in page
    assert "bfloat16 720TFLOP/s · measured" in page
    # colours are stable per variant: kernelab first in the palette
    assert f'fill="{PALETTE[0]}"><title>rmsnorm · kernelab' in page


def test_report_is_self_contained(db, tmp_path):
    db.record_run("bench", synthetic_cases(1), provenance())
    page = report_html.write(db, None, tmp_path / "r.html").read_text()
    assert "<script" not in page.lower()
    for needle in ("http:", "https:", "src=", "href=", "<link", "@import", "url("):
        assert needle not in page.lower(), needle
    assert "default-src 'none'" in page


def test_every_name_is_escaped(db, tmp_path):
    _evil_run(db)
    page = report_html.write(db, None, tmp_path / "r.html", title="<u>t</u>").read_text()
    for raw in (EVIL_OP, EVIL_LABEL, EVIL_VARIANT, "<b>rows=", "<i>flag</i>", "<u>t</u>"):
        assert raw not in page, raw
    assert html.escape(EVIL_OP) in page and html.escape(EVIL_LABEL) in page
    assert "<script" not in page.lower() and "<img" not in page.lower()
    # the only tags are the ones the report itself writes
    tags = set(re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)", page))
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table"}
    allowed |= {"tr", "th", "td", "section", "div", "svg", "rect", "line", "circle", "text"}
    allowed |= {"pre"}
    assert tags <= allowed, tags - allowed


def test_datasheet_ceilings_when_the_run_recorded_none(db, tmp_path):
    db.record_run("bench", synthetic_cases(1), provenance(ceilings=None))
    page = report_html.write(db, None, tmp_path / "r.html").read_text()
    assert "datasheet H200 SXM" in page  # from the device's spec entry


def test_measured_ceilings_from_the_ledger_beat_the_datasheet(db):
    rid = db.record_run("bench", synthetic_cases(1), provenance(ceilings=None))
    db.put_ceiling("NVIDIA H200|132|141GB", "copy_bytes_per_s", 3.9e12, "B/s", "1 GiB copy")
    run = db.get_run(rid)
    ceil = report_html.ceilings_of(run, db.ceilings(run["device_key"]))
    assert ceil["bandwidth"] == 3.9e12 and ceil["bandwidth_source"].startswith("measured")
    assert ceil["flops_source"]["bfloat16"] == "datasheet H200 SXM"


def test_invalid_cases_are_drawn_hollow_and_pale(db, tmp_path):
    cases = [c for c in synthetic_cases(1, variants=("kernelab", "torch")) if c["op"] == "rmsnorm"]
    cases[0]["flags"] = ["below-floor: invalid"]
    cases[2]["metrics"]["valid"] = False  # marked by the bench without an "invalid" flag
    db.record_run("bench", cases, provenance())
    page = report_html.write(db, None, tmp_path / "r.html").read_text()
    assert page.count('fill="white" stroke=') == 2  # hollow on the roofline
    assert page.count('fill-opacity="0.35"') == 4  # pale latency bars and speedup bars
    assert page.count('<td class="flag">invalid') == 2


def test_log_scale_ticks_are_readable():
    assert Scale(1e-6, 1e-3, 0, 100).ticks() == [1e-6, 1e-5, 1e-4, 1e-3]
    narrow = Scale(0.9, 1.35, 0, 100).ticks()
    assert len(narrow) >= 3 and all(0.9 <= t <= 1.35 for t in narrow)
    assert Scale(2e-6, 9e-5, 0, 100).ticks()[:3] == pytest.approx([2e-6, 5e-6, 1e-5])


def test_report_command(db, tmp_path):
    db.record_run("bench", synthetic_cases(1), provenance(), label="x")
    db.close()
    out = tmp_path / "sub" / "r.html"
    path = str(tmp_path / "l.sqlite")
    result = runner.invoke(app, ["report", "x", "--out", str(out), "--ledger", path])
    assert result.exit_code == 0, result.output
    assert out.exists() and "<svg" in out.read_text()
    bad = runner.invoke(app, ["report", "nope", "--out", str(out), "--ledger", path])
    assert bad.exit_code == 2 and "error:" in bad.output


def _rows(page: str, table_class: str) -> list[list[str]]:
    """The cells of each body row of the first table of class ``table_class`` (unescaped)."""
    start = page.index(f'<table class="{table_class}">')
    table = page[start : page.index("</table>", start)]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table)[1:]
    return [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in rows]


def _section(page: str, kind: str) -> str:
    start = page.index(f'<section class="run {kind}">')
    return page[start : page.index("</section>", start)]


def test_verify_run_shows_pass_fail_per_op_and_variant(db, tmp_path):
    prov = provenance(verify={"seed": 1234, "trials": 3, "skipped": ["softmax/torch: no fp8"]})
    rid = db.record_run("verify", verify_cases(), prov, label="v")
    page = report_html.write(db, ["v"], tmp_path / "r.html", kind="verify").read_text()
    assert _rows(page, "verify") == [
        ["rmsnorm", "kernelab", "bfloat16", "4 / 4", "0.125", "-"],
        ["rmsnorm", "candidate", "bfloat16", "2 / 4", "nan", "wrong values ×2; NaN mismatch ×1"],
        ["softmax", "kernelab", "float16", "2 / 2", "0.5", "-"],
    ]
    assert '<td class="n flag">2 / 4</td>' in page and '<td class="n">4 / 4</td>' in page
    failing = _rows(page, "failing")
    assert [r[:5] for r in failing] == [
        ["rmsnorm", "candidate", "rows=7", "bfloat16", "wrong values"],
        ["rmsnorm", "candidate", "rows=64", "bfloat16", "NaN mismatch"],
    ]
    assert failing[0][6:] == ["3.25", "wrong values: out: values differ"]
    assert failing[1][5:] == ["NaN mismatch, wrong values", "nan", "NaN mismatch: out: values "
                              "differ (+1 more)"]  # fmt: skip
    assert "failing cases (2)" in page and "seed 1234 · 3 trial(s) per case" in page
    assert "softmax/torch: no fp8" in page
    # the summary at the top: no median times to show, the verdict instead
    summary = page[: page.index("</table>")]
    assert rid in summary and "8 of 10 passed" in summary
    assert "<svg" not in page and "times are medians" not in page


def test_inspect_run_shows_each_kernel_per_op_and_target(db, tmp_path):
    rid = db.record_run("inspect", inspect_cases(), provenance(), label="i")
    page = report_html.write(db, [rid], tmp_path / "r.html").read_text()
    sec = _section(page, "inspect")
    heads = re.findall(r"<h3>(.*?)</h3>", sec)
    assert heads[:3] == ["rmsnorm · sm_90", "rmsnorm · sm_80", "gemm · sm_90"]
    tables = [sec[sec.index(f"<h3>{h}</h3>") :] for h in heads[:3]]
    sm90, sm80, gemm = (_rows(t, "inspect") for t in tables)
    config = "BLOCK=1024 num_warps=4"
    assert sm90 == [
        ["_rmsnorm_kernel", "kernelab", "rows=64 cols=4096", "bfloat16", config, "40", "0",
         "0 B", "100.0%", "-"],
        ["_rmsnorm_kernel", "kernelab", "rows=8 cols=65536", "bfloat16", config, "255", "96",
         "2 KiB", "25.0%", "warn:spills (spills 96 bytes per thread)"],
    ]  # fmt: skip
    assert [r[5:9] for r in sm80] == [["42", "0", "0 B", "75.0%"]]
    assert gemm[0][5:] == ["168", "0", "96 KiB", "12.5%", "info:occupancy (occupancy 12% is "
                           "limited by registers)"]  # fmt: skip
    # spills and warnings are marked, an info finding is not
    assert '<td class="n flag">96</td>' in sec
    assert '<td class="flag">warn:spills' in sec and '<td class="flag">info:' not in sec
    summary = page[: page.index("</table>")]
    assert "4 kernel(s), 1 with warnings or errors, 1 spilling" in summary
    assert "<svg" not in page


def test_each_kind_of_run_gets_its_own_section(db, tmp_path):
    b = db.record_run("bench", synthetic_cases(1), provenance())
    v = db.record_run("verify", verify_cases(), provenance())
    i = db.record_run("inspect", inspect_cases(), provenance())
    page = report_html.write(db, [v, b, i], tmp_path / "r.html").read_text()
    order = [page.index(f'<section class="run {k}">') for k in ("verify", "bench", "inspect")]
    assert order == sorted(order)
    bench, verify, inspect = (_section(page, k) for k in ("bench", "verify", "inspect"))
    assert b in bench and 'class="chart roofline"' in bench and "chart samples" in bench
    assert v in verify and '<table class="verify">' in verify and "failing cases" in verify
    assert i in inspect and '<table class="inspect">' in inspect
    for sec in (verify, inspect):  # no timing charts or case timing tables for them
        assert "<svg" not in sec and "median" not in sec and "<h3>provenance</h3>" in sec
    summary = page[: page.index("</table>")]
    assert "14 timed" in summary and "8 of 10 passed" in summary and "4 kernel(s)" in summary
    # colours follow the timed runs: verify's "candidate" does not take kernelab's colour
    assert f'fill="{PALETTE[0]}"><title>rmsnorm · kernelab' in bench


def test_names_in_the_verify_and_inspect_sections_are_escaped(db, tmp_path):
    v = verify_cases(op=EVIL_OP, variant=EVIL_VARIANT, label_prefix=EVIL_LABEL)
    v[5]["metrics"]["result"]["failures"][0]["message"] = "<b>bad</b>"
    i = inspect_cases(op=EVIL_OP, kernel=EVIL_VARIANT)
    i[1]["flags"] = ["warn:<i>spills</i>"]
    i[1]["metrics"]["report"]["findings"][0]["kind"] = "<i>spills</i>"
    ids = [db.record_run(k, c, provenance()) for k, c in (("verify", v), ("inspect", i))]
    page = report_html.write(db, ids, tmp_path / "r.html").read_text()
    for raw in (EVIL_OP, EVIL_LABEL, EVIL_VARIANT, "<b>bad</b>", "<i>spills</i>"):
        assert raw not in page, raw
    assert f"<h3>{html.escape(EVIL_OP)} · sm_90</h3>" in page  # the inspect heading
    assert f"<td>{html.escape(EVIL_LABEL)}rows=7</td>" in page  # a failing case's shape
    assert f"<td>{html.escape(EVIL_VARIANT)}</td>" in _section(page, "inspect")
    assert "&lt;b&gt;bad&lt;/b&gt;" in page and "warn:&lt;i&gt;spills&lt;/i&gt;" in page
    tags = set(re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)", page))
    allowed = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "table"}
    allowed |= {"tr", "th", "td", "section", "pre", "ul", "li"}
    assert tags <= allowed, tags - allowed


def _crowded_cases():
    """Six variants at nearly the same speed: their points all but coincide on the roofline."""
    variants = ("kernelab", "a", "b", "c", "d", "e")
    other = synthetic_cases(4, op="rms<norm>", variants=("kernelab", "torch"))
    return synthetic_cases(3, variants=variants) + [c for c in other if c["op"] != "gemm"]


def test_roofline_points_are_numbered_without_overlapping_labels(db, tmp_path):
    db.record_run("bench", _crowded_cases(), provenance())
    page = report_html.write(db, None, tmp_path / "r.html").read_text()
    roof = page[page.index('class="chart roofline"') : page.index("</svg>")]
    points = charts.roofline_points(_crowded_cases())
    n = len(points)
    assert n == 6 * 4 + 2 + 2 * 4
    # a marker per point, its tooltip naming its number
    marks = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="5"[^>]*><title>([^<]*)', roof)
    assert len(marks) == n
    assert sorted(int(re.search(r"#(\d+):", t).group(1)) for *_, t in marks) == list(
        range(1, n + 1)
    )
    # a number beside each marker, no two overlapping, none covering a marker
    labels = re.findall(
        r'<text class="pt" x="([\d.]+)" y="([\d.]+)" font-size="(\d+)"[^>]*>(\d+)</text>', roof
    )
    assert sorted(int(t) for *_, t in labels) == list(range(1, n + 1))
    boxes = [text_box(float(x), float(y), t, int(s), "middle") for x, y, s, t in labels]
    assert len({(b[0], b[1]) for b in boxes}) == n

    def overlap(a, b):
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

    for j, a in enumerate(boxes):
        assert not any(overlap(a, b) for b in boxes[j + 1 :]), labels[j]
        for cx, cy, _ in marks:
            assert not overlap(a, (float(cx) - 5, float(cy) - 5, float(cx) + 5, float(cy) + 5))
        assert a[0] >= 0 and a[2] <= 760 and a[1] >= 0 and a[3] <= 420  # inside the chart
    # a legend row per number, under the chart, each naming a different case
    legend = _rows(page, "legend")
    assert [int(r[0]) for r in legend] == list(range(1, n + 1))
    assert len({tuple(r[1:6]) for r in legend}) == n
    for (num, _, _, c), row in zip(points, legend, strict=True):
        assert row[1:4] == [c["op"], c["variant"], c["shape_label"]], num
    assert "rms&lt;norm&gt;" in page and "rms<norm>" not in page


def test_raw_samples_are_drawn_per_case(db, tmp_path):
    cases = [c for c in synthetic_cases(1) if c["op"] == "gemm"]
    rng = np.random.default_rng(0)
    cases[1]["samples"] = (2.5e-4 * rng.lognormal(0, 0.05, size=1000)).tolist()
    cases[1]["metrics"]["n"] = 1000
    db.record_run("bench", cases, provenance())
    page = report_html.write(db, None, tmp_path / "r.html").read_text()
    start = page.index('class="chart samples"')
    chart = page[start : page.index("</svg>", start)]
    dots = re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)" r="1.6"', chart)
    assert len(dots) == 30 + charts.MAX_DOTS  # all of 30 samples, 200 of 1000
    assert "1000 samples (200 drawn)" in chart and "30 samples: min" in chart
    # the largest sample is drawn (order statistics keep the extremes): the highest dot
    big = sorted(cases[1]["samples"])
    assert charts.shown_samples(big)[0] == big[0] and charts.shown_samples(big)[-1] == big[-1]
    assert f"max {report_html.fmt.seconds(big[-1])}" in chart


# --- in a real browser --------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


def _chromium(profile, *args, timeout=90):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    cmd += ["--no-first-run", "--disable-extensions", f"--user-data-dir={profile}"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)


def _rgb(hex_colour):
    return np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])


@needs_chromium
def test_chromium_renders_the_charts(db, tmp_path):
    from PIL import Image

    db.record_run("bench", synthetic_cases(1), provenance(), label="before")
    db.record_run("bench", synthetic_cases(2, scale=0.8), provenance(), label="after")
    page = report_html.write(db, ["after"], tmp_path / "r.html", baseline="before")
    shot = tmp_path / "shot.png"
    res = _chromium(
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1300,1700", page.as_uri()
    )
    assert shot.exists(), res.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape == (1700, 1300, 3)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # not a blank or uniform page

    def pixels(colour, region):
        d = np.abs(img[region] - _rgb(colour)).sum(axis=-1)
        return int((d < 30).sum())

    charts = np.s_[180:1700, :]  # below the summary table: roofline, its legend, latency bars
    assert pixels(PALETTE[0], charts) > 2000  # kernelab bars and points
    assert pixels(PALETTE[1], charts) > 2000  # torch
    assert pixels(PALETTE[2], charts) > 2000  # compile
    header = np.s_[0:60, :]
    assert pixels(PALETTE[0], header) == 0  # colours are where the charts are, not anywhere


@needs_chromium
def test_chromium_runs_no_injected_markup(db, tmp_path):
    _evil_run(db)
    page = report_html.write(db, None, tmp_path / "r.html")
    res = _chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    dom = res.stdout
    assert "<svg" in dom, res.stderr[-2000:]
    assert "PWNED</body>" not in dom and "<script" not in dom.lower()
    assert "<img" not in dom.lower()
    assert "&lt;script&gt;document.body.innerHTML='PWNED'&lt;/script&gt;" in dom


def test_several_runs_each_get_a_section(db, tmp_path):
    a = db.record_run("bench", synthetic_cases(1), provenance(), label="one")
    b = db.record_run("bench", synthetic_cases(2), provenance(), label="two")
    page = report_html.write(db, ["one", b], tmp_path / "r.html").read_text()
    assert page.count('class="chart roofline"') == 2
    assert page.index(f"bench run {a}") < page.index(f"bench run {b}")


@needs_chromium
def test_chromium_renders_a_page_with_every_kind_of_run(db, tmp_path):
    from PIL import Image

    gemm = [c for c in synthetic_cases(1) if c["op"] == "gemm"]
    ids = [
        db.record_run("bench", gemm, provenance()),
        db.record_run("verify", verify_cases(), provenance()),
        db.record_run("inspect", inspect_cases(), provenance()),
    ]
    page = report_html.write(db, ids, tmp_path / "r.html")
    shot = tmp_path / "shot.png"
    res = _chromium(
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1300,3600", page.as_uri()
    )
    assert shot.exists(), res.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # not a blank or uniform page

    def rows_with(colour):
        return np.flatnonzero((np.abs(img - _rgb(colour)).sum(axis=-1) < 60).any(axis=1))

    drawn = rows_with(PALETTE[0])  # kernelab's points, bars and samples
    flagged = rows_with("#aa0000")  # failing verify cases and the spilling kernel, in red
    assert len(drawn) > 150 and len(flagged) > 20
    # the verify and inspect tables come after the bench charts, as the runs were given
    assert np.median(flagged) > np.median(drawn)


def test_speedups_over_a_baseline_are_marked_with_compares_verdict(db, tmp_path):
    from kernelab.ledger.compare import compare_runs

    before = synthetic_cases(1)
    after = synthetic_cases(2, scale=0.8)  # 20 % faster everywhere...
    for c in after:
        if c["variant"] == "torch" and c["shape_key"] == "r1c4096":  # ...but one case, 30 % slower
            c["samples"] = [t * 1.3 / 0.8 for t in c["samples"]]
            c["metrics"]["median_s"] *= 1.3 / 0.8
    db.record_run("bench", before, provenance(), label="before")
    db.record_run("bench", after, provenance(), label="after")
    page = report_html.write(db, ["after"], tmp_path / "r.html", baseline="before").read_text()
    verdicts = [r.verdict for r in compare_runs(db.get_run("before"), db.get_run("after")).cases]
    assert verdicts.count("slower") == 1 and len(set(verdicts)) > 1
    start = page.index(f"speedup over run {db.get_run('before')['id']}")
    marked = page[start:]
    for v in set(verdicts):  # one mark per bar of that verdict, in the charts over the run
        assert marked.count(f'class="verdict {v}"') == verdicts.count(v), v
    keys = re.findall(r'class="verdict-key"[^>]*>([^<]*)<', marked)  # one per chart
    assert keys and all(k.startswith("compare: ") for k in keys)
    assert any("▼ slower" in k for k in keys)
    assert all(any(v in k for k in keys) for v in set(verdicts))
    over_torch = page[page.index("speedup over torch") : start]
    assert 'class="verdict ' not in over_torch  # variants of one run: no compare verdict


def test_runs_of_the_same_cases_get_a_trend_across_them(db, tmp_path):
    ids = [
        db.record_run("bench", synthetic_cases(i, scale=s), provenance(), label=f"r{i}")
        for i, s in enumerate((1.0, 0.9, 0.8))
    ]
    page = report_html.write(db, list(reversed(ids)), tmp_path / "r.html").read_text()
    trend = page[page.index('<section class="trend">') : page.index("</section>")]
    charts_ = trend.split("<svg")[1:]
    assert len(charts_) == 2  # rmsnorm and gemm, one dtype each
    n_cases = len(synthetic_cases(0))
    assert trend.count("<circle") == 3 * n_cases  # every case in every run
    labels = re.findall(r'class="run-id"[^>]*>([0-9a-f]+)<', charts_[0])
    assert labels == ids  # oldest first, whatever order the runs were named in
    one = report_html.write(db, [ids[0]], tmp_path / "one.html").read_text()
    assert 'class="trend"' not in one


def test_roof_labels_of_equal_peaks_do_not_overlap():
    from kernelab.report.svg import _overlap, text_box

    cases = synthetic_cases(1)
    for c in cases[:4]:
        c["dtype"] = "float16"  # two dtypes, one peak: fp16 and bf16 on an H200
    ceil = {"bandwidth": 4.8e12, "bandwidth_source": "datasheet",
            "flops": {"bfloat16": 989e12, "float16": 989e12},
            "flops_source": {"bfloat16": "datasheet", "float16": "datasheet"}}  # fmt: skip
    svg = charts.roofline(cases, ceil, report_html._Colors(["kernelab", "torch"]), "r")
    labels = re.findall(
        r'<text class="roof-label" x="([-\d.]+)" y="([-\d.]+)" font-size="11" '
        r'text-anchor="(\w+)"[^>]*>([^<]*)<',
        svg,
    )
    assert len(labels) == 3, svg[:400]  # memory, bfloat16, float16
    boxes = [text_box(float(x), float(y), html.unescape(t), 11, a) for x, y, a, t in labels]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
