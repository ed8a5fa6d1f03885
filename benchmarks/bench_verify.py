"""Wall time of ``kernelab verify`` per op, variant and shape set, at the default settings.

    PYTHONPATH=src python benchmarks/bench_verify.py [OP ...] [--trials N] [--seed N]

Runs what ``kernelab verify`` runs by default (representative and edge shapes, every dtype,
every variant that runs here except compile on CPU) and prints the machine, versions, load and
the seconds spent, so that the default trial count can be kept within the CI budget.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections import defaultdict

import torch
import triton

from kernelab.hardware import detect
from kernelab.verify import DEFAULT_TRIALS, verify

#: The whole default verify of the current ops must stay under this on a 2-core CPU.
BUDGET_S = 180.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="ops (default: all registered)")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    info = detect(None)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"machine: {info.type} {info.name}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}"
    )
    print(f"versions: torch {torch.__version__}, triton {triton.__version__}")
    print(
        f"torch threads: {torch.get_num_threads()} (verify uses 1 on CPU); "
        f"load average before: {load[0]:.2f}"
    )
    print(f"settings: trials {args.trials}, seed {args.seed}, default caps (labels show them)")
    started = time.perf_counter()
    cpu_started = time.process_time()
    report = verify(args.ops or None, device=info.type, seed=args.seed, trials=args.trials)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    per_op: dict[str, float] = defaultdict(float)
    rows: dict[tuple[str, str, str], list] = defaultdict(lambda: [0, 0.0])
    for case in report.cases:
        per_op[case.op] += case.seconds
        row = rows[(case.op, case.variant, case.shape_set)]
        row[0] += 1
        row[1] += case.seconds
    print(f"\n{'op':<16}{'variant':<12}{'shape set':<16}{'cases':>6}{'seconds':>10}")
    for (op, variant, shape_set), (n, secs) in rows.items():
        print(f"{op:<16}{variant:<12}{shape_set:<16}{n:>6}{secs:>10.2f}")
    print()
    for op, secs in per_op.items():
        print(f"{op:<16} total {secs:8.2f} s")
    full = [c for c in report.cases if getattr(c, "sample", None) is not None]
    print(
        f"full-size cases (sampled reference): {len(full)}, "
        f"{sum(c.seconds for c in full):.1f} s; "
        f"cut to the budget: {len(getattr(report, 'cut', []))}"
    )
    slowest = sorted(report.cases, key=lambda c: -c.seconds)[:5]
    print("\nslowest cases:")
    for c in slowest:
        print(f"  {c.seconds:6.2f} s  {c.op}/{c.variant} {c.shape_set} {c.shape} {c.dtype}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    verdict = "within" if wall <= BUDGET_S else "OVER"
    print(
        f"\nwhole verify: {wall:.1f} s wall, {cpu:.1f} s CPU of this process "
        f"({len(report.cases)} cases, passed={report.passed}); {verdict} the {BUDGET_S:.0f} s "
        f"budget; load average after: {load[0]:.2f}"
    )
    for line in report.skipped:
        print(f"skipped: {line}")


if __name__ == "__main__":
    main()
