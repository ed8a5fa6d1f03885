"""kernelab trace summary vs Holistic Trace Analysis (HTA): time, peak memory, and kernel time
per category, on the real traces in the shared folder (largest first).

HTA runs from its own virtual environment (never kernelab's), e.g.::

    python3 -m venv /tmp/hta && /tmp/hta/bin/pip install holistictraceanalysis
    python benchmarks/bench_trace.py --hta-python /tmp/hta/bin/python

Each tool runs as a fresh subprocess: wall time and peak RSS are those of the whole process
(interpreter start, imports, parsing, analysis), measured by a small wrapper process through
``resource.getrusage(RUSAGE_CHILDREN)``. Where kernelab forks decoding workers, their CPU time
is in that figure and their peak RSS (reported in its JSON) is added to the process's: an
upper bound, as pages a worker shares with its parent count twice. kernelab runs its command
line, ``python -m kernelab trace summary TRACE --json`` (every analysis: breakdown, idle,
launches, kernels, roofline, fusion, occupancy); HTA parses the trace and computes
``get_gpu_kernel_breakdown`` (the per-category sums for the comparison table come from one
more, untimed run). Before timing, kernelab's modules are compiled to bytecode (as an install
does), so no run pays for compiling them. The reported time is the median of ``--repeat``
runs (``--repeat-kernelab`` for kernelab: its runs are short, HTA's long); memory is the
largest; every run's CPU time is printed under its row.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernelab import _flags  # noqa: E402

MEASURE = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
proc = subprocess.run(sys.argv[2:], stdout=open(sys.argv[1], "wb"), stderr=subprocess.PIPE)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
rss = ru.ru_maxrss * 1024
print(json.dumps({"rc": proc.returncode, "wall_s": wall, "peak_rss": rss,
                  "cpu_s": ru.ru_utime + ru.ru_stime,
                  "stderr": proc.stderr.decode(errors="replace")[-2000:]}))
"""

HTA = r"""
import json, sys, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_files={0: sys.argv[1]}, include_last_profiler_step=True)
ta.get_temporal_breakdown(visualize=False)
kt, _ = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
if sys.argv[2:] == ["--compare"]:  # per-category sums for the comparison (never timed)
    from hta.utils.utils import get_kernel_type
    df = ta.t.get_trace(0)
    sym = ta.t.symbol_table.get_sym_table()
    g = df[df["stream"].ne(-1)]
    types = g["name"].map(lambda i: get_kernel_type(sym[i]))
    cats = g["cat"].map(lambda i: sym[i])
    out = {"merged": {r["kernel_type"]: float(r["sum"]) for _, r in kt.iterrows()},
           "sum": {k: float(v) for k, v in g.groupby(types)["dur"].sum().items()},
           "sum_by_cat": {f"{a}|{b}": float(v) for (a, b), v in
                          g.groupby([types, cats])["dur"].sum().items()}}
    print("HTA_RESULT" + json.dumps(out))
"""

KERNELAB_TO_HTA = {"compute": "COMPUTATION", "memory": "MEMORY", "communication": "COMMUNICATION"}
#: The event categories kernelab counts as GPU work (HTA also counts any event with a stream).
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


# --- synthetic traces: several streams, CUDA-graph replays, NCCL, in every layout ---

A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 84990623744,
        "computeMajor": 8, "computeMinor": 0, "numSms": 108, "warpSize": 32,
        "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
        "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "sharedMemPerBlock": 49152,
        "sharedMemPerMultiprocessor": 167936, "sharedMemPerBlockOptin": 166912}  # fmt: skip
#: The layouts real tools write: name -> (file suffix, how the document is laid out).
LAYOUTS = {
    "kineto": ".json.gz",  # one event per line, metadata first (PyTorch's writer)
    "one-line": ".json.gz",  # minified, traceEvents first, metadata after
    "indent2": ".json.gz",  # json.dump(indent=2) style, metadata first
    "one-line-raw": ".json",  # minified, not compressed
}


def synthetic_events(n: int):
    """About ``n`` events of a training-like step, in blocks: per iteration a cpu op, its
    launch call and kernel (three compute streams), the flow pair Kineto adds; every 16th a
    CUDA-graph replay of 8 kernels; every 8th an NCCL all-reduce on a communication stream
    overlapping compute; every 32nd a host-to-device copy."""
    base, t, corr, made, i = 1_700_000_000_000, 0.0, 0, 0, 0
    pid = 4242
    while made < n:
        block = []
        for _ in range(256):
            corr += 1
            stream = 7 + i % 3
            ts = base + t
            block.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::linear",
                    "pid": pid,
                    "tid": 1,
                    "ts": ts,
                    "dur": 9.5,
                    "args": {
                        "External id": corr,
                        "Input Dims": [[8, 4096], [4096, 4096]],
                        "Input type": ["float"] * 2,
                    },
                }
            )
            block.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid,
                    "tid": 1,
                    "ts": ts + 1,
                    "dur": 4.25,
                    "args": {"correlation": corr, "cbid": 211},
                }
            )
            block.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"sm80_xmma_gemm_{i % 7}",
                    "pid": 0,
                    "tid": stream,
                    "ts": ts + 6,
                    "dur": 7.125,
                    "args": {
                        "correlation": corr,
                        "device": 0,
                        "stream": stream,
                        "registers per thread": 128,
                        "shared memory": 49152,
                        "grid": [64, 1, 1],
                        "block": [128, 1, 1],
                    },
                }
            )
            block.append(
                {
                    "ph": "s",
                    "id": corr,
                    "pid": pid,
                    "tid": 1,
                    "ts": ts + 1,
                    "cat": "ac2g",
                    "name": "ac2g",
                }
            )
            block.append(
                {
                    "ph": "f",
                    "id": corr,
                    "pid": 0,
                    "tid": stream,
                    "ts": ts + 6,
                    "cat": "ac2g",
                    "name": "ac2g",
                    "bp": "e",
                }
            )
            if i % 16 == 0:
                corr += 1
                block.append(
                    {
                        "ph": "X",
                        "cat": "cuda_runtime",
                        "name": "cudaGraphLaunch",
                        "pid": pid,
                        "tid": 1,
                        "ts": ts + 5,
                        "dur": 3.0,
                        "args": {"correlation": corr},
                    }
                )
                for k in range(8):
                    block.append(
                        {
                            "ph": "X",
                            "cat": "kernel",
                            "name": f"graph_kernel_{k}",
                            "pid": 0,
                            "tid": 11,
                            "ts": ts + 8 + 2 * k,
                            "dur": 1.5,
                            "args": {"correlation": corr, "device": 0, "stream": 11},
                        }
                    )
            if i % 8 == 0:
                corr += 1
                block.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "pid": 0,
                        "tid": 20,
                        "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWork*)",
                        "ts": ts + 3,
                        "dur": 30.0,
                        "args": {"correlation": corr, "device": 0, "stream": 20},
                    }
                )
            if i % 32 == 0:
                corr += 1
                block.append(
                    {
                        "ph": "X",
                        "cat": "gpu_memcpy",
                        "pid": 0,
                        "tid": 7,
                        "name": "Memcpy HtoD (Pinned -> Device)",
                        "ts": ts + 2,
                        "dur": 2.0,
                        "args": {"correlation": corr, "device": 0, "stream": 7, "bytes": 1 << 20},
                    }
                )
            t += 12.0
            i += 1
        made += len(block)
        yield block  # fmt: skip


def write_synthetic(n: int, layout: str, path: Path) -> int:
    """Write about ``n`` events in ``layout``; returns the number written."""
    import gzip

    import orjson

    head = {"schemaVersion": 1, "deviceProperties": [A100, {**A100, "id": 1}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}}  # fmt: skip
    tail = {"traceName": "synthetic", "displayTimeUnit": "ms"}
    raw = open(path, "wb")  # noqa: SIM115 - closed below, maybe through gzip
    out = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) if path.suffix == ".gz" else raw
    count = 0
    first = True
    if layout == "kineto":
        out.write(
            b"{\n"
            + b"".join(b'  "%s": %s,\n' % (k.encode(), orjson.dumps(v)) for k, v in head.items())
            + b'  "traceEvents": [\n'
        )
        sep, wrap = b",\n", lambda e: b"  " + orjson.dumps(e)
        end = b"\n],\n" + orjson.dumps(tail)[1:-1] + b"\n}"
    elif layout == "indent2":
        meta = orjson.dumps(head, option=orjson.OPT_INDENT_2)
        out.write(meta[:-2] + b',\n  "traceEvents": [\n')
        sep = b",\n"

        def wrap(e):
            return b"    " + orjson.dumps(e, option=orjson.OPT_INDENT_2).replace(b"\n", b"\n    ")

        end = b"\n  ],\n" + orjson.dumps(tail, option=orjson.OPT_INDENT_2)[2:]
    else:  # minified, events first
        out.write(b'{"traceEvents":[')
        sep, wrap = b",", orjson.dumps
        end = b"]," + orjson.dumps({**head, **tail})[1:]
    for block in synthetic_events(n):
        data = sep.join(map(wrap, block))
        out.write(data if first else sep + data)
        first = False
        count += len(block)
    out.write(end)
    out.close()
    raw.close()
    return count


def measure(cmd: list[str], env: dict) -> tuple[dict, bytes]:
    with tempfile.NamedTemporaryFile(suffix=".out") as out:
        res = subprocess.run(
            [sys.executable, "-c", MEASURE, out.name, *cmd],
            capture_output=True,
            env=env,
            check=True,
        )
        stats = json.loads(res.stdout)
        return stats, Path(out.name).read_bytes()


def hta_filters(trace: Path) -> bool:
    """Whether HTA drops GPU events without a launch call here (2+ ProfilerStep names)."""
    from kernelab.trace import load

    t = load(trace)
    return sum(s.startswith("ProfilerStep") for s in t.strings) >= 2


def with_hta_conventions(trace: Path) -> dict[str, float]:
    """kernelab's per-category kernel time computed with HTA's two conventions: events without
    a launch call dropped (when it filters), and nanosecond times rounded inwards to whole
    microseconds (start up, end down) when the trace has fractional microseconds."""
    import numpy as np

    from kernelab.trace import load
    from kernelab.trace._link import CATEGORY_ORDER, Links

    t = load(trace)
    links = Links(t)
    rows = links.gpu
    start, dur = t.ts[rows], t.dur[rows]
    if (start % 1000).any() or (dur % 1000).any():
        us = -(-start // 1000), (start + dur) // 1000  # ceil(start), floor(end)
        dur_us = (us[1] - us[0]).astype(np.float64)
    else:
        dur_us = dur / 1000
    keep = links.launch_of >= 0 if hta_filters(trace) else np.ones(len(rows), dtype=bool)
    return {
        c: float(dur_us[keep & (links.category == i)].sum()) for i, c in enumerate(CATEGORY_ORDER)
    }


def versions(hta_python: str) -> dict:
    import numpy
    import orjson

    hta = subprocess.run(
        [
            hta_python,
            "-c",
            "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()

    def version(module: str) -> str:
        try:
            return __import__(module).__version__
        except (ImportError, AttributeError):
            return "not installed"

    return {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "orjson": orjson.__version__,
        "msgspec": version("msgspec"),
        "isal": version("isal"),
        "hta": hta or "not found",
        "load": os.getloadavg(),
        "kernelab_commit": _commit(),
    }


def _commit() -> str:
    """The checkout's commit (and whether it has changes), or 'unknown' outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with changes)" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hta-python", default="/tmp/hta/bin/python")
    ap.add_argument("--repeat", type=int, default=3, help="runs per trace per tool")
    ap.add_argument(
        "--repeat-small", type=int, default=1, help="runs for traces under 1 MB (default 1)"
    )
    ap.add_argument(
        "--repeat-kernelab",
        type=int,
        help="runs of kernelab per trace (default: --repeat); more than HTA's narrows its "
        "median where HTA's runs are long (the first ones interleaved with HTA's)",
    )
    ap.add_argument("--traces", nargs="*", help="trace files (default: the shared folder's)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument(
        "--synthetic",
        type=int,
        nargs="*",
        metavar="EVENTS",
        help="instead of the shared traces: synthetic traces of these sizes (e.g. 200000 "
        "2000000), each written in every layout (compared on time and memory only)",
    )
    ap.add_argument("--layouts", nargs="*", choices=sorted(LAYOUTS), help="with --synthetic")
    ap.add_argument(
        "--workers",
        type=int,
        help="pass --workers N to kernelab (default: none, as a user runs it; the processes "
        "that decoded each trace are printed either way)",
    )
    args = ap.parse_args()
    workdir = None
    if args.synthetic:
        workdir = tempfile.TemporaryDirectory(prefix="kernelab-bench-trace-")
        traces = []
        for n in args.synthetic:
            for layout in args.layouts or list(LAYOUTS):
                path = Path(workdir.name) / f"synthetic_{n}_{layout}{LAYOUTS[layout]}"
                written = write_synthetic(n, layout, path)
                print(f"wrote {path.name}: {written} events, {path.stat().st_size / 2**20:.0f} "
                      f"MB ({layout})", flush=True)  # fmt: skip
                traces.append(path)
    elif args.traces:
        traces = [Path(t).resolve() for t in args.traces]
    else:
        shared = _flags.shared_dir()
        if shared is None or not (shared / "traces").is_dir():
            print("no shared traces folder found; pass --traces", file=sys.stderr)
            return 2
        traces = sorted((shared / "traces").glob("*.json*"), key=lambda p: -p.stat().st_size)
    env_k = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    compileall.compile_dir(str(ROOT / "src" / "kernelab"), quiet=1)
    env_h = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    print(json.dumps(versions(args.hta_python)))
    header = (
        f"{'trace':28} {'wall kl':>7} {'HTA':>7} {'ratio':>7} {'cpu kl':>7} {'HTA':>7} "
        f"{'ratio':>7} {'MB kl':>7} {'HTA':>7} {'kl/HTA':>6} {'procs':>5}  load after"
    )
    k_cmd = [sys.executable, "-m", "kernelab", "trace", "summary"]
    k_opts = ["--json"] + (["--workers", str(args.workers)] if args.workers else [])
    print(header)
    results = []
    for trace in traces:
        k_runs, h_runs = [], []
        k_out = h_out = b""
        reps = args.repeat if trace.stat().st_size >= 2**20 else args.repeat_small
        k_reps = max(reps, args.repeat_kernelab or reps)
        for i in range(k_reps):  # interleaved, so both see the same machine load
            st, k_out = measure([*k_cmd, str(trace), *k_opts], env_k)
            if st["rc"] == 0:  # forked decoding workers: their peaks count on top
                ingest = json.loads(k_out)["ingest"]
                st["peak_rss"] += sum(ingest["worker_peak_rss"])
                st["workers"] = ingest["workers"]
            k_runs.append(st)
            if i < reps:
                st, h_out = measure([args.hta_python, "-c", HTA, str(trace)], env_h)
                h_runs.append(st)
        row = {"trace": trace.name, "bytes": trace.stat().st_size}
        for name, runs in (("kernelab", k_runs), ("hta", h_runs)):
            ok = [r for r in runs if r["rc"] == 0]
            row[name] = {
                "ok": len(ok) == len(runs),
                "wall_s": statistics.median(r["wall_s"] for r in ok) if ok else None,
                "peak_mb": max(r["peak_rss"] for r in ok) / 2**20 if ok else None,
                "cpu_s": statistics.median(r["cpu_s"] for r in ok) if ok else None,
                "cpu_runs_s": [round(r["cpu_s"], 3) for r in ok],
                "error": None if ok else runs[0]["stderr"].strip().splitlines()[-1:],
            }
        row["kernelab"]["workers"] = sorted({r["workers"] for r in k_runs if "workers" in r})
        row["load_after"] = os.getloadavg()
        if row["hta"]["ok"] and not args.synthetic:  # HTA's category sums: one more, untimed
            _, h_out = measure([args.hta_python, "-c", HTA, str(trace), "--compare"], env_h)
        cats = {}
        if row["kernelab"]["ok"] and not args.synthetic:
            summary = json.loads(k_out)
            mine: dict[str, float] = {}
            for dev in (summary.get("gpu") or {}).get("breakdown", []):
                for c, v in dev["categories"].items():
                    mine[c] = mine.get(c, 0.0) + v["kernel_time_us"]
            conv = with_hta_conventions(trace)
            hta = {}
            marker = h_out.find(b"HTA_RESULT")
            if row["hta"]["ok"] and marker >= 0:
                hta = json.loads(h_out[marker + len(b"HTA_RESULT") :])
            for c, hk in KERNELAB_TO_HTA.items():
                h_all = hta.get("sum", {}).get(hk, 0.0)
                h_gpu = sum(
                    v
                    for key, v in hta.get("sum_by_cat", {}).items()
                    if key.split("|")[0] == hk and key.split("|")[1] in GPU_CATS
                )
                cats[c] = {
                    "kernelab_us": mine.get(c, 0.0),
                    "kernelab_hta_conventions_us": conv[c],
                    "hta_us": h_all,
                    "hta_gpu_events_us": h_gpu,
                    "rel_diff": (mine.get(c, 0.0) - h_all) / h_all if h_all else None,
                    "rel_diff_like_for_like": (conv[c] - h_gpu) / h_gpu if h_gpu else None,
                }
            row["hta_detail"] = hta
        row["categories"] = cats
        results.append(row)
        k, h = row["kernelab"], row["hta"]
        speed = h["wall_s"] / k["wall_s"] if k["wall_s"] and h["wall_s"] else None
        cpu = h["cpu_s"] / k["cpu_s"] if k["cpu_s"] and h["cpu_s"] else None
        mem = k["peak_mb"] / h["peak_mb"] if k["peak_mb"] and h["peak_mb"] else None

        def fmt(v, spec):
            return format(v, spec) if v is not None else "fail"

        print(
            f"{trace.name:28} {fmt(k['wall_s'], '7.2f')} {fmt(h['wall_s'], '7.2f')} "
            f"{fmt(speed, '6.1f')}x {fmt(k['cpu_s'], '7.2f')} {fmt(h['cpu_s'], '7.2f')} "
            f"{fmt(cpu, '6.1f')}x {fmt(k['peak_mb'], '7.0f')} {fmt(h['peak_mb'], '7.0f')} "
            f"{fmt(mem, '6.2f')} {','.join(map(str, k['workers'])) or '-':>5}  "
            f"{' '.join(f'{x:.1f}' for x in row['load_after'])}"
            + (f"  HTA error: {h['error']}" if not h["ok"] else "")
        )
        print(  # the spread the ratio has to clear
            f"{'':28} CPU per run: kernelab {' '.join(f'{x:.2f}' for x in k['cpu_runs_s'])}; "
            f"HTA {' '.join(f'{x:.2f}' for x in h['cpu_runs_s'])}",
            flush=True,
        )
    print()
    print(
        f"{'trace':28} {'category':13} {'kernelab us':>12} {'HTA us':>12} {'diff':>8}   "
        f"{'kl, HTA conv.':>13} {'HTA GPU evts':>12} {'diff':>8}"
    )
    for row in results:
        for c, v in row["categories"].items():
            if not v["kernelab_us"] and not v["hta_us"]:
                continue

            def pct(x):
                return f"{100 * x:+7.2f}%" if x is not None else "       -"

            print(
                f"{row['trace']:28} {c:13} {v['kernelab_us']:12.1f} {v['hta_us']:12.1f} "
                f"{pct(v['rel_diff'])}   {v['kernelab_hta_conventions_us']:13.1f} "
                f"{v['hta_gpu_events_us']:12.1f} {pct(v['rel_diff_like_for_like'])}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if workdir is not None:
        workdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
