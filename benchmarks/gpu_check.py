"""The GPU check: ceilings, verify, bench for every op, and the HTML report, into one folder.

    PYTHONUNBUFFERED=1 PYTHONPATH=src python benchmarks/gpu_check.py --out OUT
    PYTHONUNBUFFERED=1 PYTHONPATH=src python benchmarks/gpu_check.py --rehearse --out OUT

Meant for a CUDA machine (one H200: under 8 minutes), offline, with only what is installed;
``--wheels DIR`` installs wheels brought along first (the CLI needs click, rich and orjson).
Every step runs as a ``kernelab`` command in a subprocess with its own time limit; a command
this checkout does not have, or one that fails, is reported and the check goes on. Writes
``ceilings.json``, ``verify.json``, ``bench-<op>.json``, ``report.html``, the ledger
``ledger.sqlite`` and ``summary.json`` (each step: its command, status and wall time) into
``--out``; exits 1 if a step did not succeed, 2 if the check could not start (no device).

``--rehearse`` runs the same steps through the same harness on the CPU, in about three minutes
on two cores: the torch variants only (no interpreter), one trial of the representative
shapes in verify, a second of bench per op, a bench through the Python API (the path taken when
the CLI's dependencies are missing) into ``api/``, and the offline wheel install, with a wheel
it builds itself when no ``--wheels`` is given, checked by importing it in a subprocess. A
rehearsal passes only if every step exits 0 and writes what it should.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zipfile
from pathlib import Path

CLI_DEPS = ("click", "rich", "orjson")
#: The module of the wheel a rehearsal builds and installs.
PROBE = "kernelab_rehearsal_probe"
#: Time budgets: the check on a GPU, and its rehearsal on a CPU.
#: serve-bench on a GPU: Llama-3-8B-shaped, 8 requests (its time comes out of the ops' share)
SERVE_BENCH = [
    "serve-bench", "--preset", "llama3-8b", "--requests", "8", "--prompt-len", "512",
    "--output-len", "32", "--page-size", "64", "--json", "--label", "gpu-check",
]  # fmt: skip
SERVE_BENCH_S = 120
#: With 25 ops, a GPU gets ~5 s of bench per op (its budget stops starting cases, so each op
#: still times its first cases); a rehearsal ~9 s of CPU per op.
GPU = dict(budget_s=420.0, verify_s=120.0, report_reserve=45.0 + SERVE_BENCH_S, min_per_op=5.0)
#: On a 2-core CPU the rehearsal's verify of 24 ops took 85-113 s and each bench step 6-10 s
#: (most of it starting the CLI); on 25 ops here 62-66 s, and one CI run on a like machine
#: passed 150 s: twice that for verify (a limit, not a target), 600 s in all.
REHEARSAL = dict(budget_s=600.0, verify_s=300.0, report_reserve=10.0, min_per_op=3.0)
#: What a rehearsal adds to a step's arguments: small, interpreter-free, repeatable.
REHEARSE_VERIFY = ["--variant", "torch", "--shapes", "representative", "--trials", "1"]
REHEARSE_VERIFY += ["--max-rows", "2", "--seed", "0"]
#: (the ceilings step measured the CPU: each bench takes them, not ~15 s of copies per op)
REHEARSE_BENCH = ["--variant", "torch", "--max-rows", "8", "--ceilings", "stored"]
OK = ("ok", "findings (exit 1)")


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
            with warnings.catch_warnings():  # click 8.2+ deprecates its __version__
                warnings.simplefilter("ignore", DeprecationWarning)
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
    step = {"args": args, "command": shlex.join(cmd), "seconds": seconds}
    if rc is None:
        log(f"  timed out after {timeout:.0f} s")
        return {**step, "status": "timeout", "stderr_tail": err}
    if rc == 2 and "No such command" in err:
        log(f"  `kernelab {args[0]}` is not a command of this checkout: skipped")
        return {**step, "status": "missing command"}
    status = {0: "ok", 1: "findings (exit 1)"}.get(rc, f"error (exit {rc})")
    if status in OK and out_file is not None:
        status = _output_problem(out_file) or status
    log(f"  {status} in {seconds} s")
    return {**step, "status": status, "stderr_tail": err[-2000:]}


def _output_problem(path: Path) -> str | None:
    """A step that exited well but left no JSON in its output file has failed all the same."""
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return f"error (no JSON in {path.name})"
    return None


def _run_id(path: Path) -> str | None:
    """The ledger run of a bench step's JSON output, if it has one."""
    try:
        return json.loads(path.read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def api_bench(ops, out: Path, device: str, dtype: str, budget: float, **knobs) -> list[dict]:
    """Without the CLI's dependencies: bench through the Python API, JSON via the stdlib.
    ``knobs``: more fields of ``bench.BenchConfig`` (a rehearsal's small budgets)."""
    import torch

    from kernelab import bench

    steps = []
    for op in ops:
        t0 = time.perf_counter()
        dts = (getattr(torch, dtype),) if getattr(torch, dtype) in op.dtypes else op.dtypes[:1]
        cfg = bench.BenchConfig(dtypes=dts, budget_s=budget, **knobs)
        result = bench.bench([op], device, cfg, progress=log)
        data = {"device": result.device, "cases": result.cases, "skipped": result.skipped}
        (out / f"bench-{op.name}.json").write_text(json.dumps(data, default=str, indent=1))
        steps.append(
            {
                "args": ["bench(api)", op.name],
                "command": f"kernelab.bench.bench([{op.name}], {device!r}, {cfg!r})",
                "status": "ok" if result.cases else "error (no cases timed)",
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    return steps


def install_wheels(folder: Path) -> tuple[str | None, dict]:
    """Install every wheel in ``folder`` into a private directory, without the network; the
    directory (None if nothing was installed) and the step for the summary."""
    t0 = time.perf_counter()
    wheels = sorted(str(w) for w in folder.glob("*.whl"))
    target = tempfile.mkdtemp(prefix="kernelab-wheels-")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--target", target, *wheels]
    step = {"args": ["install wheels", str(folder)], "command": shlex.join(cmd)}
    if not wheels:
        log(f"no wheels in {folder}")
        return None, {**step, "status": "error (no wheels)", "seconds": 0.0}
    rc = subprocess.run(cmd).returncode
    log(f"installed {len(wheels)} wheel(s) into {target}" if rc == 0 else "wheel install failed")
    step.update(status="ok" if rc == 0 else f"error (exit {rc})")
    step.update(seconds=round(time.perf_counter() - t0, 1), wheels=[Path(w).name for w in wheels])
    return (target if rc == 0 else None), step


def build_probe_wheel(folder: Path) -> Path:
    """A real wheel (PEP 427: purelib, METADATA, WHEEL, RECORD with hashes) of a one-module
    package, for a rehearsal of the offline install where no wheels were brought."""
    dist = f"{PROBE}-1.0.dist-info"
    files = {
        f"{PROBE}.py": b'"""Installed by the gpu-check rehearsal."""\n\nVERSION = "1.0"\n',
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: kernelab-rehearsal-probe\n"
        b"Version: 1.0\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kernelab gpu_check\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{PROBE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def probe_import(env: dict, target: str | None) -> dict:
    """The rehearsal's wheel is importable, from the install directory, by a child process
    that gets the environment the kernelab steps get."""
    code = f"import {PROBE} as m; print(m.__file__)"
    cmd = [sys.executable, "-c", code]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    where = proc.stdout.strip()
    ok = proc.returncode == 0 and target is not None and where.startswith(target)
    status = "ok" if ok else f"error (import from {target}: {proc.stderr.strip()[-300:] or where})"
    log(f"  wheel probe: {status}")
    return {
        "args": ["import installed wheel", PROBE],
        "command": shlex.join(cmd),
        "status": status,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for JSON, HTML and the ledger")
    p.add_argument("--device", default=None, help="device to check (default: cuda; cpu rehearsing)")
    p.add_argument("--budget-s", type=float, default=None, help="total time to aim for")
    p.add_argument("--dtype", default="bfloat16", help="dtype bench times (default bfloat16)")
    p.add_argument("--verify-s", type=float, default=None, help="time limit of verify")
    p.add_argument("--ops", nargs="*", default=None, help="ops (default: all registered)")
    p.add_argument("--bench-arg", action="append", default=[], help="extra bench argument")
    p.add_argument(
        "--wheels", default=None, help="folder of wheels to install first (offline machines)"
    )
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="the same steps on the CPU with small budgets (a machine without a GPU)",
    )
    args = p.parse_args(argv)
    budgets = REHEARSAL if args.rehearse else GPU
    args.device = args.device or ("cpu" if args.rehearse else "cuda")
    if args.rehearse and args.device != "cpu":
        p.error("--rehearse runs on the CPU: leave --device out or give cpu")
    args.budget_s = args.budget_s or budgets["budget_s"]
    args.verify_s = args.verify_s or budgets["verify_s"]
    args.report_reserve, args.min_per_op = budgets["report_reserve"], budgets["min_per_op"]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"mode": "rehearsal" if args.rehearse else "gpu", "steps": [], "out": str(out)}
    wheels = Path(args.wheels) if args.wheels else None
    if wheels is None and args.rehearse:
        wheels = build_probe_wheel(Path(tempfile.mkdtemp(prefix="kernelab-rehearsal-"))).parent
    extra_path = None
    if wheels is not None:
        extra_path, step = install_wheels(wheels)
        summary["steps"].append(step)
    if extra_path:
        sys.path.insert(0, extra_path)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [extra_path, os.environ.get("PYTHONPATH")])
        )

    env = dict(os.environ, PYTHONUNBUFFERED="1", KERNELAB_LEDGER=str(out / "ledger.sqlite"))
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    sys.path.insert(0, str(src))
    if args.rehearse and not args.wheels:
        summary["steps"].append(probe_import(env, extra_path))
    summary["machine"] = machine()
    log(json.dumps(summary["machine"]))

    def finish(code: int | None = None) -> int:
        summary["seconds"] = round(time.perf_counter() - started, 1)
        ok = OK[:1] if args.rehearse else OK  # a rehearsal's torch variants have no findings
        bad = [s for s in summary["steps"] if s["status"] not in ok]
        summary["failed"] = [" ".join(s["args"][:2]) or s["status"] for s in bad]
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        for s in bad:  # at the end too, where a CI log's tail shows it
            log(f"not ok: {' '.join(s['args'][:2]) or '(check)'}: {s['status']}")
            for line in s.get("stderr_tail", "").splitlines()[-8:]:
                log(f"  | {line}")
        log(f"done in {summary['seconds']} s; {len(bad)} step(s) not ok; results in {out}")
        return code if code is not None else (1 if bad else 0)

    if args.device.startswith("cuda") and not summary["machine"]["device"].count("SMs"):
        found = summary["machine"]["device"]
        found = "" if found == "no CUDA/ROCm device" else f" ({found})"
        log(
            f"no CUDA/ROCm device here{found}: the check needs one; nothing was run "
            "(`--rehearse` runs its steps on the CPU)"
        )
        summary["steps"].append({"args": [], "status": "no device"})
        return finish(2)

    try:
        from kernelab import ops as registry

        ops = [registry.get(n) for n in args.ops] if args.ops else registry.all_ops()
    except Exception as exc:
        log(f"kernelab does not import here: {type(exc).__name__}: {exc}")
        summary["steps"].append({"args": ["import kernelab"], "status": f"error ({exc})"})
        return finish(2)
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
        # the ops asked for (all by default): `--ops rmsnorm gemm` verifies those two only
        names = [op.name for op in ops] if args.ops else []
        verify = ["verify", *names, *dev, "--json", *(REHEARSE_VERIFY if args.rehearse else [])]
        summary["steps"].append(kernelab(verify, out / "verify.json", args.verify_s, env))
        for i, op in enumerate(ops):
            per_op = (left() - args.report_reserve) / (len(ops) - i)
            if per_op < args.min_per_op:
                log(f"time budget spent: bench of {op.name} and later ops not run")
                summary["steps"].append({"args": ["bench", op.name], "status": "not run"})
                continue
            summary["steps"].append(
                kernelab(
                    bench_args(op, args, per_op), out / f"bench-{op.name}.json", per_op + 30, env
                )
            )
        if args.rehearse:  # the path taken where the CLI's dependencies are missing
            (out / "api").mkdir(exist_ok=True)
            knobs = dict(variants=("torch",), max_rows=8, energy_window_s=0.0)
            summary["steps"] += api_bench(
                ops[:1], out / "api", args.device, args.dtype, 1.0, **knobs
            )
        if not args.rehearse:  # a short continuous-batching run, kernelab's attention in it
            summary["steps"].append(kernelab(SERVE_BENCH + dev, out / "serve-bench.json",
                                             SERVE_BENCH_S, env))  # fmt: skip
        # every op's bench run (a label names only the newest run that has it)
        runs = [r for r in (_run_id(out / f"bench-{op.name}.json") for op in ops) if r]
        summary["steps"].append(
            kernelab(["report", *runs, "--out", str(out / "report.html")], None, 60, env)
        )
        if not (out / "report.html").is_file():
            summary["steps"][-1]["status"] = "error (no report.html)"
    return finish()


def bench_args(op, args, per_op: float) -> list[str]:
    """The bench command of one op: the chosen dtype if the op has it, else its first."""
    dtype = args.dtype if args.dtype in {str(d)[6:] for d in op.dtypes} else str(op.dtypes[0])[6:]
    budget = 1.0 if args.rehearse else max(5.0, per_op - 20)
    return [
        "bench",
        op.name,
        "--device",
        args.device,
        "--dtype",
        dtype,
        "--json",
        "--label",
        "gpu-check",
        "--budget",
        f"{budget:.0f}",
        "--energy-window",
        "0.2",
        "--max-time",
        "1",
        *(REHEARSE_BENCH if args.rehearse else []),
        *args.bench_arg,
    ]


if __name__ == "__main__":
    sys.exit(main())
