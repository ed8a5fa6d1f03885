"""The real traces in the shared folder (A100, V100, MI250): every one summarises, and the
numbers agree with an independent reading of the raw JSON. Skipped when the folder is absent.
"""

from __future__ import annotations

import gzip
import json
import re

import orjson
import pytest

from kernelab.trace import public, summarize
from kernelab.trace.diff import diff

SMALL = ["a100_alexnet", "a100_event_sync", "a100_triton_example", "mi250_minitoy", "a100_nccl"]
COMM = re.compile(r"^(void )?(nccl|rccl)", re.I)


def traces(shared_dir):
    return sorted((shared_dir / "traces").glob("*.json.gz"))


def test_every_real_trace_summarises(shared_dir):
    files = traces(shared_dir)
    assert len(files) >= 9
    for path in files:
        s = public(summarize(path))
        text = json.dumps(s)  # JSON-ready, no numpy or NaN leaking
        assert "NaN" not in text, path.name
        assert s["gpu"] is not None, path.name
        for dev in s["gpu"]["breakdown"]:
            assert dev["busy_us"] + dev["idle_us"] == pytest.approx(dev["span_us"], abs=0.01)
            idle = next(i for i in s["gpu"]["idle"] if i["device"] == dev["device"])
            assert sum(idle["by_cause_us"].values()) == pytest.approx(dev["idle_us"], abs=0.01)


@pytest.mark.parametrize("name", SMALL)
def test_category_totals_match_an_independent_reading(shared_dir, name):
    doc = orjson.loads(gzip.decompress((shared_dir / "traces" / f"{name}.json.gz").read_bytes()))
    expected = {"compute": 0.0, "memory": 0.0, "communication": 0.0}
    for e in doc["traceEvents"]:
        if e.get("ph") != "X":
            continue
        if e.get("cat") in ("gpu_memcpy", "gpu_memset"):
            expected["memory"] += e["dur"]
        elif e.get("cat") == "kernel":
            expected["communication" if COMM.match(e["name"]) else "compute"] += e["dur"]
    s = public(summarize(shared_dir / "traces" / f"{name}.json.gz"))
    got = {c: 0.0 for c in expected}
    for dev in s["gpu"]["breakdown"]:
        for c in got:
            got[c] += dev["categories"][c]["kernel_time_us"]
    for c in expected:
        assert got[c] == pytest.approx(expected[c], abs=0.01), c


def test_cudagraph_training_trace(shared_dir):
    s = public(summarize(shared_dir / "traces" / "a100_train_cudagraph.json.gz"))
    assert s["devices"][0]["hardware_table"] == "A100 80GB SXM"
    launch = s["gpu"]["launch"]
    assert launch["graph_replays"] == 70  # the trace's cudaGraphLaunch calls
    assert launch["in_graph_replays"] > launch["graph_replays"]
    roof = s["gpu"]["roofline"]["ops"]
    assert roof and all(o["bound"] in ("memory", "compute") for o in roof)
    assert s["gpu"]["breakdown"][0]["categories"]["communication"]["kernel_time_us"] > 0
    assert s["gpu"]["fusion"]["candidates"]


def test_unmatched_devices_get_no_peaks(shared_dir):
    s = public(summarize(shared_dir / "traces" / "mi250_minitoy.json.gz"))
    assert s["devices"][0]["hardware_table"] is None
    assert all("bound" not in o for o in s["gpu"]["roofline"]["ops"])
    assert s["gpu"]["occupancy"]["note"]  # gfx90a is not in the occupancy table


def test_diff_of_real_traces(shared_dir):
    d = diff(
        shared_dir / "traces" / "a100_diff_control.json.gz",
        shared_dir / "traces" / "v100_diff_test.json.gz",
    )
    deltas = [abs(k["delta_us"]) for k in d["kernels"]]
    assert deltas == sorted(deltas, reverse=True)
    total = sum(c["delta_us"] for c in d["categories"])
    a = sum(c["a_us"] for c in d["categories"])
    b = sum(c["b_us"] for c in d["categories"])
    assert total == pytest.approx(b - a, abs=0.1)
