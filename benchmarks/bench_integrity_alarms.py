"""False-alarm and catch rates of bench's timed-loop checks: rotating input sets (caches keyed
on version counters or sampled elements) and CPU time per thread (work on another thread,
background load), on the CPU, without and with another process spinning on a core.

    python benchmarks/bench_integrity_alarms.py [--runs 15] [--planted-runs 5] [--json]
        [--mode hot|cold|auto]

Each run benches one candidate from ``benchmarks/candidates/`` beside eager torch (one case,
in this process). Honest candidates: a false alarm is any flag of these classes on the
candidate or on torch. Planted cheats: caught when the candidate carries its class's flag.
``--runs`` is per honest candidate and condition (five honest candidates: 5 × runs per
condition). Prints the machine, versions and the load average around each condition, and
each cheat's median time over eager torch's (what the cheat gained).

``--mode hot`` (the default) is where the caches and pools can pay. In cold mode each sample
reads a copy of the inputs at another address (bench/cache.py): a cache or a pool keyed on
addresses never hits, so there is nothing to catch (the cheat's time is torch's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from kernelab._loader import load_callable  # noqa: E402
from kernelab.bench import BenchConfig, Ceilings, StopRule, Subject  # noqa: E402
from kernelab.bench.runner import bench_case  # noqa: E402
from kernelab.bench.timers import HostTimer  # noqa: E402
from kernelab.hardware import detect  # noqa: E402
from kernelab.ops import GEMM, RMSNORM, ROPE, SILU_AND_MUL, SOFTMAX, Shape  # noqa: E402

CACHED = "results cached by version counter or sampled elements"
OFF_THREAD = "work on another thread"
LOAD = "background load"
CLASSES = (CACHED, OFF_THREAD, LOAD, "slowed by background load")
RULE = StopRule(rel_ci=0.1, min_samples=10, min_time=0.05, max_time=0.3, max_samples=60)
CEIL = Ceilings("alarms", 250e9, "250 GB/s (a floor far below this host)", {}, {})
NORM = Shape("norm 64x1024", {"rows": 64, "cols": 1024}, {"residual": False}, "rows")
MM = Shape("mm 32x256x512", {"M": 32, "N": 256, "K": 512},
           {"bias": False, "layout": "nk", "residual": False}, "M")  # fmt: skip
ROT = Shape("rope 32x(4+2)x64 rot64", {"tokens": 32, "heads_q": 4, "heads_k": 2, "head_dim": 64,
            "rot": 64}, {"is_neox": True}, "tokens")  # fmt: skip
ACT = Shape("act 64x2x512", {"rows": 64, "d": 512}, {}, "rows")
SOFT = Shape("softmax 64x1000", {"rows": 64, "cols": 1000}, {"scale": 1.0}, "rows")
OPS = {
    "rmsnorm": (RMSNORM, NORM, torch.float32),
    "gemm": (GEMM, MM, torch.bfloat16),
    "rope": (ROPE, ROT, torch.bfloat16),
    "silu_and_mul": (SILU_AND_MUL, ACT, torch.float16),
    "softmax": (SOFTMAX, SOFT, torch.float32),
}
HONEST = [
    ("rmsnorm_same.py", "rmsnorm"),
    ("rmsnorm_chunked.py", "rmsnorm"),
    ("gemm_float32.py", "gemm"),
    ("softmax_exp2.py", "softmax"),
    ("rope_complex.py", "rope"),
]
PLANTED = [
    ("rmsnorm_version_cache.py", "rmsnorm", CACHED),
    ("gemm_version_cache.py", "gemm", CACHED),
    ("rmsnorm_sampled_cache.py", "rmsnorm", CACHED),
    ("gemm_sampled_cache.py", "gemm", CACHED),
    ("rmsnorm_import_pool.py", "rmsnorm", OFF_THREAD),
    ("gemm_first_call_pool.py", "gemm", OFF_THREAD),
    ("rmsnorm_spinner.py", "rmsnorm", LOAD),
    ("gemm_spin_between_calls.py", "gemm", LOAD),
    ("rope_version_cache.py", "rope", CACHED),
    ("silu_sampled_cache.py", "silu_and_mul", CACHED),
    ("softmax_first_call_pool.py", "softmax", OFF_THREAD),
    ("silu_spinner.py", "silu_and_mul", LOAD),
]


def _start_spinner() -> int:
    """Another process spinning on a core, not a descendant of this one (a shell starts it in
    the background and exits: it is re-parented), so that bench does not count it as the
    candidate's child. Returns its pid."""
    spin = f"{sys.executable} -c 'while True: pass'"
    out = subprocess.run(["sh", "-c", f"{spin} >/dev/null 2>&1 & echo $!"], capture_output=True)
    return int(out.stdout.split()[0])


MODE = {"mode": "hot"}


def bench_one(file: str, op_name: str, seed: int, times: dict | None = None) -> dict:
    op, shape, dtype = OPS[op_name]
    fn = load_callable(f"{HERE / 'candidates' / file}:{op_name}_candidate")
    try:
        subjects = [
            Subject("candidate", fn, "candidate"),
            Subject("torch", op.variants["torch"].fn, "torch"),
        ]
        cfg = BenchConfig(rule=RULE, energy_window_s=0, seed=seed, mode=MODE["mode"])
        cases = bench_case(op, shape, dtype, subjects, detect("cpu"), HostTimer(), CEIL, cfg)
        if times is not None:
            times.update({c["variant"]: c["metrics"]["median_s"] for c in cases})
    finally:
        stop = getattr(sys.modules[fn.__module__], "stop", None)
        if stop is not None:
            stop()
    return {c["variant"]: c["flags"] for c in cases}


def condition(runs: int, planted_runs: int, loaded: bool) -> dict:
    spinner = _start_spinner() if loaded else None
    if loaded:
        time.sleep(0.5)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    alarms, examples = {}, []
    try:
        for file, op in HONEST:
            n = 0
            for r in range(runs):
                flags = bench_one(file, op, seed=r)
                bad = [f for fl in flags.values() for f in fl if f.startswith(CLASSES)]
                n += bool(bad)
                examples += [f"{file}: {b[:100]}" for b in bad[:1]]
            alarms[file] = n
        caught, gain = {}, {}
        for file, op, cls in PLANTED:
            times: dict = {}
            caught[file] = sum(
                any(f.startswith(cls) for f in bench_one(file, op, r, times)["candidate"])
                for r in range(planted_runs)
            )
            if times.get("torch"):
                gain[file] = times["candidate"] / times["torch"]  # the last run's
    finally:
        if spinner is not None:
            os.kill(spinner, signal.SIGTERM)
    return {
        "loaded": loaded,
        "honest_runs": runs * len(HONEST),
        "false_alarms": sum(alarms.values()),
        "false_alarms_by_candidate": alarms,
        "false_alarm_examples": examples[:5],
        "planted_runs": planted_runs,
        "caught": caught,
        "candidate_over_torch": gain,
        "mode": MODE["mode"],
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="per honest candidate, condition")
    parser.add_argument("--planted-runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--mode", default="hot", choices=["hot", "cold", "auto"])
    parser.add_argument(
        "--conditions", default="idle,loaded", help="idle, loaded or both (comma-separated)"
    )
    args = parser.parse_args()
    if args.runs < 1 or args.planted_runs < 0:
        raise SystemExit("--runs: at least 1; --planted-runs: at least 0")
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
    MODE["mode"] = args.mode
    wanted = {c.strip() for c in args.conditions.split(",")}
    if not wanted or wanted - {"idle", "loaded"}:
        raise SystemExit(f"--conditions: expected idle and/or loaded, got {args.conditions!r}")
    results = [
        condition(args.runs, args.planted_runs, loaded)
        for loaded in (False, True)
        if ("loaded" if loaded else "idle") in wanted
    ]
    if args.json:
        print(json.dumps({"machine": machine, "conditions": results}, indent=2))
        return
    print(f"machine: {machine}")
    for r in results:
        what = "another process spinning on a core" if r["loaded"] else "no added load"
        la0, la1 = r["loadavg_before"][0], r["loadavg_after"][0]
        print(f"\n{what}, {r['mode']} mode (load {la0:.1f} -> {la1:.1f}, {r['seconds']:.0f} s)")
        print(f"  honest: {r['false_alarms']} false alarm(s) in {r['honest_runs']} runs")
        for e in r["false_alarm_examples"]:
            print(f"    {e}")
        for file, n in r["caught"].items():
            ratio = r["candidate_over_torch"].get(file)
            gained = f"  (its median / torch's {ratio:.2f})" if ratio else ""
            print(f"  {file:30} caught {n}/{r['planted_runs']}{gained}")


if __name__ == "__main__":
    main()
