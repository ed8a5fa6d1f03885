"""Wall time of an inspect sweep on ``--engine ray`` vs ``--engine local`` vs ``kernelab
inspect``, in one run, cold caches each, and whether all three report the same.

The work: ``sweep inspect --ops rmsnorm,gemm --configs space --targets sm_80,sm_90``, cut to
what a 2-core machine compiles in minutes: bfloat16, one shape per op (``--shapes``), and the
first ``--gemm-configs`` configs of gemm's space (its whole space for one shape is 205
configs, each a compile of tens of seconds on a loaded 2-core machine). ``kernelab inspect``
is inspect's own path for the same launches (``inspect_ops``: its planner, its process pool
of compilers) on the ops narrowed to those shapes and configs. Each of the three runs in a
fresh process with empty kernelab and Triton caches; the sweeps write to a fresh ledger.

    PYTHONPATH=src python benchmarks/bench_sweep.py [--gemm-configs 8] [--jobs N]

Prints machine, versions, wall seconds per way and the check that the reports are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {"rmsnorm": "qwen2.5-7b decode 32x3584 +residual", "gemm": "qkv decode M=1 6144x4096"}
TARGETS = ["sm_80", "sm_90"]

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
way, jobs, n_gemm, ledger_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
shapes, targets = json.loads(sys.argv[5]), json.loads(sys.argv[6])
import dataclasses, torch
from kernelab import ops
t_import = time.perf_counter() - t0

def gemm_configs():
    op = ops.get("gemm")
    shape = next(s for s in op.shapes("representative") if shapes["gemm"] in s.label)
    return op.tuning_space(shape, torch.bfloat16)[:n_gemm]

def specs():
    rms = {"kind": "inspect", "ops": ["rmsnorm"], "dtypes": ["bf16"], "configs": "space",
           "shapes": [shapes["rmsnorm"]], "targets": targets}
    gemm = {**rms, "ops": ["gemm"], "shapes": [shapes["gemm"]],
            "configs": [dataclasses.asdict(c) for c in gemm_configs()]}
    return [rms, gemm]

reports, extra = {}, {}
started = time.perf_counter()
if way == "inspect":
    from kernelab.inspect import inspect_ops
    from kernelab.inspect.targets import TARGETS

    class Narrowed:  # the op with one shape and (gemm) the first configs of its space
        def __init__(self, op, keep):
            self._op, self._keep = op, keep
        def shapes(self, name):
            return [s for s in self._op.shapes(name) if shapes[self._op.name] in s.label]
        def tuning_space(self, shape, dtype):
            return self._keep(self._op.tuning_space(shape, dtype))
        def __getattr__(self, name):
            return getattr(self._op, name)

    n = gemm_configs()
    narrowed = [Narrowed(ops.get("rmsnorm"), lambda s: s),
                Narrowed(ops.get("gemm"), lambda s: [c for c in s if c in n])]
    res = inspect_ops(narrowed, [TARGETS[t] for t in targets], space=True, dtypes=["bfloat16"],
                      jobs=jobs)
    for r in res.reports:
        d = r.as_dict(); d.pop("cached"); reports[r.key] = d
    extra["tasks"] = None
else:
    from kernelab import ledger, sweep
    from kernelab.sweep import engines, runner
    t_engine = time.perf_counter()
    eng = engines.make(way, jobs if way == "local" else None)
    extra["engine_start_s"] = time.perf_counter() - t_engine
    n_tasks = 0
    with ledger.open(ledger_path) as db:
        try:
            for raw in specs():
                spec = sweep.validate(raw)
                tasks, _ = sweep.expand(spec)
                n_tasks += len(tasks)
                result = runner.run(spec, db, eng, tasks=tasks)
                assert not result.failures, result.failures
                for rid in result.runs:
                    for c in db.get_run(rid, samples=False)["cases"]:
                        rep = c["metrics"]["report"]; reports[rep["key"]] = rep
        finally:
            eng.close()
    extra["tasks"] = n_tasks
wall = time.perf_counter() - started
print(json.dumps({"wall_s": wall, "import_s": t_import, "reports": reports, **extra}))
"""


def _run(way: str, jobs: int, n_gemm: int, src: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        env["KERNELAB_CACHE_DIR"] = str(Path(tmp) / "kernelab")
        env["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton")
        env["RAY_AUTH_MODE"] = env.get("RAY_AUTH_MODE", "disabled")
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, way, str(jobs), str(n_gemm),
             str(Path(tmp) / "ledger.sqlite"), json.dumps(SHAPES), json.dumps(TARGETS)],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode:
            raise SystemExit(f"{way}: failed\n{out.stderr[-3000:]}")
        data = json.loads(out.stdout.strip().splitlines()[-1])
        data["process_s"] = time.perf_counter() - started
        return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm-configs", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    import torch
    import triton

    src = str(Path(__file__).resolve().parents[1] / "src")
    try:
        import ray

        ways, ray_version = ["ray", "local", "inspect"], ray.__version__
    except ImportError:
        ways, ray_version = ["local", "inspect"], None
        print("ray: not installed, the ray engine is skipped (pip install 'kernelab[ray]')")
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.1f} (1 min)")
    print(f"  python {platform.python_version()}, torch {torch.__version__}, "
          f"triton {triton.__version__}, ray {ray_version}, {args.jobs} workers")  # fmt: skip
    print(f"  work: rmsnorm {SHAPES['rmsnorm']!r} whole space, gemm {SHAPES['gemm']!r} first "
          f"{args.gemm_configs} configs; bfloat16; {','.join(TARGETS)}; cold caches")  # fmt: skip
    results = {}
    for way in ways:
        print(f"running {way} ...", file=sys.stderr, flush=True)
        results[way] = _run(way, args.jobs, args.gemm_configs, src)
    print(f"{'way':10} {'tasks':>6} {'kernels':>8} {'wall s':>8} {'engine start s':>15}")
    for way, r in results.items():
        tasks = "-" if r.get("tasks") is None else str(r["tasks"])
        start = r.get("engine_start_s")
        print(f"{way:10} {tasks:>6} {len(r['reports']):>8} {r['wall_s']:>8.1f} "
              f"{'-' if start is None else f'{start:.1f}':>15}")  # fmt: skip
    base = results["inspect"]["reports"]
    for way, r in results.items():
        same = r["reports"] == base
        print(f"{way}: {'the same reports as kernelab inspect' if same else 'REPORTS DIFFER'}")
        if not same:
            raise SystemExit(1)
    print(f"load average after: {os.getloadavg()[0]:.1f} (a shared machine moves these numbers)")


if __name__ == "__main__":
    main()
