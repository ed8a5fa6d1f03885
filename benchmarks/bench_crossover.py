"""A measured crossover on this machine's CPU between two implementations of one op whose costs
differ by construction, found by ``kernelab.bench.crossover.measure`` (the bench runner, compare's
verdicts per point).

    PYTHONPATH=src python benchmarks/bench_crossover.py [--max-time 0.3]

The op is ``out = 2·x`` over n float32 elements. "fixed" first zeroes a scratch buffer of
2^20 elements (a cost independent of n), then computes the product once; "repeat" computes it
eight times over (eight times the per-element cost, no fixed part). "repeat" wins while n is
small and loses once seven extra passes over n cost more than the fixed zeroing: the crossover
is expected near n = 2^20 × (cost of zeroing an element) / (7 × cost of one pass), which the
script estimates from two plain timings before the study and prints beside the measured one.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from kernelab import __version__
from kernelab.bench import crossover as cx
from kernelab.bench.roofline import Ceilings
from kernelab.bench.runner import BenchConfig
from kernelab.bench.stats import StopRule
from kernelab.bench.timers import HostTimer
from kernelab.core import Contract, Cost, Op, Shape, Variant
from kernelab.hardware import detect

SCRATCH = 2**20


def _op() -> Op:
    scratch = torch.empty(SCRATCH)

    def fixed(x):
        scratch.zero_()
        return x * 2

    def repeat(x):
        out = x * 2
        for _ in range(7):
            out = x * 2
        return out

    def make_inputs(shape, dtype, device, gen, dist):
        return {"x": torch.randn(shape.dims["n"], dtype=dtype, generator=gen)}

    op = Op(
        "demo_scale",
        description="2x with a fixed cost or an eightfold per-element cost",
        reference=lambda x: x * 2,
        make_inputs=make_inputs,
        shapes={"representative": lambda: [Shape("n", {"n": 1024})], "edge": lambda: []},
        cost=lambda i: Cost(flops=i["x"].numel(), bytes=8 * i["x"].numel()),
        contract=Contract(),
        dtypes=(torch.float32,),
    )
    op.add_variant(Variant("fixed", fixed, "torch", description="zero 2^20 floats, then 2x"))
    op.add_variant(Variant("repeat", repeat, "torch", description="2x, eight times"))
    return op


def _best(fn, reps: int = 200) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-time", type=float, default=0.3, help="per case, seconds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = detect("cpu")
    print(
        f"kernelab {__version__}, torch {torch.__version__}, {info.name} "
        f"({platform.machine()}), 1 thread"
    )
    scratch, x = torch.empty(SCRATCH), torch.randn(SCRATCH)
    per_zero = _best(scratch.zero_) / SCRATCH
    per_pass = _best(lambda: x * 2) / SCRATCH
    expected = SCRATCH * per_zero / (7 * per_pass)
    print(f"expected crossover near n = {expected:,.0f} (zeroing {per_zero * 1e9:.3f} ns/elt, "
          f"one pass {per_pass * 1e9:.3f} ns/elt)")  # fmt: skip
    rule = StopRule(rel_ci=0.02, min_samples=10, min_time=0.02, max_time=args.max_time)
    cfg = BenchConfig(mode="hot", rule=rule, energy_window_s=0)
    values = [2**k for k in range(12, 23)]
    study, _, _ = cx.measure(
        _op(), ("fixed", "repeat"), "n", values, info, cfg, Ceilings(info.key),
        timer=HostTimer(1), progress=print,
    )  # fmt: skip
    for p in study.points:
        lo, hi = p.get("lo"), p.get("hi")
        interval = f"{lo:.2f}–{hi:.2f}" if lo and hi else "—"
        print(
            f"n={p['value']:>8}  fixed {p['a_s'] * 1e6:9.1f} us  repeat {p['b_s'] * 1e6:9.1f} us"
            f"  speedup {p['speedup']:.2f}x ({interval})  {p['verdict']}"
        )
        if p["verdict"] not in cx.CONFIRMED and p.get("note"):
            print(f"    {p['note']}")
    print(study.summary())


if __name__ == "__main__":
    main()
