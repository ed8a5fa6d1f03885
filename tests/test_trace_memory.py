"""Memory analysis from ``[memory]`` instants: exact on a synthetic trace with planted
leaks and allocator slack, plausible on a real CPU trace recorded with profile_memory=True."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import orjson
import pytest

from kernelab.trace import _ingest, load, public, summarize
from kernelab.trace.render import sparkline
from tests.kineto_builder import PID, TraceBuilder

MiB = 2**20


class MemoryTrace(TraceBuilder):
    """A builder that keeps the allocator's totals as it records allocations and frees."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.totals: dict[tuple, list] = {}

    def mem(self, ts, addr, nbytes, device=(1, 0), reserved=None, tid=1):
        tot = self.totals.setdefault(device, [0, 0])
        tot[0] += nbytes
        tot[1] = max(tot[1], tot[0]) if reserved is None else reserved
        self.events.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "s": "t",
                "name": "[memory]",
                "pid": PID,
                "tid": tid,
                "ts": self.base + ts,
                "args": {
                    "Total Reserved": tot[1],
                    "Total Allocated": tot[0],
                    "Bytes": nbytes,
                    "Device Id": device[1],
                    "Device Type": device[0],
                    "Addr": addr,
                },
            }
        )


def planted() -> MemoryTrace:
    """cuda:0: linear allocates 4 MiB (kept: never freed), matmul a 16 MiB temporary
    (freed), relu 2 MiB; the allocator reserves 32 MiB at the peak. cpu: one 1 MiB buffer,
    freed."""
    b = MemoryTrace()
    b.cpu_op("aten::linear", 0, 100)
    b.cpu_op("aten::matmul", 10, 50)
    b.cpu_op("aten::relu", 200, 20)
    b.mem(5, 0x1000, 4 * MiB, reserved=8 * MiB)  # in linear
    b.mem(20, 0x2000, 16 * MiB, reserved=32 * MiB)  # in matmul: the peak, 20 MiB live
    b.mem(70, 0x2000, -16 * MiB, reserved=32 * MiB)
    b.mem(205, 0x3000, 2 * MiB, reserved=32 * MiB)  # in relu
    b.mem(215, 0x3000, -2 * MiB, reserved=32 * MiB)
    b.mem(150, 0x9000, MiB, device=(0, -1), reserved=0)  # outside any op
    b.mem(160, 0x9000, -MiB, device=(0, -1), reserved=0)
    b.launch("k", 0, 5, 10, 5)
    return b


def test_peak_slack_live_and_never_freed_are_exact(tmp_path):
    s = public(summarize(planted().write(tmp_path / "m.json")))
    by = {m["device"]: m for m in s["memory"]}
    cuda = by["cuda:0"]
    assert cuda["peak_allocated_bytes"] == 20 * MiB
    assert cuda["peak_reserved_bytes"] == 32 * MiB
    assert cuda["slack_at_peak_bytes"] == 12 * MiB  # 32 reserved - 20 allocated
    assert cuda["peak_allocated_at_us"] == cuda["peak_reserved_at_us"] == 20
    assert cuda["live_at_peak_by_op"] == [
        {"op": "aten::matmul", "allocations": 1, "bytes": 16 * MiB},
        {"op": "aten::linear", "allocations": 1, "bytes": 4 * MiB},
    ]
    assert cuda["never_freed"] == {
        "allocations": 1,
        "bytes": 4 * MiB,
        "by_op": [{"op": "aten::linear", "allocations": 1, "bytes": 4 * MiB}],
    }
    assert [p[1] for p in cuda["timeline"]] == [x * MiB for x in (4, 20, 4, 6, 4)]
    cpu = by["cpu"]
    assert cpu["peak_allocated_bytes"] == MiB and cpu["never_freed"]["allocations"] == 0
    assert cpu["live_at_peak_by_op"] == [{"op": "(outside any op)", "allocations": 1, "bytes": MiB}]


def test_an_honest_trace_has_no_leak_and_no_memory_section_without_events(tmp_path):
    b = planted()
    b.mem(300, 0x1000, -4 * MiB, reserved=32 * MiB)  # linear's output freed at the end
    s = public(summarize(b.write(tmp_path / "h.json")))
    assert all(m["never_freed"]["allocations"] == 0 for m in s["memory"])
    b2 = TraceBuilder()
    b2.launch("k", 0, 5, 10, 5)
    assert public(summarize(b2.write(tmp_path / "n.json")))["memory"] is None


def test_malformed_memory_events_are_counted(tmp_path):
    b = planted()
    b.events[-6]["args"]["Bytes"] = True  # a boolean is not a size
    b.events[-5]["args"]["Addr"] = "0x2000"
    s = public(summarize(b.write(tmp_path / "bad.json")))
    assert s["integrity"]["counts"]["malformed_events"] == 2


@pytest.mark.parametrize(
    ("where", "value", "malformed", "tid"),
    [
        ("ts", True, 1, 1),  # a boolean is not a time
        ("ts", float("nan"), 1, 1),
        ("ts", 10**400, 1, 1),  # beyond a float
        ("ts", 2e16, 1, 1),  # beyond the time limit
        ("tid", "main", 0, -1),  # an odd thread is -1, the event kept
        ("tid", -(2**63), 0, -1),
        ("tid", 2**63, 0, -1),
        ("Addr", 2**63, 1, 1),  # beyond int64
        ("Addr", -(2**63), 1, 1),
        ("Bytes", 1.5, 1, 1),
        ("Device Id", None, 1, 1),
        ("args", [], 1, 1),
    ],
)
def test_odd_memory_values_in_a_chunk_of_good_ones(tmp_path, where, value, malformed, tid):
    """One odd instant among good ones: the chunk's columns are read row by row, the odd
    one counted (or its thread set to -1) and the others kept exactly."""
    b = planted()
    event = next(e for e in b.events if e["name"] == "[memory]")  # the first: 4 MiB
    if where in ("ts", "tid", "args"):
        event[where] = value
    else:
        event["args"][where] = value
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(b.document()))  # Python's json: NaN and huge integers too
    trace = load(path)
    assert trace.malformed == malformed
    sizes = [4, 16, -16, 2, -2, 1, -1][malformed:]
    assert trace.memory["bytes"].tolist() == [MiB * x for x in sizes]
    assert trace.memory["tid"].tolist() == [tid] * (1 - malformed) + [1] * 6


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_memory_events_survive_chunking_and_workers(tmp_path, monkeypatch):
    b = planted()
    for i in range(200):  # enough events for many chunks
        b.cpu_op("aten::add", 1000 + 10 * i, 5)
        b.mem(1001 + 10 * i, 0x10000 + i, 1024)
        b.mem(1003 + 10 * i, 0x10000 + i, -1024)
    path = b.write(tmp_path / "c.json")
    one = load(path)
    monkeypatch.setattr(_ingest, "_CHUNK_BYTES", 2048)
    monkeypatch.setattr(_ingest, "_PIECE_BYTES", 1000)
    for workers in (1, 2):
        other = load(path, workers=workers)
        for k in one.memory:
            assert np.array_equal(one.memory[k], other.memory[k]), k
    assert len(one.memory["ts"]) == 7 + 400


@pytest.mark.parametrize("flag", [None, 1, 0])
def test_memory_events_by_the_profile_memory_flag(tmp_path, monkeypatch, flag):
    """Without the flag or with it set, every chunk's [memory] instants are kept (other
    instants ignored); with profile_memory 0 the instants are skipped and there is no memory
    section."""
    b = planted()
    for i in range(100):
        b.cpu_op("aten::add", 1000 + 10 * i, 5)
        b.events.append(
            {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "Iteration Start",
             "pid": PID, "tid": 1, "ts": b.base + 1002 + 10 * i, "args": {}}
        )  # fmt: skip
        b.mem(1001 + 10 * i, 0x10000 + i, 1024)
    doc = b.document()
    if flag is not None:
        doc = {"profile_memory": flag, **doc}
    path = tmp_path / "f.json"
    path.write_bytes(orjson.dumps(doc))
    monkeypatch.setattr(_ingest, "_CHUNK_BYTES", 2048)
    monkeypatch.setattr(_ingest, "_PIECE_BYTES", 1000)
    trace = load(path)
    if flag == 0:
        assert trace.memory is None
    else:
        assert len(trace.memory["ts"]) == 7 + 100
        assert trace.memory["addr"][-1] == 0x10000 + 99


def test_sparkline_keeps_the_peak():
    line = sparkline([0, 1, 2, 100, 2, 1] * 20, width=10)
    assert len(line) == 10 and set(line) <= set("▁▂▃▄▅▆▇█") and "█" in line
    assert sparkline([]) == ""


DATA = Path(__file__).parent / "data" / "cpu_memory.json.gz"


def test_the_recorded_cpu_training_trace():
    """tests/data/cpu_memory.json.gz: torch 2.13 CPU, profile_memory=True, two steps of a
    256-512-64 MLP's forward and backward (batch 128). The weight gradients (256x512 and
    512x64 float32, made by aten::mm in backward) outlive the window."""
    (m,) = public(summarize(DATA))["memory"]
    assert m["device"] == "cpu" and m["allocations"] == 44 and m["frees"] == 39
    grads = (256 * 512 + 512 * 64) * 4
    assert m["never_freed"]["by_op"][0] == {"op": "aten::mm", "allocations": 2, "bytes": grads}
    assert m["peak_allocated_bytes"] > grads
    assert m["live_at_peak_by_op"][0]["op"] == "aten::mm"
    assert (
        len(m["timeline"]) <= 64 and max(p[1] for p in m["timeline"]) == m["peak_allocated_bytes"]
    )


@pytest.fixture(scope="module")
def cpu_memory_trace(tmp_path_factory):
    """A real trace: torch.profiler on CPU with profile_memory=True."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    path = tmp_path_factory.mktemp("mem") / "cpu_memory.json"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        kept = torch.ones(512, 512)  # 1 MiB, alive at the end
        temp = torch.zeros(1024, 1024)  # 4 MiB, freed
        total = float((temp + 1).sum())  # a second 4 MiB temporary
        del temp
    prof.export_chrome_trace(str(path))
    assert total == 1024 * 1024 and kept.numel() == 512 * 512
    return path


@pytest.mark.slow
def test_a_real_cpu_memory_trace(cpu_memory_trace):
    s = public(summarize(cpu_memory_trace))
    (m,) = s["memory"]
    assert m["device"] == "cpu"
    assert m["peak_allocated_bytes"] >= 9 * MiB  # kept + temp + temp + 1 at once
    ops = {r["op"] for r in m["live_at_peak_by_op"]}
    assert {"aten::ones", "aten::zeros", "aten::add"} & ops or "aten::empty" in ops
    assert m["never_freed"]["bytes"] >= MiB  # `kept` outlives the window
    assert m["frees"] >= 2
