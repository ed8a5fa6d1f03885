"""What the benchmark scripts share: the cold-L2 device-event timer and the H200's measured
copy bandwidth. (``kernelab bench`` is the full instrument; these scripts time a few callables
side by side with the least machinery.)"""

from __future__ import annotations

import statistics

import torch

MEASURED_COPY_H200 = 4.3e12  # bytes read + written per second, HARDWARE.md (one run)


def cold_median(fn, samples: int, flush: torch.Tensor, warmup: int = 1) -> float:
    """Median seconds of one call of ``fn()``, ``flush`` (a buffer past the L2) written before
    each sample, outside the device events; ``warmup`` calls first (compile, autotune)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def time_variants(op, inputs: dict, samples: int, flush: torch.Tensor, extra=None) -> list:
    """Every CUDA variant of ``op`` (torch.compile left out) and the ``extra`` callables (name
    -> fn, another library's), each timed cold on ``inputs``: (name, median seconds, rel L2
    of its output against eager torch's)."""
    from kernelab.numerics import error

    ref = op.variants["torch"](**inputs)
    fns = {
        name: (lambda v=v, kw=inputs: v(**kw))
        for name, v in op.variants.items()
        if v.runs_on("cuda")[0] and name != "compile"
    }
    fns.update(extra or {})
    return [
        (name, cold_median(fn, samples, flush), error(fn(), ref).rel_l2) for name, fn in fns.items()
    ]
