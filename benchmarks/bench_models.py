"""End-to-end decode speed of a patched Hugging Face model against the original.

    python benchmarks/bench_models.py [--preset llama3-8b] [--decode-tokens 64] [--json]

Targets (batch 1, bf16, random weights with the preset's real dimensions):
- patched with CUDA graphs (static cache + torch.compile reduce-overhead) ≥ 1.3× the original
  eager decode tokens/s, and ≥ 1.0× the original with CUDA graphs;
- w4a16-patched with CUDA graphs ≥ 2× the original eager decode tokens/s.

Each variant is measured by :func:`kernelab.workloads.model_bench.run` (median of ``--repeats``
generate calls; decode rate from a full generate minus a one-token generate). The machine and
versions print with the numbers. Needs a CUDA or ROCm device; on CPU it says so and exits.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch
import triton


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_models: needs a CUDA or ROCm device (none found); nothing measured")
        return 0
    import transformers

    from kernelab.workloads import model_bench as bench

    rows = bench.run(args.preset, "cuda", torch.bfloat16, args.prompt_tokens,
                     args.decode_tokens, args.repeats)  # fmt: skip
    q_rows = bench.run(args.preset, "cuda", torch.bfloat16, args.prompt_tokens,
                       args.decode_tokens, args.repeats, quantize="w4a16")  # fmt: skip
    by = {r["variant"]: r for r in rows}
    by.update({r["variant"]: r for r in q_rows if r["variant"].startswith("patched")})
    eager = by["original"]["decode_tokens_per_s"]
    graphs = by["original+graphs"]["decode_tokens_per_s"]
    checks = [
        ("patched+graphs / original eager", by["patched+graphs"]["decode_tokens_per_s"] / eager,
         1.3),
        ("patched+graphs / original+graphs", by["patched+graphs"]["decode_tokens_per_s"] / graphs,
         1.0),
        ("patched-w4a16+graphs / original eager",
         by["patched-w4a16+graphs"]["decode_tokens_per_s"] / eager, 2.0),
    ]  # fmt: skip
    machine = {
        "gpu": torch.cuda.get_device_name(),
        "host": platform.node(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "preset": args.preset,
        "prompt_tokens": args.prompt_tokens,
        "decode_tokens": args.decode_tokens,
    }
    if args.json:
        print(json.dumps({"machine": machine, "rows": list(by.values()), "checks": checks}))
        return 0
    print(" ".join(f"{k}={v}" for k, v in machine.items()))
    for name, r in by.items():
        print(f"{name:24s} prefill {r['prefill_s'] * 1e3:8.2f} ms  "
              f"decode {r['decode_tokens_per_s']:8.1f} tok/s")  # fmt: skip
    for name, ratio, target in checks:
        verdict = "meets" if ratio >= target else "MISSES"
        print(f"{name:40s} {ratio:5.2f}x  (target ≥ {target}x: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
