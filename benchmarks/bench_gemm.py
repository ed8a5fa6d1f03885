"""GEMM speed against cuBLAS (torch.matmul), on the targets of the GEMM family.

    python benchmarks/bench_gemm.py [--quick] [--json]

Cases, each timed for kernelab and for bf16 cuBLAS on the same shape:
- bf16 gemm at 4096³ and 8192³ (target ≥ 95% of cuBLAS) and the representative projections at
  M ≥ 128 (target ≥ 1.0×);
- w4a16 at M = 1 and 16 (target ≥ 3× and ≥ 2× bf16 cuBLAS; at M = 1 also ≥ 75% of HBM
  bandwidth on the packed weight bytes) and w8a16 at the same M;
- fp8 row-wise at 8192³ (target ≥ 1.6× bf16 cuBLAS);
- fp8_block_gemm (1 × 128 / 128 × 128 block scales) on the DeepSeek-V3 projections: targets
  ≥ 1.5× vLLM's Triton block-fp8 GEMM and ≥ 80% of DeepGEMM, each timed where installed;
- mx_gemm (mxfp4) and nvfp4_gemm with on-the-fly quantized activations at M ≥ 1024 on sm_100:
  target ≥ 1.8× bf16 cuBLAS each (printed as ``target``; measured only on such a machine,
  never asserted).

Floors: ``--floors`` (and any run without a GPU) prints each block-scaled shape's floor on an
H200 and a B200 from the datasheet table (kernelab.hardware): the larger of bytes / HBM
bandwidth and FLOPs / the tensor-core rate the kernel runs at there: fp8 for fp8_block_gemm;
for mx_gemm fp4 (mxfp4) or fp8 (mxfp8) and for nvfp4_gemm fp4 where the block-scaled MMA is
native (B200, both operands quantized), bf16 where tl.dot_scaled is emulated (H200, which has
no fp4 row in the table; weight-only everywhere).

Timing: CUDA events around a CUDA-graph replay of ``REPS`` calls that rotate among enough
input sets to exceed twice the L2 size (cold cache for every call), L2 also flushed before each
replay outside the events; median of the samples; inputs from the op's own generator (never
zeros). The machine, versions and the floor (cost model / datasheet peak)
print with the numbers. Timings need a CUDA or ROCm device; on CPU the script prints the floors
and says that nothing was timed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch
import triton

from kernelab.hardware import lookup
from kernelab.ops import (
    FP8_BLOCK_GEMM,
    FP8_GEMM,
    GEMM,
    MX_GEMM,
    NVFP4_GEMM,
    W4A16_GEMM,
    W8A16_GEMM,
    Shape,
)
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


# --- floors of the block-scaled GEMMs (no GPU needed) --------------------------------------------


def _rate(op, shape, native_block_scaled: bool) -> str:
    """The tensor-core rate (hardware-table dtype) a block-scaled shape runs at on a device."""
    if op is FP8_BLOCK_GEMM:
        return "fp8"
    if shape.params.get("quantize_a") and native_block_scaled:
        return "fp8" if shape.params.get("fmt") == "mxfp8" else "fp4"  # mxfp4 and nvfp4
    return "bf16"  # tl.dot_scaled emulated: operands upcast to bf16


def floors(quick: bool) -> list[dict]:
    """Per block-scaled shape, the datasheet floor on an H200 and a B200 (see the docstring)."""
    devices = [lookup("H200"), lookup("B200")]
    rows = []
    for op in (FP8_BLOCK_GEMM, MX_GEMM, NVFP4_GEMM):
        shapes = op.shapes("representative")
        if quick:
            shapes = [s for s in shapes if s.dims["M"] in (1, 2048)][:6]
        for shape in shapes:
            cost = op.cost(op.inputs(shape, torch.bfloat16, "meta"))
            row = {"op": op.name, "shape": shape.label}
            for spec in devices:
                rate = _rate(op, shape, "fp4" in spec.peak_flops)
                t_mem = cost.bytes / spec.hbm_bytes_per_s
                t_flop = cost.flops / spec.peak_for(rate)
                key = spec.name.split()[0].lower()
                row[f"{key}_us"] = round(max(t_mem, t_flop) * 1e6, 2)
                row[f"{key}_bound"] = f"{'memory' if t_mem >= t_flop else 'compute'} ({rate})"
            rows.append(row)
    return rows


BOUNDS = ("h200_bound", "b200_bound")
#: Speed-up over bf16 cuBLAS each block-scaled fp4 GEMM aims at on sm_100 (M ≥ 1024, both
#: operands quantized): reported beside the measurement, never asserted.
BLOCK_SCALED_TARGETS = {MX_GEMM: 1.8, NVFP4_GEMM: 1.8}


def _short(label: str) -> str:
    """A shape label in 40 columns: M and N×K kept, the phase and model aliases dropped ("qa":
    activations quantized)."""
    for old, new in ((" decode", ""), (" prefill", ""), (" quantized a", " qa")):
        label = label.replace(old, new)
    head, _, tail = label.partition(" ")
    return f"{head.split('/')[0]} {tail}"[:40]


def _print_floors(args) -> None:
    rows = floors(args.quick)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print("floors from the datasheet table (kernelab.hardware), dense peaks:")
    print("  H200 4.8 TB/s, fp8 1979 / bf16 989 TFLOP/s")
    print("  B200 8 TB/s, fp4 9000 / fp8 4500 / bf16 2250 TFLOP/s")
    print("  bound: memory or compute, at the rate the kernel runs at on that device")
    op = None
    for row in rows:
        if row["op"] != op:
            op = row["op"]
            print(f"{op:40} {'H200 us':>8} {'bound':10} {'B200 us':>8} bound")
        b = {k: row[k].replace("memory ", "mem ").replace("compute ", "cmp ") for k in BOUNDS}
        print(
            f"{_short(row['shape']):40} {row['h200_us']:8.2f} {b['h200_bound']:10} "
            f"{row['b200_us']:8.2f} {b['b200_bound']}"
        )


# --- timings -------------------------------------------------------------------------------------


def _block_fp8_baselines(shape, inputs_list):
    """vLLM's Triton block-fp8 GEMM and DeepGEMM on the same inputs, where installed."""
    out = {}
    for name, target in (("vllm", 1.5), ("deep_gemm", 0.8)):
        variant = FP8_BLOCK_GEMM.variants.get(name)
        if variant is None:
            print(f"  {name}: not installed here, its target (kernelab ≥ {target}×) not checked")
            continue
        out[name] = ([lambda x=x, f=variant: f(**x) for x in inputs_list], target)
    return out


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
        for s in FP8_BLOCK_GEMM.shapes("representative"):
            if s.label.startswith("deepseek") and (not quick or s.dims["M"] in (16, 4096)):
                yield "fp8_block", FP8_BLOCK_GEMM, s
    if torch.cuda.get_device_capability()[0] >= 10:
        for s in MX_GEMM.shapes("representative"):
            if s.dims["M"] >= 1024 and s.params["fmt"] == "mxfp4" and s.params["quantize_a"]:
                yield "mxfp4", MX_GEMM, s
        for s in NVFP4_GEMM.shapes("representative"):
            if s.dims["M"] >= 1024 and (not quick or s.dims["N"] == 4096):
                yield "nvfp4", NVFP4_GEMM, s
    else:
        print(
            "mx_gemm, nvfp4_gemm: no sm_100 here (tl.dot_scaled is emulated); their ≥ 1.8x "
            "targets skipped"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    parser.add_argument("--floors", action="store_true", help="print the floors and exit")
    args = parser.parse_args()
    if args.floors or not torch.cuda.is_available():
        _print_floors(args)
        if not torch.cuda.is_available():
            print("bench_gemm: timings need a CUDA or ROCm device; nothing timed on this machine")
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
        if op is FP8_BLOCK_GEMM:
            sets = [op.inputs(shape, torch.bfloat16, "cuda", seed=i) for i in range(3)]
            for other, (fns, target) in _block_fp8_baselines(shape, sets).items():
                t_other = _time(fns, flush)
                print(
                    f"  {shape.label}: {other} {t_other * 1e6:.2f} us, kernelab "
                    f"{t_other / t_ours:.2f}x (target ≥ {target}x)"
                )
            del sets
        row = {
            "op": name,
            "shape": shape.label,
            "kernelab_us": round(t_ours * 1e6, 2),
            "cublas_bf16_us": round(t_base * 1e6, 2),
            "speedup": round(t_base / t_ours, 3),
            "tflops": round(cost.flops / t_ours / 1e12, 1),
            "hbm_pct": round(100 * cost.bytes / t_ours / bw, 1) if bw else None,
        }
        if op in BLOCK_SCALED_TARGETS:
            row["target"] = f"≥ {BLOCK_SCALED_TARGETS[op]}x bf16"
        print(json.dumps(row) if args.json else "  ".join(f"{k}={v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
