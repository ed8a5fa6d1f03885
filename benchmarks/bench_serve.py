"""Continuous batching on transformers' serving loop: its paged attention against kernelab's.

    python benchmarks/bench_serve.py [--preset llama3-8b] [--contexts 2048 8192 32768] [--json]

Targets (GPU, bf16, random weights with the preset's real dimensions; 64 concurrent requests,
prompts of the given context, 256 output tokens, greedy):
- kernelab's output tokens/s ≥ 1.3× transformers' best available paged path (sdpa here: its
  paged path gathers each sequence's K/V out of the cache every step) at a 2k context,
- and the ratio growing with the context (2k, 8k, 32k): the gather grows with it.

Each point is :func:`kernelab.workloads.serve_bench.run` (both runs in one process, the baseline
first, each after an untimed warm-up of two requests), tokens compared between the runs. The
machine and versions print with the numbers. On CPU it runs the tiny preset once, through
kernelab's torch variants, says that the GPU targets were skipped, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch
import triton


def _versions() -> dict:
    import transformers

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {
        "machine": f"{platform.machine()} {platform.node()}",
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from kernelab.workloads import serve_bench as serve

    gpu = torch.cuda.is_available()
    if not gpu:
        print("bench_serve: no CUDA/ROCm device: the GPU targets are skipped; one tiny CPU run")
        points = [("tiny-llama", "cpu", 8, [48], 8, 16)]
    else:
        points = [(args.preset, "cuda", args.requests, args.contexts, args.output_len,
                   args.page_size)]  # fmt: skip
    rows = []
    for preset, device, n, contexts, out_len, page in points:
        for ctx in contexts:
            # every request the same context and output length: the target's workload
            lengths = [(ctx, out_len)] * n
            r = serve.run(preset, device, requests=n, lengths=lengths, page_size=page,
                          max_batch_tokens=max(2048, n), progress=print)  # fmt: skip
            base, mine = r["runs"]
            rows.append({
                "preset": preset, "context": ctx, "requests": n, "output_len": out_len,
                "baseline": base["attention"],
                "baseline_tokens_per_s": base["output_tokens_per_s"],
                "kernelab_tokens_per_s": mine["output_tokens_per_s"],
                "ratio": mine["speedup"], "tokens_identical": r["tokens_identical"],
                "attention_share": [base.get("attention_share"), mine.get("attention_share")],
                "target": 1.3 if (gpu and ctx == 2048) else None,
            })  # fmt: skip
    report = {"versions": _versions(), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(report["versions"])
    for row in rows:
        target = f" (target ≥ {row['target']})" if row["target"] else ""
        print(f"{row['preset']} ctx {row['context']}: {row['baseline']} "
              f"{row['baseline_tokens_per_s']:.1f} tok/s, kernelab "
              f"{row['kernelab_tokens_per_s']:.1f} tok/s, ×{row['ratio']:.2f}{target}; "
              f"tokens identical: {row['tokens_identical']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
