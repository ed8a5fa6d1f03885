"""Clocks for bench: a host timer for the CPU device, device events and graphs for GPUs.

Both timers expose the same few methods, so everything above them (warm-up, stopping rule,
integrity checks) is the same code on every device and is tested on the CPU:

- ``samples(fn, n, calls, before, after)``: ``n`` samples of ``calls`` back-to-back calls
  each, returning per-call seconds and the last call's result; ``before()`` (a cache flush,
  an input restore, the next input set) runs before each sample and ``after(result)`` (a
  copy of the sample's last output, to check later) after it, both outside the timed window;
- ``sync()``: wait for all device work;
- ``dispatch(fn, calls)``: host seconds per call to issue ``calls`` calls, without a sync;
- ``graph(fn, calls)``: per-call seconds of replaying ``calls`` captured calls (GPU only).

The GPU timer enqueues all samples of a batch with events around each and synchronises once
at the end: nothing synchronises inside the timed loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class HostTimer:
    """perf_counter_ns around each sample; the CPU device runs calls synchronously."""

    kind = "host"

    def __init__(self, threads: int | None = None):
        self.threads = threads if threads is not None else torch.get_num_threads()

    def sync(self) -> None:
        return None

    def samples(
        self, fn: Callable[[], object], n: int, calls: int = 1, before=None, after=None
    ) -> tuple[list[float], object]:
        clock = time.perf_counter_ns
        out, result = [], None
        for _ in range(n):
            if before is not None:
                before()
            t0 = clock()
            for _ in range(calls):
                result = fn()
            out.append((clock() - t0) * 1e-9 / calls)
            if after is not None:
                after(result)
        return out, result

    def dispatch(self, fn: Callable[[], object], calls: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return (time.perf_counter_ns() - t0) * 1e-9 / calls

    def graph(self, fn: Callable[[], object], calls: int) -> float | None:
        return None  # no graphs on the host: kernel time and call time are the same thing


class DeviceTimer:
    """Device events (CUDA or ROCm through torch); one synchronisation per batch."""

    kind = "device-events"

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.threads = torch.get_num_threads()

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def samples(
        self, fn, n: int, calls: int = 1, before=None, after=None
    ) -> tuple[list[float], object]:
        event = torch.cuda.Event
        starts = [event(enable_timing=True) for _ in range(n)]
        ends = [event(enable_timing=True) for _ in range(n)]
        result = None
        for i in range(n):
            if before is not None:
                before()
            starts[i].record()
            for _ in range(calls):
                result = fn()
            ends[i].record()
            if after is not None:
                after(result)  # enqueued after the end event: outside the timed window
        self.sync()
        return [s.elapsed_time(e) * 1e-3 / calls for s, e in zip(starts, ends, strict=True)], result

    def dispatch(self, fn, calls: int) -> float:
        self.sync()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        elapsed = (time.perf_counter_ns() - t0) * 1e-9 / calls
        self.sync()
        return elapsed

    def graph(self, fn, calls: int) -> float | None:
        """Per-call seconds of a CUDA-graph replay of ``calls`` calls (kernel time only)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        self.sync()
        times, _ = self.samples(graph.replay, 5, 1)
        del graph
        return sorted(times)[len(times) // 2] / calls


def timer_for(device: torch.device | str, threads: int | None = None):
    dev = torch.device(device)
    return HostTimer(threads) if dev.type == "cpu" else DeviceTimer(dev)
