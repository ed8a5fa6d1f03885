"""bench: how fast, measured so that the number can be trusted (METHOD.md, "Time properly").

Modules: :mod:`~kernelab.bench.timers` (host timer; device events and graphs),
:mod:`~kernelab.bench.stats` (statistics, stopping rule), :mod:`~kernelab.bench.cache`
(cold-cache flush), :mod:`~kernelab.bench.telemetry` (NVML / amdsmi, optional),
:mod:`~kernelab.bench.roofline` (ceilings, floors), :mod:`~kernelab.bench.integrity`
(checks against cheats), :mod:`~kernelab.bench.rotation` (input sets rotated in the timed
loop), :mod:`~kernelab.bench.threads` (CPU time per thread around it),
:mod:`~kernelab.bench.runner` (the timed loop),
:mod:`~kernelab.bench.api` (the Python API) and :mod:`~kernelab.bench.stage`.
"""

from kernelab.bench import rotation, threads
from kernelab.bench.api import bench, candidate, ceilings_for, floors, open_ledger
from kernelab.bench.roofline import Ceilings
from kernelab.bench.runner import BenchConfig, BenchInterrupted, BenchResult, Subject
from kernelab.bench.stage import stage
from kernelab.bench.stats import StopRule, Summary, summarize

__all__ = [
    "BenchConfig",
    "BenchInterrupted",
    "BenchResult",
    "Ceilings",
    "StopRule",
    "Subject",
    "Summary",
    "bench",
    "candidate",
    "ceilings_for",
    "floors",
    "open_ledger",
    "rotation",
    "stage",
    "summarize",
    "threads",
]
