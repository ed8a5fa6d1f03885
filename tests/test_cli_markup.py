"""User and op text is shown as it is: never read as rich markup nor as ``:emoji:`` codes."""

import io
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from rich.console import Console

import kernelab.cli._common as common
from kernelab import ledger
from kernelab.cli import app
from kernelab.hardware import detect
from kernelab.inspect.findings import Finding
from kernelab.inspect.report import KernelReport
from kernelab.stages import Cell, StageReport
from kernelab.verify._types import AuditEntry, CaseResult, Failure, Measure, Report

runner = CliRunner()
#: Brackets as in op descriptions, markup tags (one unbalanced), an emoji code.
TRICKY = "over [tokens, 2*d] [bold]x[/bold] [/] :cat: [red]"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def out(monkeypatch):
    """What the commands print (stdout and stderr consoles), 200 columns wide."""
    monkeypatch.setenv("COLUMNS", "200")
    buf = io.StringIO()
    for name in ("console", "err_console"):
        common._CONSOLES[(name, "200")] = Console(file=buf, width=200)
    yield lambda: flat(buf.getvalue())
    common._CONSOLES.clear()


def test_ops_shows_every_description_whole():
    data = json.loads(runner.invoke(app, ["ops", "--json", "--device", "cpu"]).output)
    text = runner.invoke(app, ["ops", "--device", "cpu"], env={"COLUMNS": "160"}).output
    silu = next(o for o in data["ops"] if o["op"] == "silu_and_mul")
    assert "[tokens, 2*d]" in silu["description"]
    for o in data["ops"]:
        assert o["description"] in text, o["description"]


def test_ops_table_with_markup_in_op_text(out):
    from kernelab.cli.ops_cmd import ops_sheet

    rows = [
        {
            "op": "myop",
            "description": TRICKY,
            "dtypes": ["bfloat16"],
            "inplace": [],
            "shape_sets": {"representative": 1},
            "variants": [
                {"name": "v", "kind": "triton", "runs_here": False, "note": TRICKY},
            ],
        }
    ]
    ops_sheet(detect("cpu"), rows).print(common.console)
    assert out().count(TRICKY) == 2


def test_bench_lines(out):
    from kernelab.cli.bench_cmd import _print_table

    metrics = {
        "valid": True,
        "median_s": 1e-3,
        "q1_s": 1e-3,
        "q3_s": 1e-3,
        "n": 5,
        "cv": 0.1,
        "ceiling_source": TRICKY,
    }
    case = {
        "op": "rmsnorm",
        "shape_label": TRICKY,
        "dtype": "bfloat16",
        "variant": TRICKY,
        "mode": "cold",
        "flags": [TRICKY],
        "metrics": metrics,
    }
    result = SimpleNamespace(device={"name": TRICKY}, cases=[case], skipped=[TRICKY], seconds=1)
    _print_table(result, None)
    assert out().count(TRICKY) >= 6


def test_verify_lines(out):
    from kernelab.cli.verify_cmd import _print_audit, _print_report

    c = CaseResult(TRICKY, TRICKY, "edge", TRICKY, "k", "bfloat16", notes=[TRICKY])
    c.add_measure(Measure("out", 1.0, 1.0, 1.0, [0], 1.0, 0.0, 1e-2, TRICKY, None))
    c.failures.append(Failure("wrong values", TRICKY, TRICKY))
    report = Report(1, "cpu", 1, ["edge"], [c], skipped=[TRICKY])
    report.audit = [AuditEntry(TRICKY, TRICKY, "out", "bfloat16", False, None, 1.0, note=TRICKY)]
    _print_report(report, show=5)
    assert out().count(TRICKY) >= 7
    _print_audit(report)
    assert f"✗ {TRICKY}: broken op definition" in out()


def test_inspect_lines(out):
    from kernelab.cli.inspect_cmd import _print

    rep = KernelReport("k", TRICKY, TRICKY, "sm_90", TRICKY, TRICKY, error=None, unsupported=TRICKY)
    rep.findings = [Finding("x", "warn", TRICKY, TRICKY)]
    _print(
        SimpleNamespace(reports=[rep], skipped=[TRICKY], triton="3", trusted=0), 1.0, all_rows=True
    )
    assert out().count(TRICKY) >= 6


def test_run_card_lines(out):
    from kernelab.cli._common import select_ops
    from kernelab.cli.run_cmd import _print_table

    report = StageReport("verify", skipped=[TRICKY])
    report.cells[("rmsnorm", "torch")] = Cell("fail", TRICKY)
    _print_table(detect("cpu"), select_ops(["rmsnorm"]), [report], 1.0)
    assert out().count(TRICKY) == 2


def test_ledger_text_in_history_and_compare(tmp_path, out):
    path = str(tmp_path / "l.sqlite")
    case = {
        "op": "rmsnorm",
        "variant": TRICKY,
        "shape_key": "k",
        "shape_label": TRICKY,
        "dtype": "bfloat16",
        "device": "cpu",
        "mode": "cold",
        "metrics": {"median_s": 1e-3},
        "flags": [TRICKY],
        "samples": [1e-3] * 10,
    }
    with ledger.open(path) as db:
        a = db.record_run("bench", [case], label=TRICKY)
        b = db.record_run("bench", [case, {**case, "shape_key": "k2"}], label=TRICKY)
    for args in (["history"], ["history", "rmsnorm"], ["compare", a, b]):
        result = runner.invoke(app, [*args, "--ledger", path], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
    text = out()
    assert text.count(TRICKY) >= 2 + 6 + 5
    assert f"only in candidate: rmsnorm {TRICKY} {TRICKY}" in text


def test_errors_show_the_input_as_given(out):
    result = runner.invoke(app, ["bench", "--dtype", ":cat: [/]"])
    assert result.exit_code == 2
    assert "got ':cat: [/]'" in out()
    result = runner.invoke(app, ["verify", "--candidate", "no[/]:cat:.py:f", "--op", "rmsnorm"])
    assert result.exit_code == 2
    assert "no[/]:cat:.py" in out()
