"""Ceilings and the roofline: what a measured time is worth against the speed of light.

A ceiling is a memory bandwidth and a compute rate per dtype. Measured ceilings (``kernelab
ceilings``: a large device copy counting bytes read plus written, a large matmul) are used
where stored; datasheet peaks from :mod:`kernelab.hardware` otherwise; every result says which.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from kernelab._host import torch_threads
from kernelab.bench.timers import timer_for
from kernelab.core import dtype_name

COPY = "copy_bytes_per_s"
MATMUL = "matmul_flops_"  # + dtype name, e.g. matmul_flops_bfloat16

#: A measured copy is a practical ceiling a kernel may beat by a little (fewer DRAM page
#: switches, no read-for-ownership); only a time this far below the measured floor is invalid.
MEASURED_SLACK = 0.10


@dataclass(frozen=True)
class Ceilings:
    """Memory bandwidth (bytes/s) and compute peaks (FLOP/s by dtype name), with sources."""

    device_key: str
    bandwidth: float | None = None
    bandwidth_source: str = "none"
    flops: dict[str, float] = field(default_factory=dict)
    flops_source: dict[str, str] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return self.bandwidth_source.startswith("measured")

    def peak(self, dtype: torch.dtype | str) -> tuple[float | None, str]:
        name = dtype if isinstance(dtype, str) else dtype_name(dtype)
        if name in self.flops:
            return self.flops[name], self.flops_source.get(name, "?")
        return None, "none"

    def compute_peak(self, cost, dtype: torch.dtype | str) -> tuple[float | None, str]:
        """The peak a cost's multiplies are bounded by, and the format it was read for.

        The cost's own compute format where it has one (``Cost.compute``); where this device
        has no tensor cores of that format, the formats it converts to exactly, fastest first
        (e2m1 → e4m3), then the case's dtype. The floor is a bound no correct kernel can beat:
        a peak taken too low would call an honest time impossible, so the fastest rate an
        implementation could use is the one that counts.
        """
        case = dtype if isinstance(dtype, str) else dtype_name(dtype)
        compute = getattr(cost, "compute", None)
        for name in (*_UPCASTS.get(compute, (compute,)), case) if compute else (case,):
            peak, _ = self.peak(name)
            if peak:
                return peak, name
        return None, case

    def source(self, dtype: torch.dtype | str) -> str:
        _, fsrc = self.peak(dtype)
        return f"memory: {self.bandwidth_source}; compute: {fsrc}"

    def as_dict(self) -> dict:
        return {
            "device_key": self.device_key,
            "bandwidth_bytes_per_s": self.bandwidth,
            "bandwidth_source": self.bandwidth_source,
            "flops": dict(self.flops),
            "flops_source": dict(self.flops_source),
        }


_SPEC_DTYPES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float8_e4m3fn": "fp8",
    "float4_e2m1fn_x2": "fp4",
}

#: A compute format and those it converts to exactly, fastest first (every e2m1 value is an
#: e4m3 value): where a device lacks the first, a kernel may run on the next.
_UPCASTS = {"float4_e2m1fn_x2": ("float4_e2m1fn_x2", "float8_e4m3fn")}


def datasheet(spec, device_key: str | None = None) -> Ceilings:
    """Ceilings from a :class:`~kernelab.hardware.DeviceSpec` (datasheet peaks)."""
    src = f"datasheet {spec.name}"
    flops = {d: spec.peak_for(s) for d, s in _SPEC_DTYPES.items() if spec.peak_for(s)}
    return Ceilings(
        device_key or spec.name, spec.hbm_bytes_per_s, src, flops, dict.fromkeys(flops, src)
    )


def resolve(info, stored: dict[str, dict] | None = None) -> Ceilings:
    """Measured ceilings where stored for this device, datasheet peaks for the rest.

    ``stored`` is the ledger's ``{name: {value, unit, source, measured}}`` for ``info.key``.
    """
    base = datasheet(info.spec, info.key) if info.spec is not None else Ceilings(info.key)
    bandwidth, bsrc = base.bandwidth, base.bandwidth_source
    flops, fsrc = dict(base.flops), dict(base.flops_source)
    for name, row in (stored or {}).items():
        when = str(row.get("measured") or "")[:19]
        src = f"measured {when} ({row.get('source', '')})".replace(" ()", "")
        if name == COPY:
            bandwidth, bsrc = float(row["value"]), src
        elif name.startswith(MATMUL):
            dt = name.removeprefix(MATMUL)
            flops[dt], fsrc[dt] = float(row["value"]), src
    return Ceilings(info.key, bandwidth, bsrc, flops, fsrc)


def roofline(cost, seconds: float, ceilings: Ceilings, dtype, *, in_cache: bool = False) -> dict:
    """Achieved rates, the floor, % of roofline, the bound, and whether the time is plausible.

    ``in_cache``: the working set may sit in cache (hot mode, small data), so the memory term
    of the floor does not apply and only the compute term can make a time invalid.
    """
    peak, compute = ceilings.compute_peak(cost, dtype)
    bw = ceilings.bandwidth
    t_mem = cost.bytes / bw if bw else 0.0
    t_flop = cost.flops / peak if peak else 0.0
    floor = max(t_mem, t_flop) if (bw or peak) else None
    gate = t_flop if in_cache else floor
    out = {
        "gbps": cost.bytes / seconds / 1e9 if seconds > 0 else None,
        "tflops": cost.flops / seconds / 1e12 if seconds > 0 else None,
        "bytes": cost.bytes,
        "flops": cost.flops,
        "floor_s": floor,
        "bound": None if floor is None else ("compute" if t_flop > t_mem else "memory"),
        "pct_roofline": (100.0 * floor / seconds) if floor and seconds > 0 else None,
        "ceiling_source": ceilings.source(compute),
        "below_floor": False,
    }
    if gate:
        slack = MEASURED_SLACK if ceilings.measured else 0.0
        out["below_floor"] = seconds < gate * (1.0 - slack)
    return out


# --- measuring ceilings ------------------------------------------------------------------


def measure_copy(device, nbytes: int, samples: int = 20) -> float:
    """Copy bandwidth in bytes/s, counting bytes read plus written, of a ``nbytes`` copy.

    A ceiling is what the device can do, and on a shared host other work only ever slows a
    measurement down (a ceiling measured too low would make honest kernels look faster than
    light). GPU: the best of ``samples`` whole copies. CPU: :func:`_host_copy_rate`, the copy
    timed in chunks that fit in a scheduler's time slice, on all threads and on one.
    """
    dev = torch.device(device)
    gen = torch.Generator(device=dev.type).manual_seed(0)
    # random bytes, a 1 MiB block of them repeated: drawing all of a CPU's copy (four times
    # its last-level cache, 2 GiB on some hosts) one by one takes seconds; a period of 1 MiB
    # is as incompressible to a memory system as a sequence that never repeats
    block = min(nbytes, 1 << 20)
    src = torch.randint(0, 255, (block,), dtype=torch.uint8, device=dev, generator=gen)
    src = src.repeat(-(-nbytes // block))[:nbytes]
    dst = torch.empty_like(src)
    timer = timer_for(dev)
    dst.copy_(src)
    timer.sync()
    if dev.type == "cpu":
        return _host_copy_rate(src, dst, passes=max(2, samples // 8))
    times, _ = timer.samples(lambda: dst.copy_(src), samples)
    return 2 * nbytes / min(times)


#: CPU copy ceilings: chunk size, and the quantile of the chunks' rates taken.
COPY_CHUNK = 8 * 2**20
COPY_QUANTILE = 0.9


def _host_copy_rate(src: torch.Tensor, dst: torch.Tensor, passes: int) -> float:
    """Bytes/s (read + write) of ``dst.copy_(src)`` on the host: each pass copies the whole
    buffer (larger than the cache, so every chunk comes from memory) chunk by chunk, each
    chunk timed alone; the rate is the 90th percentile of the chunks' rates, over passes on
    all threads and on one, or the best whole pass if that is higher.

    Why chunks: on a loaded host a copy of gigabytes spans many time slices and is timed with
    the other processes' share in it (a 1920 MiB copy measured 1.5 GB/s at load 9 on 2
    cores), while a kernel of microseconds runs within one slice at full speed and was called
    faster than the ceiling. An 8 MiB chunk takes a millisecond or two, shorter than a slice;
    chunks cut by a preemption are slow and fall below the quantile. One thread too: a copy
    split over every core waits for its slowest part when another process is busy on one,
    and a one-thread kernel does not."""
    rates, whole = [], 0.0
    n = src.numel()
    clock = time.perf_counter_ns
    for threads in (torch.get_num_threads(), 1):
        with torch_threads(threads):
            for _ in range(passes):
                start = clock()
                for lo in range(0, n, COPY_CHUNK):
                    hi = min(n, lo + COPY_CHUNK)
                    t0 = clock()
                    dst[lo:hi].copy_(src[lo:hi])
                    rates.append(2 * (hi - lo) / max(clock() - t0, 1) * 1e9)
                whole = max(whole, 2 * n / max(clock() - start, 1) * 1e9)
    rates.sort()
    return max(whole, rates[min(len(rates) - 1, int(COPY_QUANTILE * len(rates)))])


def measure_matmul(device, n: int, dtype: torch.dtype, samples: int = 5) -> float:
    """FLOP/s of an ``n``³ matmul on random data (never zeros: they run faster); best of
    ``samples``, as for the copy."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev.type).manual_seed(0)
    a = torch.randn((n, n), device=dev, generator=gen).to(dtype)
    b = torch.randn((n, n), device=dev, generator=gen).to(dtype)
    timer = timer_for(dev)
    torch.matmul(a, b)
    timer.sync()
    times, _ = timer.samples(lambda: torch.matmul(a, b), samples)
    return 2 * n**3 / min(times)


def measure(info, cache_size: int, progress=None) -> list[dict]:
    """Measure the device's copy bandwidth and matmul rates; rows ready for the ledger.

    GPU: a 1 GiB copy (far beyond any L2) and 8192³ matmuls in bf16 and fp16; CPU: a copy of
    at least four times the last-level cache and a 1024³ float32 matmul (modest, a second).
    """
    dev = "cpu" if info.type == "cpu" else f"cuda:{info.index}"
    if info.type == "cpu":
        nbytes = max(4 * cache_size, 64 * 2**20)
        plans = [(1024, torch.float32)]
    else:
        nbytes = max(4 * cache_size, 2**30)
        plans = [(8192, torch.bfloat16), (8192, torch.float16), (4096, torch.float32)]
    if progress:
        progress(f"ceilings: copy {nbytes / 2**20:.0f} MiB")
    rows = [
        {
            "name": COPY,
            "value": measure_copy(dev, nbytes),
            "unit": "B/s",
            "source": f"copy {nbytes / 2**20:.0f} MiB, read+write",
        }
    ]
    for n, dtype in plans:
        if progress:
            progress(f"ceilings: matmul {n}³ {dtype_name(dtype)}")
        value = measure_matmul(dev, n, dtype)
        if math.isfinite(value) and value > 0:
            rows.append(
                {
                    "name": MATMUL + dtype_name(dtype),
                    "value": value,
                    "unit": "FLOP/s",
                    "source": f"matmul {n}^3 {dtype_name(dtype)}",
                }
            )
    return rows
