"""bench on a CUDA or ROCm device: device events, graphs, and a cheat that hides work on
another stream. Skipped without a GPU."""

import pytest
import torch

from kernelab.bench import BenchConfig, StopRule, Subject, roofline
from kernelab.bench.runner import bench_case
from kernelab.bench.telemetry import open_telemetry
from kernelab.bench.timers import DeviceTimer
from kernelab.hardware import detect
from kernelab.ops import RMSNORM, Shape
from kernelab.ops.norm.rmsnorm import rmsnorm_torch

pytestmark = pytest.mark.cuda
RULE = StopRule(rel_ci=0.05, min_samples=10, min_time=0.0, max_time=0.5)
SHAPE = Shape("gpu 256x4096", {"rows": 256, "cols": 4096}, {"residual": False}, "rows")


def run(*subjects, variants=("torch", "kernelab"), mode="auto"):
    info = detect("cuda")
    subs = [*subjects] + [
        Subject(v, RMSNORM.variants[v].fn, RMSNORM.variants[v].kind) for v in variants
    ]
    cfg = BenchConfig(mode=mode, rule=RULE, energy_window_s=0.2)
    cases = bench_case(
        RMSNORM,
        SHAPE,
        torch.bfloat16,
        subs,
        info,
        DeviceTimer("cuda"),
        roofline.resolve(info),
        cfg,
        open_telemetry(info),
    )
    return {c["variant"]: c for c in cases}


def test_device_timer_events_and_graph():
    timer = DeviceTimer("cuda")
    a = torch.randn(1 << 20, device="cuda")
    xs, out = timer.samples(lambda: a * 2, 5, 10)
    assert len(xs) == 5 and all(x > 0 for x in xs) and out.device.type == "cuda"
    kernel = timer.graph(lambda: a.mul_(1.0), 20)
    assert kernel is not None and kernel > 0
    assert timer.dispatch(lambda: a * 2, 10) > 0


def test_variants_on_gpu_are_valid_with_graph_and_overhead():
    cases = run()
    for name in ("torch", "kernelab"):
        m = cases[name]["metrics"]
        assert m["valid"], cases[name]["flags"]
        assert m["graph_kernel_s"] > 0 and m["launch_overhead_s"] is not None
        assert m["host_dispatch_s"] > 0 and 0 < m["pct_roofline"] <= 100
        assert cases[name]["timer"] == "device-events" and cases[name]["mode"] == "cold"


def test_work_hidden_on_another_stream_is_flagged():
    side = torch.cuda.Stream()

    def hidden(x, weight, eps=1e-6, residual=None, out=None):
        out = torch.empty_like(x)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(2_000_000)
            out.copy_(rmsnorm_torch(x, weight, eps))
        return out

    case = run(Subject("hidden", hidden, "candidate"), variants=())["hidden"]
    assert not case["metrics"]["valid"]
    assert any(
        f.startswith(("host/device disagreement", "work left running")) for f in case["flags"]
    ), case["flags"]
