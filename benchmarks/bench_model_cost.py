"""model-cost's decode step of a model, op by op: the floor of each op on an H200 and, on a GPU,
the measured time of kernelab's kernel at that shape against it.

    PYTHONPATH=src python benchmarks/bench_model_cost.py [--preset llama3-8b] [--batch 1,64]
        [--context 8192] [--recipe bf16] [--samples 20]

Without a GPU it prints the prediction (per op: bytes, FLOPs, floor on the H200 datasheet,
bound) and says that timing is skipped. With a GPU, each op of the step with a kernelab kernel
is timed with device events, one call per sample, L2 flushed before each sample outside the
timed window, on inputs the op itself makes for that shape; measured / floor is printed per op
and for the step (the sum over ops, each counted once per layer).
"""

from __future__ import annotations

import argparse
import platform

import torch
import triton
from _timing import cold_median

from kernelab import __version__
from kernelab.core.op import get
from kernelab.hardware.devices import lookup
from kernelab.workloads import model_cost as mc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--batch", default="1,64")
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--recipe", default="bf16", choices=mc.RECIPES)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    h200 = lookup("H200")
    gpu = torch.cuda.is_available()
    where = torch.cuda.get_device_name() if gpu else f"no GPU ({platform.processor() or 'cpu'})"
    print(
        f"kernelab {__version__}, torch {torch.__version__}, triton {triton.__version__}, "
        f"{where}; floors: H200 datasheet ({h200.hbm_bytes_per_s / 1e12:.1f} TB/s, "
        f"{h200.peak_for('bf16') / 1e12:.0f} TFLOP/s bf16)"
    )
    if not gpu:
        print("no GPU: timings skipped, the prediction only")
    flush = torch.empty(2 * h200.l2_bytes // 4, dtype=torch.float32, device="cuda") if gpu else None
    for batch in (int(b) for b in args.batch.split(",")):
        work = mc.Workload(batch=batch, context=args.context, recipe=args.recipe)
        step = mc.cost(args.preset, h200, work).decode
        print(f"\n{args.preset} decode, batch {batch}, context {args.context}, {args.recipe}")
        measured_total, floor_total = 0.0, 0.0
        for o in step.ops:
            line = (
                f"  {o.name:<11} {o.op or '(no op)':<17} {o.bytes / 1e6:10.3f} MB "
                f"{o.flops / 1e9:9.3f} GFLOP  floor {o.floor_s * 1e6:9.2f} us  {o.bound:<7}"
            )
            if not gpu or not o.op or o.shape is None:
                print(line + ("  (not timed: no kernelab op)" if gpu else ""))
                continue
            op = get(o.op)
            inputs = op.inputs(o.shape, mc.ACT_DTYPE, "cuda", seed=0)
            if "check" in inputs:
                inputs["check"] = False  # a serving loop's setting: no host synchronisation
            variant = op.variants["kernelab"]
            kw = variant.prepare(dict(inputs)) if variant.prepare else inputs  # not timed
            t = cold_median(lambda fn=variant.fn, kw=kw: fn(**kw), args.samples, flush)
            measured_total += o.calls * t
            floor_total += o.calls * o.floor_s
            print(line + f"  measured {t * 1e6:9.2f} us  {t / o.floor_s:5.2f}x floor")
            del inputs, kw
        print(f"  step floor {step.floor_s * 1e3:.3f} ms (all ops)")
        if gpu and floor_total:
            print(
                f"  timed ops: {measured_total * 1e3:.3f} ms measured vs {floor_total * 1e3:.3f} "
                f"ms floor ({measured_total / floor_total:.2f}x)"
            )


if __name__ == "__main__":
    main()
