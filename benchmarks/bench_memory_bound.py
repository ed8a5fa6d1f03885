"""The memory-bound ops at their representative shapes: the H200 floor of each, and, on a GPU,
the time of each variant against it.

    PYTHONPATH=src python benchmarks/bench_memory_bound.py [op ...] [--dtype bf16] [--samples 50]

Without a GPU it prints each shape's minimum bytes (the op's cost model) and its floor on an
H200 at the datasheet bandwidth (4.8 TB/s) and at the copy bandwidth measured once on an H200
(about 4.3 TB/s, HARDWARE.md). With a GPU it times every variant with device events, one call
per sample, L2 flushed between samples outside the timed window (cold cache), and prints the
median time, the achieved bandwidth and the share of the floor. One call per sample includes
the launch: at decode shapes that is the point (eager launches are what a server pays).
"""

from __future__ import annotations

import argparse
import functools
import platform

import torch
import triton
from _timing import MEASURED_COPY_H200, cold_median

import kernelab.ops as ops
from kernelab import __version__
from kernelab.hardware.devices import lookup
from kernelab.numerics import error
from kernelab.ops import as_tuple

MEMORY_BOUND = (
    "rmsnorm",
    "layernorm",
    "softmax",
    "rope",
    "silu_and_mul",
    "gelu_and_mul",
    "fp8_quant",
    "rmsnorm_fp8_quant",
)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", default=list(MEMORY_BOUND))
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    h200 = lookup("H200")
    gpu = torch.cuda.is_available()
    where = torch.cuda.get_device_name() if gpu else f"no GPU ({platform.processor() or 'cpu'})"
    print(
        f"kernelab {__version__}, torch {torch.__version__}, triton {triton.__version__}, "
        f"{where}, {args.dtype}"
    )
    flush = torch.empty(2 * h200.l2_bytes // 4, dtype=torch.float32, device="cuda") if gpu else None
    for name in args.ops:
        op = ops.get(name)
        for shape in op.shapes("representative"):
            inputs = op.inputs(shape, dtype, "cuda" if gpu else "meta", seed=0)
            cost = op.cost(inputs)
            floor_sheet = cost.bytes / h200.hbm_bytes_per_s
            floor_copy = cost.bytes / MEASURED_COPY_H200
            line = (
                f"{name:<18} {shape.label:<52} {cost.bytes / 1e6:9.3f} MB  H200 floor "
                f"{floor_sheet * 1e6:8.2f} us (sheet) {floor_copy * 1e6:8.2f} us (copy)"
            )
            if not gpu:
                print(line)
                continue
            base = as_tuple(op.variants["torch"](**{k: _clone(v) for k, v in inputs.items()}))
            for vname, variant in op.variants.items():
                ok, _ = variant.runs_on("cuda")
                if not ok:
                    continue
                got = as_tuple(variant(**{k: _clone(v) for k, v in inputs.items()}))
                agree = max(error(g, b).rel_l2 for g, b in zip(got, base, strict=True))
                t = cold_median(functools.partial(variant.fn, **inputs), args.samples, flush)
                line += (
                    f"\n    {vname:<10} {t * 1e6:9.2f} us  {cost.bytes / t / 1e9:8.1f} GB/s  "
                    f"{floor_copy / t:6.1%} of copy floor  (rel L2 vs torch {agree:.1e})"
                )
            print(line)


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


if __name__ == "__main__":
    main()
