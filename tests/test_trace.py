"""Trace analysis on synthetic Kineto traces whose idle, launch, queueing, graph, sync and
fusion properties are known exactly (times in microseconds)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from kernelab.hardware import occupancy
from kernelab.trace import _columns, _ingest, load, summarize
from kernelab.trace._link import distinct, member, nesting_parents, percentile
from kernelab.trace.kernels import normalise
from kernelab.trace.perfetto import annotations
from kernelab.trace.summary import NothingToAnalyse, public
from tests.kineto_builder import TraceBuilder


def scenario() -> TraceBuilder:
    """Planted: host-bound gaps, a sync wait, queueing, a graph replay, NCCL, a lost launch.

    Device 0 busy intervals: [15,45] [72,80] [120,130] [140,150] [165,170] [171,175]
    [176,180] [190,200]; span 15..200 = 185, busy 81, idle 104 =
    host 27 + 15 + 10 = 52, sync 40, other 10 + 1 + 1 = 12.
    """
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 210)
    b.cpu_op("aten::add", 0, 11)
    b.launch(
        "void at::native::vectorized_elementwise_kernel<4, AddFunctor<float> >(int)", 0, 10, 15, 10
    )  # K1: latency 5
    b.cpu_op("aten::mm", 11, 10)
    b.launch("ampere_sgemm_128x64_tn", 12, 8, 25, 20)  # K2: queued 5 behind K1
    b.launch(
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 5, 3, 20, 20, stream=9, tid=2
    )  # NCCL: latency 12 on its own stream
    b.launch("k3_compute", 60, 10, 72, 8)  # gap [45,72] = 27: host-bound; latency 2
    b.sync("device", 82, 18)  # returns at 100, inside the gap [80,120]
    b.launch("k4_compute", 105, 5, 120, 10)  # gap [80,120] = 40: sync; latency 10
    b.launch("k5_other_stream", 111, 4, 140, 10, stream=8)  # gap [130,140]: other; latency 25
    b.graph(150, 10, [("g1", 165, 5), ("g2", 171, 4), ("g3", 176, 4)])  # gap 15 host; 1+1 other
    b.launch(
        "Memcpy HtoD (Pinned -> Device)",
        181,
        4,
        190,
        10,
        api="cudaMemcpyAsync",
        cat="gpu_memcpy",
        bytes=1000,
    )  # gap [180,190] = 10: host; latency 5
    b.runtime("cudaLaunchKernel", 201, 2, b.next_corr())  # a launch whose kernel is missing
    return b


@pytest.fixture
def scenario_summary(tmp_path):
    path = scenario().write(tmp_path / "s.json")
    return public(summarize(path))


def test_breakdown_exact(scenario_summary):
    dev = scenario_summary["gpu"]["breakdown"][0]
    assert dev["span_us"] == 185
    assert dev["busy_us"] == 81
    assert dev["idle_us"] == 104
    cats = dev["categories"]
    assert cats["compute"]["kernel_time_us"] == 10 + 20 + 8 + 10 + 10 + 5 + 4 + 4
    assert cats["memory"]["kernel_time_us"] == 10
    assert cats["communication"]["kernel_time_us"] == 20
    assert cats["communication"]["busy_us"] == 20
    streams = {s["stream"]: s for s in dev["streams"]}
    assert set(streams) == {7, 8, 9}
    assert streams[9]["kernel_time_us"]["communication"] == 20


def test_idle_attribution_exact(scenario_summary):
    idle = scenario_summary["gpu"]["idle"][0]
    assert idle["idle_us"] == 104
    assert idle["by_cause_us"] == {"sync": 40, "host": 52, "other": 12}
    assert idle["sync_by_kind_us"] == {"device": 40}
    sync = [v for v in scenario_summary["verdicts"] if "host synchronisations" in v["finding"]]
    assert sync and sync[0]["severity"] == round(40 / 185, 4)
    assert idle["largest"][0] == {
        "start_us": 65.0,
        "length_us": 40.0,
        "cause": "sync",
        "next": "k4_compute",
    }


def test_launch_latency_queueing_and_graph_exact(scenario_summary):
    launch = scenario_summary["gpu"]["launch"]
    assert launch["kernels"] == 9
    assert launch["in_graph_replays"] == 3
    assert launch["graph_replays"] == 1
    # K1..K5, NCCL, the graph's first kernel (the memcpy is not a kernel)
    assert launch["measured"] == 7
    assert launch["latency_us"]["total"] == 5 + 0 + 12 + 2 + 10 + 25 + 5
    assert launch["queueing_us"]["total"] == 5
    assert launch["short_kernels"] == 2  # g2, g3 (< 5 us)
    replay = launch["replays"][0]
    assert (replay["kernels"], replay["span_us"], replay["kernel_time_us"]) == (3, 15, 13)


def test_replays_listed_are_the_ten_longest_and_every_one_is_annotated(tmp_path):
    """12 graph replays, kernel time 10..120 us with two of 50 us: the ten listed are the
    longest, most kernel time first, equal ones in call order; Perfetto marks all 12."""
    b = TraceBuilder()
    busy = [10, 50, 30, 120, 50, 70, 20, 90, 100, 40, 80, 60]
    for i, k in enumerate(busy):
        t0 = 1000 * i
        b.graph(t0, 5, [("g_a", t0 + 10, k // 2), ("g_b", t0 + 10 + k // 2, k - k // 2)])
    s = summarize(b.write(tmp_path / "g.json"))
    launch = s["gpu"]["launch"]
    assert launch["graph_replays"] == 12 and launch["in_graph_replays"] == 24
    listed = launch["replays"]
    assert [r["kernel_time_us"] for r in listed] == [120, 100, 90, 80, 70, 60, 50, 50, 40, 30]
    assert [r["launch_ts_ns"] // 1000 for r in listed[6:8]] == [1000, 4000]  # call order
    assert all(r["kernels"] == 2 and r["span_us"] == r["kernel_time_us"] for r in listed)
    marks = [e for e in annotations(s) if e["name"] == "graph replay"]
    assert sorted(e["dur"] for e in marks) == sorted(busy)
    assert all(e["args"]["kernels"] == 2 for e in marks)


def test_integrity_counts_planted_defects(scenario_summary):
    counts = scenario_summary["integrity"]["counts"]
    assert counts["launch_without_gpu_event"] == 1
    assert counts["gpu_event_without_launch"] == 0
    assert counts["overlapping_on_stream"] == 0


def test_integrity_catches_cut_overlapping_and_orphan_events(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::relu", 100, 50)
    b.launch("k", 100, 5, 110, 10)
    b.gpu("kernel", "cut_at_start", 50, 70)  # starts before the host window; no launch
    b.gpu("kernel", "overlaps", 115, 10)  # overlaps "k" on stream 7; no launch
    b.gpu("kernel", "cut_at_end", 140, 30, stream=8)
    b._x("kernel", "negative", 145, -3, 0, 9, {"stream": 9, "device": 0})
    b._x("mystery_cat", "x", 100, 1, 1, 1, {})
    b.events.append({"ph": "X", "cat": "kernel", "name": "no_ts", "dur": 3, "pid": 0, "tid": 7})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": 5, "ts": 1, "dur": 3, "pid": 0, "tid": 7})
    counts = public(summarize(b.write(tmp_path / "i.json")))["integrity"]["counts"]
    assert counts["gpu_before_window"] == 1
    assert counts["gpu_after_window"] == 1
    assert counts["gpu_event_without_launch"] == 4
    assert counts["overlapping_on_stream"] >= 1
    assert counts["negative_duration"] == 1
    assert counts["unknown_category_events"] == 1
    assert counts["malformed_events"] == 2


def test_verdicts_name_sync_and_launch_bound(tmp_path):
    b = TraceBuilder()
    t = 0
    for i in range(20):  # tiny kernels, each launched after the GPU drained
        b.launch(f"tiny_{i % 2}", t, 8, t + 10, 2)
        t += 20
    s = public(summarize(b.write(tmp_path / "lb.json")))
    text = " ".join(v["finding"] for v in s["verdicts"])
    assert "launch-bound" in text
    assert "CUDA graph" in s["verdicts"][0]["fix"]


def test_top_kernels_normalised_and_linked_to_ops(scenario_summary):
    top = {k["name"]: k for k in scenario_summary["gpu"]["top_kernels"]}
    assert top["ampere_sgemm_128x64_tn"]["op"] == "aten::mm"
    ew = top["at::native::vectorized_elementwise_kernel<...>"]
    assert ew["op"] == "aten::add" and ew["count"] == 1


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("void at::native::foo<4, Bar<float> >(int, Baz<1>)", "at::native::foo<...>"),
        ("ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_tn"),
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
            "ncclKernel_AllReduce_RING_LL_Sum_float",
        ),
        (
            "void (anonymous namespace)::softmax_warp<float, 7>(float*)",
            "(anonymous namespace)::softmax_warp<...>",
        ),
        ("Memcpy HtoD (Pinned -> Device)", "Memcpy HtoD (Pinned -> Device)"),
    ],
)
def test_normalise(raw, expected):
    assert normalise(raw) == expected


def test_occupancy_uses_real_carveout_not_kineto_estimate(tmp_path):
    b = TraceBuilder()
    b.launch(
        "big_smem",
        0,
        5,
        10,
        100,
        **{
            "registers per thread": 32,
            "shared memory": 65536,
            "block": [256, 1, 1],
            "est. achieved occupancy %": 0,
        },
    )
    occ = public(summarize(b.write(tmp_path / "o.json")))["gpu"]["occupancy"]["kernels"][0]
    expected = occupancy("sm_80", 256, 32, 65536)
    assert occ["occupancy"] == round(expected.occupancy, 4) == 0.25
    assert occ["limiter"] == "shared"


def test_roofline_mm_exact(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::mm", 0, 20, dims=[[128, 256], [256, 512]], types=["float", "float"])
    b.launch("ampere_sgemm", 2, 5, 10, 10)
    op = public(summarize(b.write(tmp_path / "r.json")))["gpu"]["roofline"]["ops"][0]
    flops = 2 * 128 * 512 * 256
    nbytes = (128 * 256 + 256 * 512 + 128 * 512) * 4
    assert (op["flops"], op["bytes"]) == (flops, nbytes)
    assert op["device_name"] == "A100 80GB SXM"
    assert op["bound"] == "compute"
    assert op["achieved_tflops"] == pytest.approx(flops / 10e-6 / 1e12, rel=1e-3)
    assert op["roofline_share"] == pytest.approx(flops / 19.5e12 / 10e-6, rel=1e-3)


def test_rms_norm_cost_comes_from_the_kernelab_op():
    from kernelab.trace.roofline import op_cost

    bf = "c10::BFloat16"
    flops, nbytes, dtype = op_cost("aten::rms_norm", [[4, 4096], [], [4096], []], [bf, "", bf, ""])
    n = 4 * 4096
    # rmsnorm's model: 4 FLOP per element; read x and weight, write out (the generic norm
    # formula would give 5 FLOP per element)
    assert (flops, nbytes, dtype) == (4 * n, 2 * n * 2 + 4096 * 2, bf)


def test_roofline_skips_unknown_device(tmp_path):
    dev = {"id": 0, "name": "Tesla V100-SXM2-16GB", "numSms": 80, "totalGlobalMem": 16945512448}
    b = TraceBuilder(devices=(dev,))
    b.cpu_op("aten::mm", 0, 20, dims=[[128, 256], [256, 512]], types=["float", "float"])
    b.launch("volta_sgemm", 2, 5, 10, 10)
    roof = public(summarize(b.write(tmp_path / "v.json")))["gpu"]["roofline"]
    assert "bound" not in roof["ops"][0] and "not in the hardware table" in roof["note"]


def fusible(b: TraceBuilder, t0: int) -> None:
    bf = "c10::BFloat16"
    b.cpu_op("aten::add", t0, 10, dims=[[4, 4096], [4, 4096]], types=[bf, bf])
    b.launch(
        "void at::native::vectorized_elementwise_kernel<4, AddFunctor>(int)", t0 + 1, 5, t0 + 10, 3
    )
    b.cpu_op(
        "aten::rms_norm",
        t0 + 10,
        10,
        dims=[[4, 4096], [], [4096], []],
        types=[bf, "", bf, "Scalar"],
    )
    b.launch("void at::native::rms_norm_kernel<c10::BFloat16>(int)", t0 + 11, 5, t0 + 14, 3)
    b.cpu_op("aten::mm", t0 + 20, 10, dims=[[4, 4096], [4096, 4096]], types=[bf, bf])
    b.launch("ampere_bf16_s16816gemm", t0 + 21, 5, t0 + 30, 20)


def test_builtin_fused_ops_are_the_registrys():
    """The names fusion uses without loading the ops are exactly the registered candidates."""
    from kernelab import ops
    from kernelab.trace.fusion import BUILTIN_FUSED_OPS, FUSED_FORMS

    registered = {o.name for o in ops.all_ops()}
    candidates = {c for _, _, names in FUSED_FORMS for c in names}
    assert candidates & registered == BUILTIN_FUSED_OPS


def test_fusion_names_kernelab_op_and_counts_savings(tmp_path):
    b = TraceBuilder()
    for i in range(3):
        fusible(b, i * 100)
    fusion = public(summarize(b.write(tmp_path / "f.json"), registered={"rmsnorm"}))["gpu"][
        "fusion"
    ]
    assert fusion["runs"] == 3
    cand = fusion["candidates"][0]
    assert cand["ops"] == ["aten::add", "aten::rms_norm"]
    assert cand["occurrences"] == 3 and cand["launches_saved"] == 3
    assert cand["bytes_saved"] == 3 * 2 * 4 * 4096 * 2  # add's output written and read back
    assert cand["kernelab_op"] == "rmsnorm"
    # Without the fused op registered, the form is described but no op is named.
    fusion = public(summarize(tmp_path / "f.json", registered=set()))["gpu"]["fusion"]
    assert fusion["candidates"][0]["kernelab_op"] is None
    assert fusion["candidates"][0]["fused_form"] == "residual add + RMSNorm"


def test_chunked_and_compact_parsing_agree(tmp_path, monkeypatch):
    b = scenario()
    for i in range(50):
        fusible(b, 1000 + 100 * i)
    whole = _ingest._load_whole

    def no_fallback(path):
        raise AssertionError("a Kineto-layout file must stream, not be parsed whole")

    monkeypatch.setattr(_ingest, "_load_whole", no_fallback)
    a = load(b.write(tmp_path / "a.json.gz"))
    monkeypatch.setattr(_ingest, "_CHUNK_BYTES", 256)  # many chunks, many pieces
    monkeypatch.setattr(_ingest, "_PIECE_BYTES", 300)
    c = load(b.write(tmp_path / "c.json"))
    monkeypatch.setattr(_ingest, "_load_whole", whole)
    d = load(b.write(tmp_path / "d.json", layout="compact"))  # the whole-document path
    monkeypatch.setattr(_columns, "_DECODER", None)  # orjson instead of msgspec
    e = load(tmp_path / "c.json")
    for other in (c, d, e):
        assert other.strings == a.strings
        for col in ("kind", "name", "ts", "dur", "pid", "tid", "corr", "regs", "block"):
            assert np.array_equal(getattr(a, col), getattr(other, col)), col
        assert other.shapes == a.shapes


def test_without_msgspec_orjson_reads_the_same_columns(tmp_path):
    """msgspec is optional: with it unimportable, the package imports and a trace loads to
    the same columns (in a fresh interpreter, where the import is blocked)."""
    b = scenario()
    for i in range(20):
        fusible(b, 1000 + 100 * i)
    path = b.write(tmp_path / "a.json")
    code = (
        "import sys; sys.modules['msgspec'] = None\n"
        "import numpy as np\n"
        "from kernelab.trace import load\n"
        f"t = load({str(path)!r})\n"
        "np.savez(sys.argv[1], kind=t.kind, ts=t.ts, dur=t.dur, corr=t.corr)\n"
    )
    out = tmp_path / "cols.npz"
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, timeout=120)
    a, got = load(path), np.load(out)
    for col in ("kind", "ts", "dur", "corr"):
        assert np.array_equal(getattr(a, col), got[col]), col


def test_nesting_parents_match_a_stack_walk():
    rng = np.random.default_rng(0)
    spans = []  # random properly nested intervals on two threads, with zero-length ones

    def grow(thread, lo, hi, depth):
        t = lo
        while t < hi and depth < 5:
            a = int(rng.integers(t, min(hi, t + 10) + 1))
            b = int(rng.integers(a, a + (hi - a) // 2 + 1))
            spans.append((thread, a, b))
            if b > a:
                grow(thread, a, b, depth + 1)
            t = b + int(rng.integers(0, 3))

    grow(1, 0, 400, 0)
    grow(2, 0, 400, 0)
    spans.sort(key=lambda x: (x[0], x[1], -(x[2] - x[1])))
    th, s, e = (np.array(c) for c in zip(*spans, strict=True))
    expected, stack, last = [], [], None
    for i in range(len(s)):
        if th[i] != last:
            stack, last = [], th[i]
        while stack and e[stack[-1]] <= s[i] and s[stack[-1]] < s[i]:
            stack.pop()
        expected.append(stack[-1] if stack else -1)
        stack.append(i)
    assert len(spans) > 50
    assert nesting_parents(th, s, e).tolist() == expected


def test_set_and_percentile_helpers_agree_with_numpy():
    rng = np.random.default_rng(1)
    for n in (0, 1, 2, 7, 1000):
        a = rng.integers(-50, 50, n)
        b = rng.integers(-60, 60, max(n // 2, 1))
        assert distinct(a).tolist() == np.unique(a).tolist()
        assert member(a, b).tolist() == np.isin(a, b).tolist()
        assert not member(a, []).any()
        for q in (0, 10, 50, 90, 99.9, 100):
            if n:
                assert percentile(a, q) == pytest.approx(float(np.percentile(a, q)), rel=1e-12)
    # A wrong interpolation (nearest rank) would not pass:
    assert percentile(np.array([0, 10]), 25) == 2.5


def test_untrusted_names_are_data(tmp_path):
    b = TraceBuilder()
    b.launch("[bold red]evil[/]<script>alert(1)</script>", 0, 5, 10, 10)
    s = public(summarize(b.write(tmp_path / "e.json")))
    assert s["gpu"]["top_kernels"][0]["example"] == "[bold red]evil[/]<script>alert(1)</script>"


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "empty"),
        (b"{not json", "not valid JSON"),
        (b'{"foo": 1}', "no 'traceEvents'"),
        (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xab\xaeR", "gzip"),
    ],
)
def test_malformed_files_raise_one_line_errors(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as info:
        summarize(path)
    assert "\n" not in str(info.value)


def test_truncated_gzip(tmp_path):
    good = scenario().write(tmp_path / "t.json.gz").read_bytes()
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="gzip"):
        summarize(bad)


def test_no_events_and_cpu_only(tmp_path):
    with pytest.raises(NothingToAnalyse, match="nothing to analyse"):
        summarize(TraceBuilder().write(tmp_path / "empty.json"))
    b = TraceBuilder()
    b.annotation("ProfilerStep#0", 0, 100)
    b.cpu_op("aten::linear", 10, 50)
    b.cpu_op("aten::addmm", 20, 30)
    s = public(summarize(b.write(tmp_path / "cpu.json")))
    assert s["gpu"] is None
    ops = {o["name"]: o for o in s["cpu"]["ops"]}
    assert ops["aten::linear"]["self_us"] == 20 and ops["aten::addmm"]["self_us"] == 30
    assert s["cpu"]["overhead_share"] == 0.5


def test_event_order_in_the_file_does_not_matter(tmp_path, monkeypatch):
    """Times are relative to the first chunk's earliest event, so later chunks can hold
    negative times; every result must be the same as for a time-ordered file."""
    ordered = public(summarize(scenario().write(tmp_path / "o.json")))
    b = scenario()
    b.events.reverse()
    monkeypatch.setattr(_ingest, "_CHUNK_BYTES", 300)
    shuffled = public(summarize(b.write(tmp_path / "r.json")))
    for dev in (ordered, shuffled):
        for d in dev["gpu"]["breakdown"]:
            d.pop("start_ns")
        for r in dev["gpu"]["launch"]["replays"]:
            r.pop("launch_ts_ns"), r.pop("start_ns")
        # equal totals may list in either order
        dev["gpu"]["top_kernels"].sort(key=lambda k: (k["total_us"], k["name"]))
        dev["gpu"]["occupancy"]["kernels"].sort(key=lambda k: (k["time_us"], k["name"]))
    assert shuffled["gpu"] == ordered["gpu"]
    assert shuffled["gpu"]["breakdown"][0]["idle_us"] == 104


def test_collectives_and_gemms_break_fusion_runs(tmp_path):
    b = TraceBuilder()
    b.launch("void at::native::vectorized_elementwise_kernel<4, AddFunctor>(int)", 0, 5, 10, 3)
    b.launch("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWork*)", 6, 5, 14, 3)
    b.launch("void at::native::vectorized_elementwise_kernel<4, MulFunctor>(int)", 12, 5, 18, 3)
    b.launch("ampere_sgemm_128x64_tn", 18, 5, 22, 3)
    b.launch("void at::native::vectorized_elementwise_kernel<4, MulFunctor>(int)", 24, 5, 26, 3)
    fusion = public(summarize(b.write(tmp_path / "n.json")))["gpu"]["fusion"]
    assert fusion == {"candidates": [], "runs": 0}
    b.launch("void at::native::vectorized_elementwise_kernel<4, AddFunctor>(int)", 30, 5, 31, 3)
    fusion = public(summarize(b.write(tmp_path / "m.json")))["gpu"]["fusion"]
    assert fusion["runs"] == 1 and fusion["candidates"][0]["launches_saved"] == 1


def _rich_trace(tmp_path):
    """Many chunks (with a small chunk size), shapes, odd categories, a malformed event and a
    name first seen late: everything a worker must send back."""
    b = scenario()
    for i in range(40):
        fusible(b, 1000 + 100 * i)
        b._x("cpu_op", f"late_op_{i}", 1050 + 100 * i, 2, 1, 1, {"External id": i})
        if i % 7 == 0:
            b._x("my_custom_category", f"custom {i}", 1000 + 100 * i, 1, 1, 1)
    bad = b._x("cpu_op", "bad times", 0, 0, 1, 1)
    bad["ts"], bad["dur"] = "soon", "long"  # malformed: counted, not kept
    b.cpu_op("aten::mm", 500, 5, dims=[[2, 3], [3, 4]], types=["float", "float"])
    return b.write(tmp_path / "rich.json.gz")


COLUMN_NAMES = ("kind", "name", "ts", "dur", "pid", "tid", "corr", "regs", "shmem", "block")
COLUMN_NAMES += ("grid", "nbytes")


def _same_trace(a, b) -> None:
    assert a.strings == b.strings
    assert a.shapes == b.shapes
    assert a.meta == b.meta
    assert a.unknown_categories == b.unknown_categories
    assert a.malformed == b.malformed
    for col in COLUMN_NAMES:
        assert np.array_equal(getattr(a, col), getattr(b, col)), col


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_several_workers_read_exactly_what_one_reads(tmp_path, monkeypatch):
    path = _rich_trace(tmp_path)
    monkeypatch.setattr(_ingest, "_CHUNK_BYTES", 2048)  # dozens of chunks, shared unevenly
    monkeypatch.setattr(_ingest, "_PIECE_BYTES", 1000)
    monkeypatch.setattr(_columns._Store, "FIRST", 1)  # the columns grow many times in every process
    one = load(path)
    assert one.ingest == {"workers": 1, "worker_peak_rss": []}
    assert one.malformed == 1 and one.unknown_categories == {"my_custom_category": 6}
    assert len(one.shapes) > 40
    for n in (2, 3):
        many = load(path, workers=n)
        assert many.ingest["workers"] == n and len(many.ingest["worker_peak_rss"]) == n - 1
        _same_trace(one, many)
    assert public(summarize(path, workers=3))["gpu"] == public(summarize(path))["gpu"]


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_failed_worker_means_one_process_reads_again(tmp_path, monkeypatch):
    path = _rich_trace(tmp_path)
    monkeypatch.setattr(_ingest, "_CHUNK_BYTES", 2048)
    monkeypatch.setattr(_ingest, "_PIECE_BYTES", 1000)
    one = load(path)
    # A worker whose output does not match its header, then one that dies before writing.
    monkeypatch.setattr(_columns._Columns, "export", lambda self: [(99).to_bytes(8, "little")])
    garbled = load(path, workers=2)
    assert garbled.ingest == {"workers": 1, "worker_peak_rss": []}
    _same_trace(one, garbled)
    monkeypatch.setattr(_columns._Columns, "export", lambda self: __import__("os")._exit(3))
    died = load(path, workers=2)
    assert died.ingest["workers"] == 1
    _same_trace(one, died)


def test_worker_counts_are_checked(tmp_path, monkeypatch):
    path = _rich_trace(tmp_path)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="workers: expected a whole number"):
            load(path, workers=bad)
    monkeypatch.setenv("KERNELAB_TRACE_WORKERS", "many")
    with pytest.raises(ValueError, match="KERNELAB_TRACE_WORKERS"):
        load(path, workers=None)
    monkeypatch.setenv("KERNELAB_TRACE_WORKERS", "1")
    assert load(path, workers=None).ingest["workers"] == 1
    monkeypatch.delenv("KERNELAB_TRACE_WORKERS")
    assert load(path, workers=None).ingest["workers"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_one_decoding_process_unless_asked_even_on_idle_cpus(tmp_path, monkeypatch):
    """Forked decoders shorten the wall time on idle CPUs but always cost CPU time: the
    default is one process, whatever the trace's size, the CPUs and the load."""
    path = _rich_trace(tmp_path)
    monkeypatch.setattr(_ingest, "_CHUNK_BYTES", 2048)  # dozens of chunks to share
    monkeypatch.delenv("KERNELAB_TRACE_WORKERS", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(_ingest.os, "sched_getaffinity", lambda _pid: set(range(8)), raising=False)
    monkeypatch.setattr(_ingest.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert _ingest._workers(None) == 1
    assert load(path, workers=None).ingest["workers"] == 1
    assert summarize(path, workers=None)["ingest"]["workers"] == 1
    monkeypatch.setenv("KERNELAB_TRACE_WORKERS", "3")
    assert _ingest._workers(None) == 3
    assert load(path, workers=None).ingest["workers"] == 3
    assert _ingest._workers(3) == 3  # asked for: as asked


def test_column_store_grows_in_place_and_keeps_every_row(monkeypatch):
    monkeypatch.setattr(_columns._Store, "FIRST", 3)
    store = _columns._Store()
    rng = np.random.default_rng(0)
    chunks = []
    for m in (1, 5, 0, 40, 2, 300, 7):  # grows past its capacity several times
        chunk = {
            k: rng.integers(-(2**31), 2**31, size=m).astype(dt)
            for k, dt in _columns.COLUMNS.items()
        }
        assert store.append(chunk) == sum(len(c["kind"]) for c in chunks)
        chunks.append(chunk)
    cols = store.take()
    for k, dt in _columns.COLUMNS.items():
        assert cols[k].dtype == dt and len(cols[k]) == 355, k
        assert np.array_equal(cols[k], np.concatenate([c[k] for c in chunks])), k
    assert store.n == 0 and len(store.take()["ts"]) == 0


def test_shape_table_numbers_equal_shapes_once_however_written():
    import msgspec

    table = _columns._ShapeTable(msgspec.json.decode)
    a = table.of([[8, 4096], [4096, 4096]], ["float", "float"])
    assert table.of([[8, 4096], [4096, 4096]], ["float", "float"]) == a  # equal, new objects
    b = table.of([[8, 4096], [4096, 4096]], ["c10::BFloat16", "c10::BFloat16"])
    assert b != a and table.pairs[a] == ([[8, 4096], [4096, 4096]], ["float", "float"])
    compact = (b"[[8,4096],[4096,4096]]", b'["float","float"]')
    indented = (b"[\n  [8, 4096],\n  [4096, 4096]\n]", b'[ "float", "float" ]')
    assert table.texts[compact] == a and table.texts[indented] == a
    # Not both lists, or not JSON on its own: no shape, and nothing added.
    assert table.of(None, ["float"]) == -1 and table.of([[1]], "float") == -1
    assert table.texts[(b"[[1]", b"[]")] == -1 and table.texts[(b"{}", b"[]")] == -1
    assert len(table.pairs) == 2
