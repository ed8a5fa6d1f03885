"""What the bench harness itself costs, on the CPU.

1. The timer's floor: what a no-op call measures with the host timer (clock overhead).
2. Harness overhead per sample: wall time of the sampling loop per sample (timer, stopping
   rule, telemetry poll, bookkeeping) minus the time of the calls themselves, for a no-op
   candidate, hot (no flush) and cold (the flush shown on its own).
3. Fixed cost of a case around the loop (warm-up, reference, integrity checks), for a no-op
   candidate on a small shape.
4. Wall time of ``kernelab bench`` on the default suite (every op, representative shapes,
   every dtype, the variants timed on this device), in a subprocess.

    PYTHONPATH=src python benchmarks/bench_overhead.py [--skip-suite]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import triton

from kernelab.bench import BenchConfig, Ceilings, StopRule, Subject
from kernelab.bench.cache import Flush, cache_bytes
from kernelab.bench.runner import bench_case
from kernelab.bench.timers import HostTimer
from kernelab.hardware import detect
from kernelab.ops import RMSNORM, Shape

N = 2000


def noop(**_):
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--skip-suite", action="store_true", help="skip the kernelab bench run")
    args = p.parse_args()
    info = detect("cpu")
    print(f"machine: {info.name}, {info.sm_count} CPUs, torch threads {info.threads}")
    versions = f"torch {torch.__version__}, triton {triton.__version__}"
    print(f"python {platform.python_version()}, {versions}")

    timer = HostTimer()
    xs, _ = timer.samples(lambda: None, N)
    print(f"1. timer floor (no-op, 1 call/sample): median {statistics.median(xs) * 1e9:.0f} ns")

    shape = Shape("tiny 1x64", {"rows": 1, "cols": 64}, {"residual": False}, "rows")
    ceil = Ceilings(info.key)
    rule = StopRule(rel_ci=1e-9, min_samples=N, min_time=0.0, max_time=60.0, max_samples=N)
    for mode in ("hot", "cold"):
        t0 = time.perf_counter()
        case = bench_case(
            RMSNORM,
            shape,
            torch.float32,
            [Subject("noop", noop, "candidate")],
            info,
            timer,
            ceil,
            BenchConfig(mode=mode, rule=rule, energy_window_s=0),
        )[0]
        total = time.perf_counter() - t0
        m = case["metrics"]
        busy = sum(case["samples"]) * m["calls_per_sample"]
        per = (m["sampling_wall_s"] - busy) / m["n"]
        line = f"2. {mode}: harness overhead {per * 1e6:.2f} µs/sample over {m['n']} samples"
        line += f" ({m['calls_per_sample']} call(s)/sample)"
        if mode == "cold":
            flush = Flush("cpu", cache_bytes(info)[0])
            fx, _ = timer.samples(flush, 20)
            line += f"; of which the flush {statistics.median(fx) * 1e6:.0f} µs"
            line += f" ({flush.nbytes >> 20} MiB)"
        print(line)
        loop = m["sampling_wall_s"]
        print(f"3. {mode}: whole case {total:.2f} s, sampling loop {loop:.2f} s")

    if args.skip_suite:
        return
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, KERNELAB_LEDGER=os.path.join(tmp, "l.sqlite"))
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "kernelab", "bench", "--device", "cpu", "--json"]
        proc = subprocess.run(cmd, capture_output=True, env=env, text=True)
        wall = time.perf_counter() - t0
    import json

    cases = json.loads(proc.stdout)["cases"] if proc.stdout.strip() else []
    print(
        f"4. kernelab bench --device cpu (default suite): {wall:.1f} s wall, "
        f"{len(cases)} cases, exit {proc.returncode} (ceilings measured into a fresh ledger)"
    )


if __name__ == "__main__":
    main()
