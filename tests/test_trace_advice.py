"""Each verdict fires on a trace that holds its defining evidence, states that evidence, and
stays silent on a trace that lacks it (small synthetic traces, one pair per verdict)."""

from __future__ import annotations

import json

import pytest

from kernelab.trace import public, summarize
from tests.kineto_builder import TraceBuilder


def verdicts(b: TraceBuilder, tmp_path, name="t.json") -> list[dict]:
    return public(summarize(b.write(tmp_path / name)))["verdicts"]


def find(vs: list[dict], word: str) -> list[dict]:
    return [v for v in vs if word in v["finding"]]


def tiny_kernels(b: TraceBuilder, n=40, gap=10, dur=2, t=0) -> int:
    """Kernels of ``dur`` us, each launched after the GPU drained, ``gap`` us apart."""
    for i in range(n):
        b.launch(f"tiny_{i % 2}", t, 8, t + gap, dur)
        t += gap + dur + 8
    return t


def test_launch_bound_fires_on_short_kernels_with_short_host_gaps(tmp_path):
    b = TraceBuilder()
    tiny_kernels(b)
    (v,) = find(verdicts(b, tmp_path), "launch-bound")
    assert "gaps shorter than 100 us" in v["finding"] and "100% are shorter" in v["finding"]
    assert "CUDA graph" in v["fix"]


def test_launch_bound_needs_short_kernels(tmp_path):
    b = TraceBuilder()
    t = 0
    for i in range(40):  # 100 us kernels, 60 us host gaps (37% idle): not launch overhead
        b.launch(f"long_{i}", t, 8, t + 60, 100)
        t += 160
    s = public(summarize(b.write(tmp_path / "l.json")))
    assert s["gpu"]["idle"][0]["host_gaps"]["short_us"] >= 0.3 * s["gpu"]["breakdown"][0]["span_us"]
    assert not find(s["verdicts"], "launch-bound")


def test_launch_bound_needs_the_gaps_to_be_short(tmp_path):
    """A few long host stalls between short kernels (data loading): a host stall, named as
    such, not launch overhead; the CUDA-graph advice would not help."""
    b = TraceBuilder()
    t = 0
    for _ in range(5):
        t = tiny_kernels(b, n=4, t=t) + 50_000  # 50 ms of host work after each burst
    vs = verdicts(b, tmp_path)
    assert not find(vs, "launch-bound")
    (v,) = find(vs, "waits on the host")
    assert "not launch overhead" in v["finding"] and "largest 50 ms" in v["finding"]
    assert "CUDA graph" not in v["fix"]


def setup_trace(setup_us: int) -> TraceBuilder:
    """A step of 10 ms of kernels, plus ``setup_us`` of allocation and context set-up."""
    b = TraceBuilder()
    b.cpu_op("aten::empty_strided", 0, setup_us + 10)
    b.runtime("cudaMalloc", 5, setup_us // 2)
    b.runtime("cudaDeviceGetStreamPriorityRange", 5 + setup_us // 2, setup_us // 2)
    t = setup_us + 20
    for i in range(10):
        b.launch(f"gemm_{i}", t, 5, t + 6, 1000)
        t += 1010
    return b


def test_warmup_fires_on_set_up_calls_and_names_them(tmp_path):
    (v,) = find(verdicts(setup_trace(2_000_000), tmp_path), "warm-up")
    assert "cudaMalloc 1 s" in v["finding"] and "cudaDeviceGetStreamPriorityRange" in v["finding"]
    assert "aten::empty_strided" in v["finding"]
    assert "schedule" in v["fix"]


def test_warmup_fires_on_slow_first_launches(tmp_path):
    b = TraceBuilder()
    b.launch("first", 0, 30_000, 30_010, 5)  # 30 ms launch call: module loading
    t = 30_100
    for i in range(10):
        b.launch(f"k{i}", t, 5, t + 6, 100)
        t += 110
    (v,) = find(verdicts(b, tmp_path), "warm-up")
    assert "1 launch calls over 1 ms" in v["finding"]


def test_no_warmup_in_a_steady_trace(tmp_path):
    # The same shape with 100 us of set-up in a 10 ms window: below the threshold.
    assert not find(verdicts(setup_trace(100), tmp_path), "warm-up")
    b = TraceBuilder()
    tiny_kernels(b)
    assert not find(verdicts(b, tmp_path, "s.json"), "warm-up")


@pytest.mark.parametrize("pageable", [True, False])
def test_pageable_copies_fire_only_on_pageable_memory(tmp_path, pageable):
    b = TraceBuilder()
    kind = "Pageable" if pageable else "Pinned"
    t = 0
    for i in range(4):
        b.launch(
            f"Memcpy HtoD ({kind} -> Device)",
            t,
            5,
            t + 6,
            500,
            api="cudaMemcpyAsync",
            cat="gpu_memcpy",
            bytes=1 << 24,
        )
        b.launch(f"k{i}", t + 510, 5, t + 516, 100)
        t += 620
    found = find(verdicts(b, tmp_path), "pageable")
    if not pageable:
        assert not found
        return
    (v,) = found
    assert "4 copies" in v["finding"] and "83% of its GPU time" in v["finding"]
    assert "pin_memory" in v["fix"] and "non_blocking" in v["fix"]


def test_few_pageable_copies_do_not_fire(tmp_path):
    b = TraceBuilder()
    b.launch(
        "Memcpy HtoD (Pageable -> Device)",
        0,
        5,
        6,
        10,
        api="cudaMemcpyAsync",
        cat="gpu_memcpy",
        bytes=1024,
    )
    t = 20
    for i in range(20):
        b.launch(f"k{i}", t, 5, t + 6, 100)
        t += 110
    assert not find(verdicts(b, tmp_path), "pageable")


def test_alexnet_is_warm_up_and_pageable_copies_not_launch_bound(shared_dir):
    s = public(summarize(shared_dir / "traces" / "a100_alexnet.json.gz"))
    text = " | ".join(v["finding"] for v in s["verdicts"])
    assert "launch-bound" not in text
    assert "warm-up" in text and "aten::empty_strided" in text
    assert "pageable" in text and "84% of its GPU time" in text


def test_diff_warns_when_the_devices_differ(tmp_path):
    from click.testing import CliRunner

    from kernelab.cli import app
    from tests.kineto_builder import A100_80GB

    a, b = TraceBuilder(), TraceBuilder(devices=(dict(A100_80GB, name="NVIDIA H100 80GB HBM3"),))
    for x in (a, b):
        tiny_kernels(x, n=4)
    pa, pb = a.write(tmp_path / "a.json"), b.write(tmp_path / "b.json")
    result = CliRunner().invoke(app, ["trace", "diff", str(pa), str(pb)])
    assert result.exit_code == 0, result.output
    assert "different devices" in result.output and "H100" in result.output
    same = CliRunner().invoke(app, ["trace", "diff", str(pa), str(pa), "--json"])
    assert json.loads(same.output)["warnings"] == []
