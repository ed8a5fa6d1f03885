"""Device telemetry, where present: SM clock, temperature, power, throttling, energy.

NVIDIA through nvidia-ml-py (``pynvml``), AMD through ``amdsmi``; both optional. Without them
(and on the CPU) a :class:`NoTelemetry` answers, and results say that telemetry was absent.
Energy per call comes from the device's total-energy counter over a window long enough for
it to tick (NVML updates it every 20-100 ms; HARDWARE.md, "Energy").
"""

from __future__ import annotations

import contextlib
import importlib
import time

#: NVML clock-event bits that mean the clock was held down (not idle or a user setting):
#: SW power cap, HW slowdown, SW thermal, HW thermal, HW power brake.
NVML_THROTTLE_BITS = {
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
}


class NoTelemetry:
    available = False
    source = "none"

    def snapshot(self) -> dict:
        return {}

    def throttle(self) -> list[str]:
        return []

    def energy_j(self) -> float | None:
        return None


class NvmlTelemetry:
    available = True
    source = "nvml"

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle

    @classmethod
    def open(cls, index: int, uuid: str | None = None):
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
        handle = None
        if uuid:
            with contextlib.suppress(Exception):
                text = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
                handle = nvml.nvmlDeviceGetHandleByUUID(text)
        if handle is None:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return cls(nvml, handle)

    def snapshot(self) -> dict:
        n, h, out = self.nvml, self.handle, {}
        with contextlib.suppress(Exception):
            out["sm_clock_mhz"] = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        with contextlib.suppress(Exception):
            out["temperature_c"] = n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
        with contextlib.suppress(Exception):
            out["power_w"] = n.nvmlDeviceGetPowerUsage(h) / 1000.0
        out["throttle"] = self.throttle()
        return out

    def throttle(self) -> list[str]:
        n, h = self.nvml, self.handle
        getter = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            n, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if getter is None:
            return []
        try:
            bits = int(getter(h))
        except Exception:
            return []
        return [name for bit, name in NVML_THROTTLE_BITS.items() if bits & bit]

    def energy_j(self) -> float | None:
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
        except Exception:
            return None


class AmdTelemetry:
    available = True
    source = "amdsmi"

    def __init__(self, smi, handle):
        self.smi, self.handle = smi, handle

    @classmethod
    def open(cls, index: int):
        smi = importlib.import_module("amdsmi")
        smi.amdsmi_init()
        return cls(smi, smi.amdsmi_get_processor_handles()[index])

    def snapshot(self) -> dict:
        s, h, out = self.smi, self.handle, {}
        with contextlib.suppress(Exception):
            out["sm_clock_mhz"] = s.amdsmi_get_clock_info(h, s.AmdSmiClkType.GFX)["clk"]
        with contextlib.suppress(Exception):
            out["temperature_c"] = s.amdsmi_get_temp_metric(
                h, s.AmdSmiTemperatureType.HOTSPOT, s.AmdSmiTemperatureMetric.CURRENT
            )
        with contextlib.suppress(Exception):
            info = s.amdsmi_get_power_info(h)
            out["power_w"] = float(
                info.get("average_socket_power") or info.get("current_socket_power")
            )
        out["throttle"] = self.throttle()
        return out

    def throttle(self) -> list[str]:
        with contextlib.suppress(Exception):
            status = self.smi.amdsmi_get_gpu_metrics_info(self.handle).get("throttle_status")
            if status not in (None, 0, "N/A"):
                return [f"throttle-status-{status}"]
        return []

    def energy_j(self) -> float | None:
        try:
            e = self.smi.amdsmi_get_energy_count(self.handle)
            acc = e.get("energy_accumulator", e.get("power"))
            return float(acc) * float(e["counter_resolution"]) * 1e-6
        except Exception:
            return None


def open_telemetry(info):
    """Telemetry for the device described by ``info``; :class:`NoTelemetry` when unavailable."""
    if info.type == "cpu":
        return NoTelemetry()
    try:
        if info.vendor == "amd":
            return AmdTelemetry.open(info.index)
        uuid = None
        with contextlib.suppress(Exception):
            import torch

            uuid = str(torch.cuda.get_device_properties(info.index).uuid)
        return NvmlTelemetry.open(info.index, uuid)
    except Exception:
        return NoTelemetry()


def energy_per_call(fn, timer, telemetry, calls_per_batch: int, min_window: float = 0.5):
    """Joules per call from the energy counter over a window of at least ``min_window`` s.

    The window is synchronised at both ends and extended (up to 4×) until the counter ticks.
    Returns None without an energy counter.
    """
    timer.sync()
    e0 = telemetry.energy_j()
    if e0 is None:
        return None
    t0, calls, window = time.perf_counter(), 0, min_window
    while True:
        for _ in range(calls_per_batch):
            fn()
        calls += calls_per_batch
        timer.sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= window:
            e1 = telemetry.energy_j()
            if e1 is not None and e1 > e0:
                return {"joules_per_call": (e1 - e0) / calls, "window_s": elapsed, "calls": calls}
            if window >= 4 * min_window:
                return None
            window *= 2
