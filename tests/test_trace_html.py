"""``kernelab trace summary TRACE --html FILE``: the self-contained page with the memory
timeline (peak marked) and the summary's tables; names escaped; bad paths refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelab.cli import app
from kernelab.report import trace_page
from tests.kineto_builder import TraceBuilder
from tests.test_trace_memory import DATA, MiB, planted

runner = CliRunner()


def _page(tmp_path, trace, *extra) -> tuple[str, object]:
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["trace", "summary", str(trace), "--html", str(out), *extra])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8"), result


def _points(page: str, cls: str) -> list[tuple[float, float]]:
    (pts,) = re.findall(rf'<polyline class="{cls}" points="([^"]+)"', page)
    return [tuple(float(v) for v in p.split(",")) for p in pts.split()]


def _peak(page: str) -> tuple[float, float]:
    (cx, cy) = re.findall(r'<circle class="peak" cx="([\d.]+)" cy="([\d.]+)"', page)[0]
    return float(cx), float(cy)


def test_the_timeline_of_a_planted_gpu_trace_marks_the_exact_peak(tmp_path):
    page, result = _page(tmp_path, planted().write(tmp_path / "m.json"))
    assert "HTML report:" in result.output
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert "default-src 'none'" in page  # nothing fetched, nothing run
    assert page.count('<svg class="chart"') == 2  # cuda:0 and cpu
    cuda = page[page.index("<h3>memory cuda:0</h3>") : page.index("<h2>GPU time")]
    alloc, res = _points(cuda, "allocated"), _points(cuda, "reserved")
    # a step line through the 5 timeline points: 4, 20, 4, 6, 4 MiB (2 n - 1 vertices)
    assert len(alloc) == 9 and len(res) == 9
    levels = [y for _, y in alloc[::2]]
    assert levels[1] == min(levels)  # 20 MiB is the highest point (SVG y grows down)
    assert levels[0] == levels[2] == levels[4] and levels[0] > levels[3] > levels[1]
    assert min(y for _, y in res) < min(levels)  # 32 MiB reserved above 20 allocated
    px, py = _peak(cuda)
    assert (px, py) == alloc[2]  # the marker sits on the line's peak vertex
    assert "peak allocated 20 MiB at 20 µs" in cuda
    assert "peak reserved 32 MiB" in cuda and "at the peak 12 MiB" in cuda
    # the tables: live at the peak and never freed, by op
    assert re.search(r"aten::matmul</td><td class=\"n\">1</td><td class=\"n\">16 MiB", cuda)
    assert "never freed in the window: 1 allocations, 4 MiB" in cuda
    cpu = page[page.index("<h3>memory cpu</h3>") : page.index("<h3>memory cuda:0</h3>")]
    assert 'class="reserved"' not in cpu and "no reserved totals" in cpu
    # and the summary's other tables
    assert "<h2>GPU time by device (share of the span)</h2>" in page
    assert "<h2>top kernels (normalised names)</h2>" in page


def test_the_recorded_cpu_trace(tmp_path):
    page, _ = _page(tmp_path, DATA)
    m = json.loads(runner.invoke(app, ["trace", "summary", str(DATA), "--json"]).output)
    (mem,) = m["memory"]
    alloc = _points(page, "allocated")
    assert len(alloc) == 2 * len(mem["timeline"]) - 1
    assert _peak(page)[1] == pytest.approx(min(y for _, y in alloc), abs=0.01)
    assert "<h2>CPU ops by self time</h2>" in page and "aten::mm" in page
    assert "the trace has no GPU activity" in page  # the verdicts


def test_no_timeline_without_memory_events(tmp_path):
    b = TraceBuilder()
    b.launch("gemm_kernel", 0, 5, 10, 5)
    page, _ = _page(tmp_path, b.write(tmp_path / "n.json"))
    assert "<svg" not in page and "<h2>memory</h2>" not in page
    assert "gemm_kernel" in page


def test_names_from_the_trace_are_escaped(tmp_path):
    evil = "<script>alert(1)</script>"
    b = planted()
    b.launch(f"{evil}_kernel", 300, 5, 310, 5)
    b.cpu_op(f"aten::{evil}", 400, 20)
    b.mem(405, 0x7000, MiB, reserved=32 * MiB)  # alive at the end, owned by the evil op
    page, _ = _page(tmp_path, b.write(tmp_path / "e.json"))
    assert "<script" not in page
    # top kernels: the normalised name and, under it, the full one
    assert "&lt;...&gt;_kernel" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;_kernel" in page
    assert "aten::&lt;script&gt;alert(1)&lt;/script&gt;" in page  # never freed, by op


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("out.json", "expected a file name ending in .html"),
        (".html", "expected a file name ending in .html"),
        ("missing/out.html", "does not exist"),
        ("folder.html", "is a folder"),
    ],
)
def test_a_bad_path_is_refused_before_the_analysis(tmp_path, name, message):
    (tmp_path / "folder.html").mkdir()
    out = tmp_path / name
    result = runner.invoke(app, ["trace", "summary", str(tmp_path / "no.json"), "--html", str(out)])
    assert result.exit_code == 2
    assert result.output.startswith("error: html: ")
    assert message in result.output
    assert "no.json" not in result.output  # the trace was never read
    assert not Path(out).is_file()


def test_an_unwritable_file_is_one_line(tmp_path, monkeypatch):
    path = planted().write(tmp_path / "m.json")

    def fail(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_text", fail)
    result = runner.invoke(app, ["trace", "summary", str(path), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 2
    assert "html: cannot write" in result.output and "Permission denied" in result.output


def test_a_folder_of_ranks_is_refused(tmp_path):
    TraceBuilder().write(tmp_path / "rank0.json")
    out = tmp_path.parent / f"{tmp_path.name}.html"
    result = runner.invoke(app, ["trace", "summary", str(tmp_path), "--html", str(out)])
    assert result.exit_code == 2 and "html: the page shows one trace" in result.output


def test_json_output_is_unchanged_by_html(tmp_path):
    path = planted().write(tmp_path / "m.json")
    plain = runner.invoke(app, ["trace", "summary", str(path), "--json"])
    both = runner.invoke(
        app, ["trace", "summary", str(path), "--json", "--html", str(tmp_path / "r.html")]
    )
    assert both.exit_code == 0 and json.loads(both.output) == json.loads(plain.output)
    assert "memory cuda:0" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_render_is_a_function_of_the_summary():
    s = {
        "trace": "t.json",
        "rank": None,
        "devices": [],
        "integrity": {"messages": ["1 <b>odd</b> event"]},
        "verdicts": [],
        "memory": None,
        "gpu": None,
        "cpu": {"ops": []},
    }
    page = trace_page.render(s)
    assert "1 &lt;b&gt;odd&lt;/b&gt; event" in page and "<b>" not in page
