"""Cost of the ledger and of compare: writing runs, reading them, comparing two of them.

    PYTHONPATH=src python benchmarks/bench_ledger.py [--cases 200] [--samples 1000]

Prints the machine and versions with the numbers.
"""

from __future__ import annotations

import argparse
import platform
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

import kernelab
from kernelab import ledger
from kernelab.ledger.compare import compare_runs
from kernelab.report.html import render


def cases(seed: int, n_cases: int, n_samples: int, scale: float = 1.0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "op": "rmsnorm",
            "variant": ("kernelab", "torch")[i % 2],
            "shape_key": f"s{i // 2}",
            "dtype": "bfloat16",
            "device": "cpu",
            "mode": "cold",
            "metrics": {"median_s": 1e-5, "bytes": 1e6, "flops": 1e6},
            "samples": (scale * 1e-5 * rng.lognormal(0, 0.05, n_samples)).tolist(),
        }
        for i in range(n_cases)
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    print(
        f"kernelab {kernelab.__version__}, python {platform.python_version()}, numpy "
        f"{np.__version__}, sqlite {sqlite3.sqlite_version}, {platform.machine()} "
        f"{platform.processor() or ''}".strip()
    )
    print(f"{args.runs} runs of {args.cases} cases × {args.samples} samples")
    with tempfile.TemporaryDirectory() as tmp:
        db = ledger.open(Path(tmp) / "bench.sqlite")
        prov = {"device": {"name": "cpu", "key": "cpu"}}
        batches = [cases(s, args.cases, args.samples, 1.0 + 0.01 * s) for s in range(args.runs)]
        t0 = time.perf_counter()
        ids = [db.record_run("bench", b, prov) for b in batches]
        t_write = (time.perf_counter() - t0) / args.runs
        t0 = time.perf_counter()
        runs = [db.get_run(i) for i in ids]
        t_read = (time.perf_counter() - t0) / args.runs
        t0 = time.perf_counter()
        result = compare_runs(runs[0], runs[-1])
        t_cmp = time.perf_counter() - t0
        t0 = time.perf_counter()
        page = render(runs[-1:], runs[0])
        t_html = time.perf_counter() - t0
        size = (Path(tmp) / "bench.sqlite").stat().st_size
        db.close()
    print(f"record_run: {t_write * 1e3:.1f} ms per run")
    print(f"get_run:    {t_read * 1e3:.1f} ms per run (with raw samples)")
    print(f"compare:    {t_cmp * 1e3:.1f} ms for {len(result.cases)} matched cases")
    print(f"report:     {t_html * 1e3:.1f} ms, {len(page) / 1e3:.0f} kB of HTML")
    print(f"ledger:     {size / 1e6:.1f} MB for {args.runs * args.cases * args.samples} samples")


if __name__ == "__main__":
    main()
