"""The fused mixture-of-experts layer at its representative shapes: the H200 floor of each,
and, on a GPU, the time of kernelab's fused_moe (bf16/fp16), fused_moe_fp8 (block-scaled
e4m3 experts) and fused_moe_mxfp4 (mxfp4 experts, 16-bit activations) against the floor, eager
torch and vLLM's Triton fused MoE where installed.

    PYTHONPATH=src python benchmarks/bench_moe.py
        [--op fused_moe|fused_moe_fp8|fused_moe_mxfp4|all]
        [--dtype bf16] [--samples 30] [--only TEXT]

Without a GPU it prints, per shape (Mixtral 8x7B, Qwen3-30B-A3B, DeepSeek-V3 at 1, 16, 64 and
4096 tokens), the op's cost model with the routing the inputs draw: FLOPs of the routed pairs
only, bytes of the weights of the experts hit plus the activations, and the floor on an H200
at the datasheet bandwidth and bf16 peak and at the copy bandwidth measured once on an H200
(HARDWARE.md), with the larger of the memory and compute terms. With a GPU it times each
variant with device events, one call per sample, L2 flushed between samples outside the timed
window (cold cache), and prints the median, the share of the floor, and the targets with a
verdict: fused_moe >= 1.0x vLLM's fused_experts at 16 and 4096 tokens on the Mixtral and
Qwen3-MoE shapes; fused_moe_fp8 >= 1.0x vLLM's fused_experts(use_fp8_w8a8=True,
block_shape=[128, 128]) at 16 and 4096 tokens on the DeepSeek-V3 and Mixtral shapes (its
floors use the e4m3 peak and the bytes of e4m3 weights and float32 scales). fused_moe_mxfp4
(Mixtral, Qwen3-MoE and gpt-oss-120b-like shapes) has no external target here: its floors use
the activations' 16-bit peak (weight-only: the products run in bf16/fp16) and the bytes of the
packed e2m1 weights and ue8m0 scales; on a GPU it is timed against eager torch. The routing (ids
and weights) is computed once, outside the timed region, for every variant alike
(``check=False``: no host synchronisation).
"""

from __future__ import annotations

import argparse
import platform

import torch
import triton
from _timing import MEASURED_COPY_H200, time_variants

from kernelab import __version__
from kernelab.hardware.devices import lookup
from kernelab.ops import FUSED_MOE, FUSED_MOE_FP8, FUSED_MOE_MXFP4

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

#: op -> (shape label prefix, tokens) where it must be >= VLLM_RATIO x vLLM's Triton fused
#: MoE (fused_experts; with use_fp8_w8a8 and 128 x 128 blocks for fused_moe_fp8).
VLLM_TARGETS = {
    "fused_moe": tuple((m, t) for m in ("mixtral-8x7b", "qwen3-30b-a3b") for t in (16, 4096)),
    "fused_moe_fp8": tuple((m, t) for m in ("deepseek-v3", "mixtral-8x7b") for t in (16, 4096)),
    "fused_moe_mxfp4": (),
}
VLLM_RATIO = 1.0
OPS = {"fused_moe": FUSED_MOE, "fused_moe_fp8": FUSED_MOE_FP8, "fused_moe_mxfp4": FUSED_MOE_MXFP4}


def _cost(op, shape, dtype):
    """The cost with the routing the inputs draw (the experts hit), without the weights:
    meta tensors for everything but the ids."""
    inputs = op.inputs(shape, dtype, "meta")
    real = op.inputs(
        type(shape)(
            shape.label,
            {
                **shape.dims,
                # 32: the smallest size every MoE op takes (mxfp4's scale block)
                "hidden": 32,
                "intermediate": 32,
                **({"shared_intermediate": 32} if "shared_intermediate" in shape.dims else {}),
            },
            shape.params,
        ),
        dtype,
        "cpu",
        seed=0,
    )
    inputs["topk_ids"] = real["topk_ids"]
    return op.cost(inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=[*OPS, "all"], default="all")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--only", default="", help="shapes whose label contains this text")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    h200 = lookup("H200")
    gpu = torch.cuda.is_available()
    where = torch.cuda.get_device_name() if gpu else f"no GPU ({platform.processor() or 'cpu'})"
    print(
        f"kernelab {__version__}, torch {torch.__version__}, triton {triton.__version__}, "
        f"{where}, {args.dtype}; floors on an H200: {h200.hbm_bytes_per_s / 1e12:.1f} TB/s "
        f"(datasheet), {MEASURED_COPY_H200 / 1e12:.1f} TB/s (measured copy), "
        f"{h200.peak_for(DTYPE_NAMES[dtype]) / 1e12:.0f} TFLOP/s {args.dtype}, "
        f"{h200.peak_for('fp8') / 1e12:.0f} TFLOP/s fp8 (datasheet)"
    )
    names = list(OPS) if args.op == "all" else [args.op]
    for name in names:
        for model, tokens in VLLM_TARGETS[name]:
            print(f"target: {name} >= {VLLM_RATIO:.1f}x vLLM fused_experts ({model} T={tokens})")
    if not gpu:
        print("no GPU: floors only (timings and targets skipped)")
    flush = torch.empty(2 * h200.l2_bytes // 4, dtype=torch.float32, device="cuda") if gpu else None
    for name in names:
        op = OPS[name]
        peak = h200.peak_for("fp8" if name == "fused_moe_fp8" else DTYPE_NAMES[dtype])
        print(f"-- {name}")
        achieved = {}
        for shape in op.shapes("representative"):
            if args.only not in shape.label:
                continue
            cost = _cost(op, shape, dtype)
            t_mem, t_copy = cost.bytes / h200.hbm_bytes_per_s, cost.bytes / MEASURED_COPY_H200
            t_flop = cost.flops / peak
            bound = "compute" if t_flop > t_copy else "memory"
            print(
                f"{shape.label:<52} {cost.bytes / 1e6:9.1f} MB {cost.flops / 1e9:9.1f} GFLOP  "
                f"floor {max(t_mem, t_flop) * 1e6:9.2f} us (sheet) "
                f"{max(t_copy, t_flop) * 1e6:9.2f} us (copy), {bound}-bound"
            )
            if not gpu:
                continue
            inputs = op.inputs(shape, dtype, "cuda", seed=0)
            inputs["check"] = False
            for variant, t, agree in time_variants(op, inputs, args.samples, flush):
                achieved[(shape.label, variant)] = t
                print(
                    f"    {variant:<9} {t * 1e6:10.2f} us  {cost.flops / t / 1e12:7.1f} TFLOP/s  "
                    f"{max(t_copy, t_flop) / t:6.1%} of floor  (rel L2 vs torch {agree:.1e})"
                )
        if gpu:
            _verdicts(name, achieved)


def _verdicts(name: str, achieved: dict) -> None:
    for model, tokens in VLLM_TARGETS[name]:
        label = next(
            (lab for lab, _ in achieved if lab.startswith(f"{model} ") and f" T={tokens} " in lab),
            None,
        )
        ours, theirs = achieved.get((label, "kernelab")), achieved.get((label, "vllm"))
        if ours and theirs:
            ratio = theirs / ours
            print(
                f"{name} vs vLLM at {model} T={tokens}: {ratio:.2f}x (target {VLLM_RATIO:.1f}x): "
                f"{'met' if ratio >= VLLM_RATIO else 'NOT met'}"
            )
        else:
            print(
                f"{name} vs vLLM at {model} T={tokens}: not measured (vllm not installed or "
                "skipped)"
            )


if __name__ == "__main__":
    main()
