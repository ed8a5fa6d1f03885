"""Telemetry logic on the CPU with stand-in counters: energy windows, throttle flags."""

import time
from types import SimpleNamespace

import pytest
import torch

from kernelab.bench import BenchConfig, Ceilings, StopRule, Subject
from kernelab.bench.runner import bench_case
from kernelab.bench.telemetry import NoTelemetry, NvmlTelemetry, energy_per_call
from kernelab.bench.timers import HostTimer
from kernelab.hardware import detect
from kernelab.ops import RMSNORM, Shape


class Counter:
    """An energy counter that only moves every ``tick`` seconds, as NVML's does."""

    available, source = True, "fake"

    def __init__(self, joules_per_call: float, tick: float, throttle=()):
        self.per, self.tick, self.calls, self.shown, self.last = joules_per_call, tick, 0, 0.0, 0
        self._throttle = list(throttle)

    def call(self):
        self.calls += 1

    def energy_j(self):
        now = time.monotonic()
        if now - self.last >= self.tick:
            self.shown, self.last = self.calls * self.per, now
        return self.shown

    def throttle(self):
        return list(self._throttle)

    def snapshot(self):
        return {"sm_clock_mhz": 1980, "temperature_c": 50, "power_w": 500.0}


def test_energy_per_call_over_a_window_that_ticks():
    c = Counter(0.5, tick=0.02)
    c.energy_j()
    e = energy_per_call(c.call, HostTimer(), c, calls_per_batch=100, min_window=0.1)
    assert e is not None and e["window_s"] >= 0.1
    assert e["joules_per_call"] == pytest.approx(0.5, rel=0.5)  # the last tick lags the calls


def test_energy_without_a_counter_or_without_a_tick_is_none():
    assert energy_per_call(lambda: None, HostTimer(), NoTelemetry(), 10, 0.01) is None
    frozen = Counter(0.5, tick=1e9)
    frozen.energy_j()
    assert energy_per_call(frozen.call, HostTimer(), frozen, 10, min_window=0.01) is None


def test_nvml_throttle_bits_and_snapshot():
    nvml = SimpleNamespace(
        NVML_CLOCK_SM=0,
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetClockInfo=lambda h, k: 1755,
        nvmlDeviceGetTemperature=lambda h, k: 61,
        nvmlDeviceGetPowerUsage=lambda h: 612_000,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x1 | 0x2 | 0x4 | 0x40,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 123_456,
    )
    t = NvmlTelemetry(nvml, handle=object())
    assert t.throttle() == ["sw-power-cap", "hw-thermal"]  # idle and app clocks are not
    snap = t.snapshot()
    assert snap["sm_clock_mhz"] == 1755 and snap["power_w"] == 612.0
    assert t.energy_j() == pytest.approx(123.456)


def test_throttled_samples_are_flagged_but_still_reported():
    shape = Shape("t 8x256", {"rows": 8, "cols": 256}, {"residual": False}, "rows")
    rule = StopRule(rel_ci=0.5, min_samples=5, min_time=0.0, max_time=0.2, max_samples=30)
    case = bench_case(
        RMSNORM,
        shape,
        torch.float32,
        [Subject("torch", RMSNORM.variants["torch"].fn, "torch")],
        detect("cpu"),
        HostTimer(),
        Ceilings("test", 250e9, "test", {}, {}),
        BenchConfig(mode="hot", rule=rule, energy_window_s=0),
        Counter(0.1, 0.02, throttle=["hw-thermal"]),
    )[0]
    n = case["metrics"]["n"]
    assert f"throttled: {n} of {n} samples" in case["flags"]
    assert case["metrics"]["throttled_samples"] == n and case["metrics"]["valid"]
    assert case["metrics"]["sm_clock_mhz"] == 1980
