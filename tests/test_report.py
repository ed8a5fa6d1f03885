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
from kernelab.report import html as report_html
from kernelab.report.svg import PALETTE, Scale
from tests.report_fixtures import provenance, synthetic_cases

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
    # roofline; rmsnorm: latency, speedup over torch, over the run; gemm (one variant): 2
    assert page.count("<svg") == 1 + 3 + 2
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
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1300,1100", page.as_uri()
    )
    assert shot.exists(), res.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape == (1100, 1300, 3)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # not a blank or uniform page

    def pixels(colour, region):
        d = np.abs(img[region] - _rgb(colour)).sum(axis=-1)
        return int((d < 30).sum())

    charts = np.s_[180:1100, :]  # below the summary table: the roofline, then latency bars
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
