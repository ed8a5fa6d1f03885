"""attention_prefill at its representative shapes: the H200 floor of each, and, on a GPU, the
kernel's time against it and against torch SDPA's flash backend, cuDNN and FlashAttention.

    PYTHONPATH=src python benchmarks/bench_attention_prefill.py [--samples 30] [--all]

Without a GPU it prints each shape's FLOPs (visible scores only, 4·D each), minimum bytes and
floor on an H200 from the datasheet (989 TFLOP/s bf16 dense, 4.8 TB/s) and from the 8192³
bf16 matmul rate measured once on an H200 (about 780 TFLOP/s, HARDWARE.md), and exits 0.

With a GPU it times the headline case, prefill causal 1 × 4096 tokens, Llama-3 8B heads
(32 q / 8 kv, D 128), bf16: kernelab against SDPA's flash backend (target ≥ 1.0×) and against
cuDNN (SDPA's cuDNN backend) and FlashAttention-3 (``flash_attn_interface``) or -2
(``flash_attn``) where installed (target ≥ 70%); with ``--all``, every representative shape
for kernelab alone against its floor. Each time is the median over samples of one call timed
with CUDA events, L2 flushed before each sample outside the events; every output is compared
with SDPA's (relative L2) before timing. The machine and versions print first.
"""

from __future__ import annotations

import argparse
import platform

import torch
import torch.nn.functional as F
import triton
from _timing import cold_median

from kernelab import __version__
from kernelab.hardware.devices import lookup
from kernelab.numerics import error
from kernelab.ops import ATTENTION_PREFILL
from kernelab.ops.attention.attention_prefill import attention_prefill_triton

MEASURED_MATMUL_H200 = 780e12  # bf16 FLOP/s, 8192³ on random data, HARDWARE.md (one run)
HEADLINE = "llama3-8b prefill 1x4096"
TARGETS = {"sdpa-flash": 1.0, "cudnn": 0.7, "flash-attn-3": 0.7, "flash-attn-2": 0.7}


def _floors(op, shape, dtype, device):
    inputs = op.inputs(shape, dtype, device, seed=0)
    cost = op.cost(inputs)
    h200 = lookup("H200")
    sheet = max(cost.flops / h200.peak_for("bf16"), cost.bytes / h200.hbm_bytes_per_s)
    measured = max(cost.flops / MEASURED_MATMUL_H200, cost.bytes / h200.hbm_bytes_per_s)
    bound = cost.bound(h200.peak_for("bf16"), h200.hbm_bytes_per_s)
    return inputs, cost, sheet, measured, bound


def _baselines(inputs) -> dict:
    """Zero-argument callables of the installed baselines for a single causal sequence (their
    own layouts made outside the timed call)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    group = q.shape[1] // k.shape[1]
    qt = q.transpose(0, 1)[None]
    # K/V heads repeated once, outside the timed call (not every backend takes GQA).
    kt = k.transpose(0, 1).repeat_interleave(group, 0)[None]
    vt = v.transpose(0, 1).repeat_interleave(group, 0)[None]
    out = {}
    for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("cudnn", None)):
        backend = backend or getattr(SDPBackend, "CUDNN_ATTENTION", None)
        if backend is None:
            continue

        def call(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)[0].transpose(0, 1)

        try:
            call()
        except RuntimeError as exc:
            print(f"  {name}: not available here ({str(exc).splitlines()[0][:80]})")
            continue
        out[name] = call
    cu_q, cu_k, n = inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], q.shape[0]
    for name, module in (("flash-attn-3", "flash_attn_interface"), ("flash-attn-2", "flash_attn")):
        try:
            fa = __import__(module)
        except ImportError:
            continue

        def call(fa=fa):
            r = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, n, n, causal=True)
            return r[0] if isinstance(r, tuple) else r

        out[name] = call
        break  # FA3 when present, else FA2
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--all", action="store_true", help="time every representative shape")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    where = torch.cuda.get_device_name() if gpu else f"no GPU ({platform.processor() or 'cpu'})"
    print(
        f"kernelab {__version__}, torch {torch.__version__}, triton {triton.__version__}, "
        f"{where}, bf16; floors on an H200: datasheet 989 TFLOP/s / 4.8 TB/s, and the measured "
        f"matmul rate {MEASURED_MATMUL_H200 / 1e12:.0f} TFLOP/s"
    )
    op, dtype = ATTENTION_PREFILL, torch.bfloat16
    for shape in op.shapes("representative"):
        _, cost, sheet, measured, bound = _floors(op, shape, dtype, "meta")
        print(
            f"{shape.label:<66} {cost.flops / 1e12:7.2f} TFLOP {cost.bytes / 1e6:8.1f} MB  "
            f"floor {sheet * 1e6:8.1f} us (sheet) {measured * 1e6:8.1f} us (measured), {bound}"
        )
    if not gpu:
        print("no GPU: floors only (targets: ≥ 1.0x SDPA flash, ≥ 70% of FA3 or cuDNN)")
        return 0
    flush = torch.empty(2 * lookup("H200").l2_bytes // 4, dtype=torch.float32, device="cuda")
    shapes = [s for s in op.shapes("representative") if args.all or s.label == HEADLINE]
    for shape in shapes:
        inputs, cost, sheet, _, _ = _floors(op, shape, dtype, "cuda")
        inputs = {**inputs, "return_lse": False, "check": False}
        mine = lambda inputs=inputs: attention_prefill_triton(**inputs)  # noqa: E731
        t = cold_median(mine, args.samples, flush, warmup=3)
        print(
            f"\n{shape.label}: kernelab {t * 1e6:9.1f} us  {cost.flops / t / 1e12:6.1f} TFLOP/s  "
            f"{sheet / t:6.1%} of the datasheet floor"
        )
        if shape.label != HEADLINE:
            continue
        base = _baselines(inputs)
        ref = base["sdpa-flash"]() if "sdpa-flash" in base else None
        if ref is not None:
            print(f"  kernelab vs sdpa-flash output: rel L2 {error(mine(), ref).rel_l2:.1e}")
        for name, fn in base.items():
            agree = f"rel L2 {error(fn(), ref).rel_l2:.1e}" if ref is not None else ""
            tb = cold_median(fn, args.samples, flush, warmup=3)
            ratio = tb / t
            verdict = "meets" if ratio >= TARGETS[name] else "misses"
            print(
                f"  {name:<13} {tb * 1e6:9.1f} us  kernelab at {ratio:5.2f}x its speed "
                f"(target ≥ {TARGETS[name]:.1f}x: {verdict})  {agree}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
