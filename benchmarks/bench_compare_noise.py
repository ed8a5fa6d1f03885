"""How often ``kernelab compare`` calls identical code slower, on a quiet or a loaded machine.

    python benchmarks/bench_compare_noise.py [--pairs 10] [--load] [--shape decode ...]
        [--mode auto|cold|hot] [--ledger PATH]

Times an RMSNorm candidate (``benchmarks/candidates/rmsnorm_same.py``) twice per pair with
``kernelab bench --candidate``, beside eager torch, and compares the two runs. Identical code
must give 0 confirmed regressions. Each pair then times a planted 2x slowdown (the same
function computing the norm twice, ``rmsnorm_twice.py``) against the first run of the pair:
it must still be confirmed. ``--load`` keeps one other process spinning on a core for the
whole run. Prints the machine, versions, load, and one line per pair (with the load average
then). Exit status 1 of a bench (a case marked invalid) is kept: an invalid case is counted,
never a change.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _kernelab(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "kernelab", *args], capture_output=True, text=True, env=env
    )


def _bench(ledger: str, candidate: str, shapes: list[str], label: str, mode: str) -> str:
    filters = [a for s in shapes for a in ("--shape", s)]
    out = _kernelab(
        "bench", "--device", "cpu", "--op", "rmsnorm", "--candidate", candidate,
        "--variant", "torch", *filters, "--dtype", "fp32", "--mode", mode,
        "--ledger", ledger, "--label", label, "--json", "--ceilings", "stored",
    )  # fmt: skip
    # 1: a case was marked invalid (it is stored, and compare never calls it a change)
    if out.returncode not in (0, 1) or not json.loads(out.stdout).get("run_id"):
        raise SystemExit(f"bench failed ({out.returncode}): {out.stderr[-2000:]}")
    return label


def _compare(ledger: str, a: str, b: str) -> dict:
    out = _kernelab("compare", a, b, "--ledger", ledger, "--json")
    if out.returncode not in (0, 1):
        raise SystemExit(f"compare failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def _candidate_line(data: dict) -> tuple[int, int, dict]:
    cand = [c for c in data["cases"] if c["variant"].startswith("candidate:")]
    regress = sum(1 for c in cand if c["regression"])
    verdicts: dict[str, int] = {}
    for c in cand:
        verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
    return regress, len(cand), verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--load", action="store_true", help="spin a process on another core")
    ap.add_argument(
        "--shape", action="append", help="shape label filter for bench (repeatable; decode)"
    )
    ap.add_argument("--ledger", help="keep the runs in this ledger (default: a temporary one)")
    ap.add_argument("--mode", default="auto", choices=["auto", "cold", "hot"], help="bench mode")
    args = ap.parse_args()
    args.shape = args.shape or ["decode"]
    import torch

    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {sys.version.split()[0]}")
    print(f"versions: torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
    print(
        f"pairs: {args.pairs}, shape filter {args.shape!r}, mode {args.mode}, spinner: {args.load}"
    )
    same = str(HERE / "candidates" / "rmsnorm_same.py") + ":rmsnorm_candidate"
    twice = str(HERE / "candidates" / "rmsnorm_twice.py") + ":rmsnorm_candidate"
    stop = mp.Event()
    spinner = mp.Process(target=_spin, args=(stop,), daemon=True) if args.load else None
    if spinner:
        spinner.start()
    false_total = confirmed_total = slow_cases = 0
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ledger = args.ledger or str(Path(tmp) / "noise.sqlite")
            for i in range(args.pairs):
                a = _bench(ledger, same, args.shape, f"a{i}", args.mode)
                b = _bench(ledger, same, args.shape, f"b{i}", args.mode)
                s = _bench(ledger, twice, args.shape, f"s{i}", args.mode)
                fr, n, v_same = _candidate_line(_compare(ledger, a, b))
                cr, ns, v_slow = _candidate_line(_compare(ledger, a, s))
                false_total += fr
                confirmed_total += cr
                slow_cases += ns
                print(
                    f"pair {i + 1:2d} (load {os.getloadavg()[0]:.1f}, "
                    f"{time.perf_counter() - t0:.0f} s): identical: {fr} regression(s) of {n} "
                    f"{v_same}; 2x slower: {cr} of {ns} confirmed {v_slow}",
                    flush=True,
                )
    finally:
        if spinner:
            stop.set()
            spinner.join(5)
    print(
        f"identical code: {false_total} confirmed regression(s) over {args.pairs} pairs; "
        f"planted 2x slowdown: {confirmed_total} of {slow_cases} cases confirmed; "
        f"{time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
