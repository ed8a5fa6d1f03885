"""The GPU check: ceilings, verify, bench for every op, and the HTML report, into one folder.

    PYTHONUNBUFFERED=1 PYTHONPATH=src python benchmarks/gpu_check.py --out OUT

Meant for a CUDA machine (one H200: under 8 minutes), offline, with only what is installed;
``--wheels DIR`` installs wheels brought along first (the CLI needs click, rich and orjson).
Every step runs as a ``kernelab`` command in a subprocess with its own time limit; a command
this checkout does not have, or one that fails, is reported and the check goes on. Writes
``ceilings.json``, ``verify.json``, ``bench-<op>.json``, ``report.html``, the ledger
``ledger.sqlite`` and ``summary.json`` (what ran, how long, what failed) into ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CLI_DEPS = ("click", "rich", "orjson")


def log(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def machine() -> dict:
    info = {"python": platform.python_version(), "host": platform.node()}
    for mod in ("torch", "triton", "pynvml", "amdsmi", *CLI_DEPS):
        spec = importlib.util.find_spec(mod)
        if spec is None:
            info[mod] = None
            continue
        try:
            info[mod] = getattr(__import__(mod), "__version__", "installed")
        except Exception as exc:  # a broken install is worth reporting, not crashing on
            info[mod] = f"import failed: {type(exc).__name__}"
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info["device"] = f"{p.name}, {p.multi_processor_count} SMs, {p.total_memory >> 30} GiB"
            info["cuda"] = torch.version.cuda or torch.version.hip
        else:
            info["device"] = "no CUDA/ROCm device"
    except Exception as exc:
        info["device"] = f"torch failed: {exc}"
    return info


def kernelab(args: list[str], out_file: Path | None, timeout: float, env: dict) -> dict:
    """Run ``python -m kernelab ARGS``: stdout to ``out_file``, stderr streamed through live."""
    cmd = [sys.executable, "-m", "kernelab", *args]
    log("$ kernelab " + " ".join(args))
    t0 = time.perf_counter()
    sink = out_file.open("w") if out_file is not None else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.PIPE, env=env, text=True)
    tail: list[str] = []

    def tee():
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line)
            del tail[:-50]

    reader = threading.Thread(target=tee, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = None
    reader.join(5)
    if out_file is not None:
        sink.close()
    seconds = round(time.perf_counter() - t0, 1)
    err = "".join(tail)
    if rc is None:
        log(f"  timed out after {timeout:.0f} s")
        return {"args": args, "status": "timeout", "seconds": seconds, "stderr_tail": err}
    if rc == 2 and "No such command" in err:
        log(f"  `kernelab {args[0]}` is not a command of this checkout: skipped")
        return {"args": args, "status": "missing command", "seconds": seconds}
    status = {0: "ok", 1: "findings (exit 1)"}.get(rc, f"error (exit {rc})")
    log(f"  {status} in {seconds} s")
    return {"args": args, "status": status, "seconds": seconds, "stderr_tail": err[-2000:]}


def api_bench(ops, out: Path, device: str, dtype: str, budget: float) -> list[dict]:
    """Without the CLI's dependencies: bench through the Python API, JSON via the stdlib."""
    import torch

    from kernelab import bench

    steps = []
    for op in ops:
        t0 = time.perf_counter()
        dts = (getattr(torch, dtype),) if getattr(torch, dtype) in op.dtypes else op.dtypes[:1]
        cfg = bench.BenchConfig(dtypes=dts, budget_s=budget)
        result = bench.bench([op], device, cfg, progress=log)
        data = {"device": result.device, "cases": result.cases, "skipped": result.skipped}
        (out / f"bench-{op.name}.json").write_text(json.dumps(data, default=str, indent=1))
        steps.append(
            {
                "args": ["bench(api)", op.name],
                "status": "ok",
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    return steps


def install_wheels(folder: Path) -> str | None:
    """Install every wheel in ``folder`` into a private directory, without the network."""
    wheels = sorted(str(w) for w in folder.glob("*.whl"))
    if not wheels:
        log(f"no wheels in {folder}")
        return None
    target = tempfile.mkdtemp(prefix="kernelab-wheels-")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--target", target, *wheels]
    rc = subprocess.run(cmd).returncode
    log(f"installed {len(wheels)} wheel(s) into {target}" if rc == 0 else "wheel install failed")
    return target if rc == 0 else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for JSON, HTML and the ledger")
    p.add_argument("--device", default="cuda", help="device to check (default: cuda)")
    p.add_argument("--budget-s", type=float, default=420.0, help="total time to aim for")
    p.add_argument("--dtype", default="bfloat16", help="dtype bench times (default bfloat16)")
    p.add_argument("--verify-s", type=float, default=120.0, help="time limit of verify")
    p.add_argument("--ops", nargs="*", default=None, help="ops (default: all registered)")
    p.add_argument("--bench-arg", action="append", default=[], help="extra bench argument")
    p.add_argument(
        "--wheels", default=None, help="folder of wheels to install first (offline machines)"
    )
    args = p.parse_args()
    extra_path = install_wheels(Path(args.wheels)) if args.wheels else None
    if extra_path:
        sys.path.insert(0, extra_path)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [extra_path, os.environ.get("PYTHONPATH")])
        )

    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", KERNELAB_LEDGER=str(out / "ledger.sqlite"))
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    sys.path.insert(0, str(src))
    summary = {"machine": machine(), "steps": [], "out": str(out)}
    log(json.dumps(summary["machine"]))
    if args.device.startswith("cuda") and not summary["machine"]["device"].count("SMs"):
        log("no CUDA/ROCm device here: the check needs one (use --device cpu for a dry run)")
        summary["steps"].append({"args": [], "status": "no device"})

    try:
        from kernelab import ops as registry

        ops = [registry.get(n) for n in args.ops] if args.ops else registry.all_ops()
    except Exception as exc:
        log(f"kernelab does not import here: {type(exc).__name__}: {exc}")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        return 2
    log(f"ops: {', '.join(o.name for o in ops)}")
    missing = [m for m in CLI_DEPS if summary["machine"].get(m) is None]
    left = lambda: args.budget_s - (time.perf_counter() - started)  # noqa: E731

    if missing:
        log(
            f"the kernelab CLI needs {missing}, not installed here: bench through the API only "
            "(no ceilings, verify, ledger or report)"
        )
        per_op = max(20.0, (left() - 10) / max(1, len(ops)))
        summary["steps"] += api_bench(ops, out, args.device, args.dtype, per_op)
    else:
        dev = ["--device", args.device]
        summary["steps"].append(
            kernelab(["ceilings", *dev, "--json"], out / "ceilings.json", 90, env)
        )
        summary["steps"].append(
            kernelab(["verify", *dev, "--json"], out / "verify.json", args.verify_s, env)
        )
        report_reserve = 45.0
        for i, op in enumerate(ops):
            per_op = (left() - report_reserve) / (len(ops) - i)
            if per_op < 15:
                log(f"time budget spent: bench of {op.name} and later ops not run")
                summary["steps"].append({"args": ["bench", op.name], "status": "not run"})
                continue
            dtype = (
                args.dtype
                if args.dtype in {str(d)[6:] for d in op.dtypes}
                else (str(op.dtypes[0])[6:])
            )
            bench_args = [
                "bench",
                op.name,
                *dev,
                "--dtype",
                dtype,
                "--json",
                "--label",
                "gpu-check",
                "--budget",
                f"{max(5.0, per_op - 20):.0f}",
                "--energy-window",
                "0.2",
                "--max-time",
                "1",
                *args.bench_arg,
            ]
            summary["steps"].append(
                kernelab(bench_args, out / f"bench-{op.name}.json", per_op + 30, env)
            )
        summary["steps"].append(
            kernelab(["report", "--out", str(out / "report.html")], None, 60, env)
        )
    summary["seconds"] = round(time.perf_counter() - started, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    bad = [s for s in summary["steps"] if s["status"] not in ("ok", "findings (exit 1)")]
    log(f"done in {summary['seconds']} s; {len(bad)} step(s) not ok; results in {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
