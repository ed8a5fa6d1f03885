"""Corrupt or hostile traces: each case is a clear integrity finding or a one-line error,
never a traceback, a silently wrong number or raw control characters on the terminal."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from kernelab.cli import app
from kernelab.trace import load, public, summarize
from kernelab.trace._times import outlying
from tests.kineto_builder import TraceBuilder
from tests.test_trace import scenario

runner = CliRunner()


def kernels(b: TraceBuilder) -> list[dict]:
    return [e for e in b.events if e.get("ph") == "X" and e.get("cat") == "kernel"]


@pytest.mark.parametrize("stamp", [1e16, 1e300, -1e300])
@pytest.mark.parametrize("field", ["ts", "dur"])
def test_overflowing_times_are_an_integrity_finding(tmp_path, stamp, field):
    b = scenario()
    kernels(b)[2][field] = stamp
    s = public(summarize(b.write(tmp_path / "o.json")))
    assert s["integrity"]["counts"]["time_out_of_range"] == 1
    assert any("overflows" in m for m in s["integrity"]["messages"])
    assert s["gpu"]["breakdown"][0]["span_us"] == 185  # the span of the good events


def test_overflow_on_the_command_line_is_not_a_traceback(tmp_path):
    b = scenario()
    kernels(b)[0]["ts"] = 1e300
    result = runner.invoke(app, ["trace", "summary", str(b.write(tmp_path / "o.json"))])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "overflows" in result.output


@pytest.mark.parametrize("where", ["kernel", "cpu_op"])
def test_a_stamp_of_zero_is_left_out_of_the_span_and_reported(tmp_path, where):
    b = scenario()
    good = public(summarize(b.write(tmp_path / "g.json")))
    ev = kernels(b)[-1] if where == "kernel" else b.events[1]
    ev["ts"] = 0
    s = public(summarize(b.write(tmp_path / "z.json")))
    span = s["gpu"]["breakdown"][0]["span_us"]
    assert span < 1e3 and span <= good["gpu"]["breakdown"][0]["span_us"]
    assert s["integrity"]["counts"]["outlying_timestamps"] == 1
    (example,) = s["integrity"]["outliers"]
    assert example["name"] == ev["name"] and example["offset_from_bulk_us"] < -1e9
    assert any(ev["name"] in m for m in s["integrity"]["messages"])


def test_outlier_rule_leaves_honest_gaps_alone():
    # Two bursts with an idle stretch between them (500 us apart, 100 us long): no outlier.
    ts = np.r_[np.arange(0, 100_000, 1000), np.arange(600_000, 700_000, 1000)].astype(np.int64)
    assert not outlying(ts).any()
    # A late straggler 10x the span away: still not 1000x, kept.
    ts2 = np.r_[ts, 7_000_000]
    assert not outlying(ts2).any()
    # One stamp at each edge, years away: both found, nothing else.
    ts3 = np.r_[ts, -(10**15), 10**15].astype(np.int64)
    found = np.flatnonzero(outlying(ts3))
    assert found.tolist() == [len(ts), len(ts) + 1]
    # A 6-event trace whose first event leads the rest by 10 us (rest: 5 ns): not an outlier;
    # nor is a long enclosing span (its start is with the rest).
    tiny = np.array([0, 10_000, 10_001, 10_002, 10_003, 10_004], dtype=np.int64)
    assert not outlying(tiny).any()


def test_booleans_are_not_durations(tmp_path):
    b = scenario()
    kernels(b)[1]["dur"] = True
    kernels(b)[2]["ts"] = False
    t = load(b.write(tmp_path / "b.json"))
    assert t.malformed == 2
    s = public(summarize(tmp_path / "b.json"))
    assert s["integrity"]["counts"]["malformed_events"] == 2


def test_nan_tokens_are_accepted_and_counted(tmp_path):
    b = scenario()
    path = b.write(tmp_path / "n.json")
    text = path.read_text()
    first = json.dumps(kernels(b)[0]["dur"])
    text = text.replace(f'"dur":{first}', '"dur":NaN', 1)
    path.write_text(text.replace('"schemaVersion":1', '"schemaVersion":Infinity', 1))
    s = public(summarize(path))
    assert s["integrity"]["counts"]["malformed_events"] == 1
    assert len(s["gpu"]["top_kernels"]) > 0


def test_control_characters_never_reach_the_terminal(tmp_path):
    b = TraceBuilder()
    b.launch("evil\x1b[2J\x1b]0;owned\x07kernel\r\x9b", 0, 5, 10, 10)
    b.devices[0]["name"] = "GPU\x1b[31m"
    result = runner.invoke(app, ["trace", "summary", str(b.write(tmp_path / "e.json"))])
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\x07", "\r", "\x9b"):
        assert raw not in result.output
    assert "\\x1b[2J" in result.output  # shown, escaped


@pytest.mark.parametrize("name", ["x.html", "x.json.html", "x", "out.gz"])
def test_perfetto_output_must_be_named_as_json(tmp_path, name):
    path = scenario().write(tmp_path / "s.json")
    out = tmp_path / name
    result = runner.invoke(app, ["trace", "summary", str(path), "--perfetto", str(out)])
    assert result.exit_code == 2
    assert "perfetto: expected a .json or .json.gz" in result.output
    assert not out.exists()


def test_other_devices_are_named(tmp_path):
    b = scenario()
    b.devices = [dict(b.devices[0], id=i) for i in range(8)]
    result = runner.invoke(app, ["trace", "summary", str(b.write(tmp_path / "d.json"))])
    assert "(+7 more: 7 × NVIDIA A100-SXM4-80GB (108 SMs))" in " ".join(result.output.split())
