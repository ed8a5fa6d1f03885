"""GEMM speed against cuBLAS (torch.matmul), on the targets of the GEMM family.

    python benchmarks/bench_gemm.py [--quick] [--json]

Cases, each timed for kernelab and for bf16 cuBLAS on the same shape:
- bf16 gemm at 4096³ and 8192³ (target ≥ 95% of cuBLAS) and the representative projections at
  M ≥ 128 (target ≥ 1.0×);
- w4a16 at M = 1 and 16 (target ≥ 3× and ≥ 2× bf16 cuBLAS; at M = 1 also ≥ 75% of HBM
  bandwidth on the packed weight bytes) and w8a16 at the same M;
- fp8 row-wise at 8192³ (target ≥ 1.6× bf16 cuBLAS).

Timing: CUDA events around a CUDA-graph replay of ``REPS`` calls that rotate among enough
input sets to exceed twice the L2 size (cold cache for every call), L2 also flushed before each
replay outside the events; median of the samples; inputs from the op's own generator (never
zeros). The machine, versions and the floor (cost model / datasheet peak)
print with the numbers. Needs a CUDA or ROCm device; on CPU it says so and exits.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch
import triton

from kernelab.ops import FP8_GEMM, GEMM, W4A16_GEMM, W8A16_GEMM, Shape
from kernelab.ops.matmul.fp8_gemm import fp8_supported

REPS = 20
SAMPLES = 15
#: HBM bandwidth (bytes/s) for the % of bandwidth column; datasheet H200/H100 figures.
DATASHEET_BW = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.039e12, "MI300X": 5.3e12}


def _time(fns, flush: torch.Tensor) -> float:
    """Median seconds per call: a graph of REPS calls cycling through ``fns`` (one closure per
    input set), L2 flushed before every replay."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fns[0]()  # compile and autotune outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(REPS):
            fns[i % len(fns)]()
    times = []
    for _ in range(SAMPLES):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / REPS)
    return statistics.median(times)


def _bf16_baseline(m, n, k, sets):
    fns = []
    for _ in range(sets):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        fns.append(lambda a=a, w=w: torch.nn.functional.linear(a, w))
    return fns


def _cases(quick: bool):
    big = [4096] if quick else [4096, 8192]
    for s in big:
        yield "gemm", GEMM, Shape(f"{s}³", {"M": s, "N": s, "K": s}, {"layout": "nk"})
    reps = [s for s in GEMM.shapes("representative") if s.dims["M"] in (128, 2048, 8192)]
    for s in reps[: 6 if quick else None]:
        yield "gemm", GEMM, s
    for op in (W4A16_GEMM, W8A16_GEMM):
        for s in op.shapes("representative"):
            if s.dims["M"] in (1, 16) and (not quick or s.dims["N"] == 4096):
                yield op.name, op, s
    if fp8_supported(torch.device("cuda")):
        yield "fp8", FP8_GEMM, Shape("8192³ row-wise", {"M": 8192, "N": 8192, "K": 8192})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gemm: needs a CUDA or ROCm device; nothing measured on this machine")
        return 0
    props = torch.cuda.get_device_properties(0)
    bw = next((v for key, v in DATASHEET_BW.items() if key in props.name), None)
    header = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "bandwidth_source": "datasheet" if bw else "unknown",
    }
    print(json.dumps(header) if args.json else " ".join(f"{k}={v}" for k, v in header.items()))
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")  # > 2x any L2 here
    l2 = getattr(props, "L2_cache_size", 64 * 2**20)
    for name, op, shape in _cases(args.quick):
        cost = op.cost(op.inputs(shape, torch.bfloat16, "meta"))
        d = shape.dims
        dense = 2 * (d["M"] * d["K"] + d["N"] * d["K"] + d["M"] * d["N"])
        kernel = op.variants["kernelab"]
        sets = [
            op.inputs(shape, torch.bfloat16, "cuda", seed=i)
            for i in range(min(REPS, 1 + 2 * l2 // max(1, int(cost.bytes))))
        ]
        t_ours = _time([lambda x=x, f=kernel: f(**x) for x in sets], flush)
        del sets
        base_sets = min(REPS, 1 + 2 * l2 // dense)
        t_base = _time(_bf16_baseline(d["M"], d["N"], d["K"], base_sets), flush)
        row = {
            "op": name,
            "shape": shape.label,
            "kernelab_us": round(t_ours * 1e6, 2),
            "cublas_bf16_us": round(t_base * 1e6, 2),
            "speedup": round(t_base / t_ours, 3),
            "tflops": round(cost.flops / t_ours / 1e12, 1),
            "hbm_pct": round(100 * cost.bytes / t_ours / bw, 1) if bw else None,
        }
        print(json.dumps(row) if args.json else "  ".join(f"{k}={v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
