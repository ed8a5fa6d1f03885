"""Seed soak: verify every op's own variants over many fresh run seeds, as the report card runs
them, and list every failure with the command that repeats it.

    PYTHONPATH=src python benchmarks/soak_seeds.py [OP ...] [--seeds 50] [--jobs N]
        [--seed S ...] [--tier quick|full] [--trials 2] [--shapes edge] [--budget S] [--json]

Each (op, seed) is one ``verify`` of the op (every variant that runs here: kernelab's and
eager torch, not compile or the TPU interpreter on CPU) at the interpreter's caps, in a worker
process; ``--jobs`` workers (default: the cores) take them in turn, seed by seed across the
ops. The default setting is the report card's (``kernelab run``): the quick tier, the default
trials. The run seeds are fresh (``--seed`` gives them instead, repeatable); a trial's inputs
follow from the run seed, the op, the case and the trial, so a failure repeats with
``kernelab verify OP --variant V --seed S --quick`` alone.

Prints the machine and versions, a progress line per (op, seed) on stderr, a table of
ops × seeds (seeds run and failed, cases, failing cases, worst error / tolerance, seconds),
then every failing case: its op, variant, seed, shape, dtype, class, input distribution and
the command that repeats it. ``--budget``: no (op, seed) starts after so
many seconds (the table counts those not run); SIGTERM and Ctrl-C stop the workers and print
what finished. ``--json``: the same as JSON on stdout. Exits 1 if a case failed or a worker
raised. The last result is in docs/verify.md ("Seed soak").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context


def run_one(op: str, seed: int, tier: str, trials: int, shapes: list[str]) -> dict:
    """One verify of ``op`` at ``seed`` (in a worker): its cases summed up, its failures listed."""
    from kernelab.verify import verify

    started = time.perf_counter()
    try:
        report = verify([op], shape_sets=shapes, device="cpu", seed=seed, trials=trials, tier=tier)
    except Exception as e:  # a worker that raised is a failure of its own, reported as one
        return {
            "op": op,
            "seed": seed,
            "error": f"{type(e).__name__}: {e}",
            "cases": 0,
            "failures": [],
            "worst_ratio": None,
            "seconds": time.perf_counter() - started,
            "warnings": {},
        }
    failures = []
    for case in report.cases:
        if case.passed:
            continue
        first = case.failures[0]
        trial = case.trial_of(first) or {}
        failures.append(
            {
                "variant": case.variant,
                "shape_set": case.shape_set,
                "shape": case.shape,
                "dtype": case.dtype,
                "class": case.failure_class,
                "worst_ratio": case.worst_ratio,
                "dist": trial.get("dist"),
                "trial": first.trial,
                "message": first.line(trial or None),
                "repeat": repeat_command(case, seed, tier, trials),
            }
        )
    return {
        "op": op,
        "seed": seed,
        "error": None,
        "cases": len(report.cases),
        "failures": failures,
        "worst_ratio": max((c.worst_ratio for c in report.cases), default=0.0),
        "seconds": time.perf_counter() - started,
        "warnings": dict(report.interpreter_warnings),
    }


def repeat_command(case, seed: int, tier: str, trials: int) -> str:
    """``kernelab verify`` repeating a failing case (the whole op at this variant and seed:
    the case's shape set, shape and dtype say where to look)."""
    from kernelab.verify import DEFAULT_TRIALS

    quick = " --quick" if tier == "quick" else ""
    more = f" --trials {trials}" if trials != DEFAULT_TRIALS else ""
    return (
        f"kernelab verify {case.op} --variant {case.variant} --device cpu --seed {seed}"
        f"{quick}{more}  # {case.shape_set} {case.shape!r} {case.dtype}"
    )


def _machine() -> dict:
    import torch
    import triton

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "load_before": round(load[0], 2),
    }


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _progress(line: str) -> None:
    """A progress line on stderr (one a line, piped or not: a soak runs long enough that the
    history of its verdicts is worth keeping on the terminal too)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def table(ops: list[str], results: list[dict]) -> list[dict]:
    """One row per op: seeds run, seeds failed, cases, failing cases, worst ratio, seconds."""
    rows = []
    for op in ops:
        mine = [r for r in results if r["op"] == op]
        ratios = [r["worst_ratio"] for r in mine if r["worst_ratio"] is not None]
        rows.append(
            {
                "op": op,
                "seeds": len(mine),
                "failed_seeds": sum(1 for r in mine if r["failures"] or r["error"]),
                "cases": sum(r["cases"] for r in mine),
                "failed_cases": sum(len(r["failures"]) for r in mine),
                "errors": sum(1 for r in mine if r["error"]),
                "worst_ratio": max(ratios, default=0.0),
                "seconds": round(sum(r["seconds"] for r in mine), 1),
            }
        )
    return rows


def print_text(summary: dict) -> None:
    m = summary["machine"]
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, python {m['python']}, torch {m['torch']}, "
        f"triton {m['triton']}; load average before {m['load_before']}"
    )
    s = summary["settings"]
    print(
        f"settings: {s['tier']} tier, {s['trials']} trial(s), shapes {','.join(s['shapes'])}, "
        f"{s['jobs']} worker(s), interpreter caps"
    )
    print(
        f"\n{'op':<24}{'seeds':>6}{'failed':>7}{'cases':>8}{'fail cases':>11}{'worst':>8}{'s':>9}"
    )
    for r in summary["ops"]:
        print(
            f"{r['op']:<24}{r['seeds']:>6}{r['failed_seeds']:>7}{r['cases']:>8}"
            f"{r['failed_cases']:>11}{r['worst_ratio']:>7.2f}×{r['seconds']:>9.1f}"
        )
    t = summary["totals"]
    print(
        f"\n{t['seeds']} op × seed runs, {t['cases']} cases, {t['failed_cases']} failing "
        f"case(s), {t['errors']} worker error(s), {t['not_run']} not run; {t['wall_s']:.0f} s wall "
        f"({t['worker_s']:.0f} s in workers)"
    )
    warned = summary["interpreter_warnings"]
    if warned:
        print(
            "interpreter's numpy warnings, counted: "
            + ", ".join(f"{msg} ×{n}" for msg, n in warned.items())
        )
    for r in summary["errors"]:
        print(f"\nERROR {r['op']} seed {r['seed']}: {r['error']}")
    for f in summary["failures"]:
        print(
            f"\nFAIL {f['op']}/{f['variant']} seed {f['seed']}: {f['class']} "
            f"{f['worst_ratio']:.2f}× tol, {f['shape_set']} {f['shape']} {f['dtype']}, "
            f"{f['dist']} inputs\n  {f['message'][:400]}\n  {f['repeat']}"
        )


def main() -> int:
    from kernelab.ops import all_ops, get
    from kernelab.verify import DEFAULT_TRIALS
    from kernelab.verify._runner import TIERS, new_seed

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="ops (default: all registered)")
    parser.add_argument("--seeds", type=int, default=50, help="fresh run seeds per op")
    parser.add_argument(
        "--seed", type=int, action="append", default=[], help="a run seed (repeatable)"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tier", choices=TIERS, default="quick")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    parser.add_argument(
        "--shapes", default="representative,edge", help="shape sets, comma-separated"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="seconds after which no new (op, seed) starts; those running finish (0: none)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead")
    args = parser.parse_args()
    ops = [get(name).name for name in args.ops] if args.ops else [o.name for o in all_ops()]
    seeds = args.seed or [new_seed() for _ in range(args.seeds)]
    shapes = [s for s in args.shapes.split(",") if s]
    machine = _machine()
    work = [(op, seed) for seed in seeds for op in ops]  # seed by seed: every op early on
    results: list[dict] = []
    started = time.perf_counter()
    cancelled = False  # at the budget, the runs not yet started
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` still gets the results so far
    pool = ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn"))
    try:
        futures = [
            pool.submit(run_one, op, seed, args.tier, args.trials, shapes) for op, seed in work
        ]
        for fut in as_completed(futures):
            if fut.cancelled():
                continue
            r = fut.result()
            results.append(r)
            verdict = "pass"
            if r["error"]:
                verdict = "error"
            elif r["failures"]:
                verdict = f"{len(r['failures'])} failing"
            wall = time.perf_counter() - started
            if args.budget and wall > args.budget and not cancelled:
                cancelled = bool(sum(f.cancel() for f in futures))
            _progress(
                f"[{len(results)}/{len(work)}] {r['op']} seed {r['seed']}: {verdict} "
                f"({r['cases']} cases, {r['seconds']:.1f} s; {wall:.0f} s in all)"
            )
    except KeyboardInterrupt:
        _progress(f"interrupted: {len(results)} of {len(work)} done")
        for process in list(pool._processes.values()):  # the running ones, not waited for
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
    else:
        pool.shutdown()
    warned: dict[str, int] = {}
    for r in results:
        for msg, n in r["warnings"].items():
            warned[msg] = warned.get(msg, 0) + n
    rows = table(ops, results)
    order = {op: i for i, op in enumerate(ops)}
    results.sort(key=lambda r: (order[r["op"]], seeds.index(r["seed"])))
    summary = {
        "machine": machine,
        "settings": {
            "tier": args.tier,
            "trials": args.trials,
            "shapes": shapes,
            "jobs": args.jobs,
            "seeds": seeds,
        },
        "ops": rows,
        "totals": {
            "seeds": len(results),
            "cases": sum(r["cases"] for r in results),
            "failed_cases": sum(len(r["failures"]) for r in results),
            "errors": sum(1 for r in results if r["error"]),
            "not_run": len(work) - len(results),
            "wall_s": round(time.perf_counter() - started, 1),
            "worker_s": round(sum(r["seconds"] for r in results), 1),
        },
        "interpreter_warnings": warned,
        "errors": [r for r in results if r["error"]],
        "failures": [
            {"op": r["op"], "seed": r["seed"], **f} for r in results for f in r["failures"]
        ],
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_text(summary)
    return 1 if summary["failures"] or summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
