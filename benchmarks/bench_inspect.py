"""How long ``kernelab inspect`` takes for every registered kernel on each target, cold and cached.

Cold: empty kernelab and Triton caches (fresh temporary folders), so every kernel compiles.
Cached: the same run again, reading kernelab's cache. Prints machine, versions and numbers.

    PYTHONPATH=src python benchmarks/bench_inspect.py [--targets sm_80,sm_90,sm_100,gfx942]
    [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = """
import sys, time, json
t0 = time.perf_counter()
from kernelab import ops
from kernelab.inspect import inspect_ops
t1 = time.perf_counter()
res = inspect_ops(ops.all_ops(), sys.argv[1], jobs=int(sys.argv[2]))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "inspect_s": t2 - t1, "reports": len(res.reports),
                  "cached": sum(r.cached for r in res.reports), "triton": res.triton,
                  "errors": sum(r.error is not None for r in res.reports)}))
"""


def _run(target: str, jobs: int, env: dict) -> dict:
    import json

    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, target, str(jobs)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["process_s"] = time.perf_counter() - started
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="sm_80,sm_90,sm_100,gfx942")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    import torch
    import triton

    src = str(Path(__file__).resolve().parents[1] / "src")
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs,")
    print(f"  python {platform.python_version()}, torch {torch.__version__}, "
          f"triton {triton.__version__}, {args.jobs} compile processes")  # fmt: skip
    print(f"{'target':8} {'kernels':>8} {'cold s':>8} {'cached s':>9} {'(+import)':>10}")
    every = args.targets
    for target in [*args.targets.split(","), every]:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ)
            env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
            env["KERNELAB_CACHE_DIR"] = str(Path(tmp) / "kernelab")
            env["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton")
            cold = _run(target, args.jobs, env)
            warm = _run(target, args.jobs, env)
        assert warm["cached"] == warm["reports"], "the second run should be fully cached"
        name = "all" if target == every else target
        print(
            f"{name:8} {cold['reports']:>8} {cold['inspect_s']:>8.1f} "
            f"{warm['inspect_s']:>9.2f} {warm['process_s']:>10.2f}"
        )
    print("cold: every kernel compiled; cached: read from kernelab's cache; (+import): the")
    print("cached run as one process, with Python, torch and triton imports")


if __name__ == "__main__":
    main()
