"""Paged attention at its representative shapes: the H200 floor of each, and, on a GPU, the
time of kernelab's paged decode against the floor, eager torch and FlashInfer where installed.

    PYTHONPATH=src python benchmarks/bench_attention.py [--dtype bf16] [--samples 30] [--only TEXT]

Without a GPU it prints, per shape, the minimum bytes and FLOPs of the op's cost model (q and
out once, the keys and values a query sees once; only unmasked scores counted) and the floor
on an H200 at the datasheet bandwidth (4.8 TB/s) and at the copy bandwidth measured once on an
H200 (about 4.3 TB/s, HARDWARE.md), with the larger of the memory and compute terms. With a
GPU it times each variant with device events, one call per sample, L2 flushed between samples
outside the timed window (cold cache), and prints the median, the achieved bandwidth on the
op's bytes and the share of the measured-copy floor, and the paged-decode targets with a
verdict. FlashInfer's decode is planned once per shape outside the timed region (its
``plan`` is host work a server does once per step), so only its ``run`` is timed.
"""

from __future__ import annotations

import argparse
import platform

import torch
import triton
from _timing import MEASURED_COPY_H200, time_variants

from kernelab import __version__
from kernelab.hardware.devices import lookup
from kernelab.ops import PAGED_ATTENTION
from kernelab.ops.attention import _paged

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

#: The paged-decode targets: (shape label, what, share of the measured copy bandwidth on the KV
#: bytes).
TARGETS = (
    ("llama3-8b decode b64 ctx8192 bs16", "paged decode, batch 64, 8k, Llama-3-8B heads", 0.90),
    ("llama3-8b decode b1 ctx131072 bs16", "split-KV decode, batch 1, 128k", 0.80),
)
FLASHINFER_TARGET = ("llama3-8b decode b64 ctx8192 bs16", 1.0)  # ≥ 1.0× FlashInfer


def _cost(shape, dtype):
    """The op's cost for ``shape`` without allocating its cache: meta tensors for q and the
    caches, the real lengths for the metadata the cost reads."""
    inputs = PAGED_ATTENTION.inputs(shape, dtype, "meta")
    q_lens, kv_lens = _paged.lengths(shape)
    inputs["seq_lens"] = torch.tensor(kv_lens, dtype=torch.int32)
    inputs["cu_seqlens_q"] = _paged.cumulative(q_lens, "cpu")
    return PAGED_ATTENTION.cost(inputs)


def _flashinfer(inputs: dict):
    """A zero-argument FlashInfer decode of ``inputs`` (planned here, once), or None where it
    does not apply (not installed, several queries per sequence, sinks)."""
    try:
        import flashinfer
    except ImportError:
        return None
    q, k_cache, seq_lens = inputs["q"], inputs["k_cache"], inputs["seq_lens"]
    if q.shape[0] != seq_lens.shape[0] or inputs.get("sinks") is not None:
        return None
    block_size, heads_kv, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    pages = (seq_lens + block_size - 1) // block_size
    indptr = torch.zeros(len(pages) + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = pages.cumsum(0)
    table = inputs["block_tables"]
    used = torch.arange(table.shape[1], device=q.device)[None, :] < pages[:, None]
    indices = table[used].to(torch.int32)
    last = ((seq_lens - 1) % block_size + 1).to(torch.int32)
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    window_left = inputs.get("window_left", -1)
    wrapper.plan(
        indptr, indices, last, q.shape[1], heads_kv, head_dim, block_size,
        window_left=window_left,
        logits_soft_cap=inputs.get("softcap") or 0.0,
        sm_scale=inputs["softmax_scale"], q_data_type=q.dtype, kv_data_type=k_cache.dtype,
    )  # fmt: skip
    kv = (k_cache, inputs["v_cache"])
    scales = {}
    if inputs.get("k_scale") is not None:
        scales = {"k_scale": inputs["k_scale"].item(), "v_scale": inputs["v_scale"].item()}
    return lambda: wrapper.run(q, kv, **scales)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        f"{h200.peak_for(DTYPE_NAMES[dtype]) / 1e12:.0f} TFLOP/s"
    )
    for label, what, share in TARGETS:
        print(f"target: {what} ({label}) >= {share:.0%} of measured bandwidth on the KV bytes")
    print(
        f"target: paged decode >= {FLASHINFER_TARGET[1]:.1f}x FlashInfer ({FLASHINFER_TARGET[0]})"
    )
    flush = torch.empty(2 * h200.l2_bytes // 4, dtype=torch.float32, device="cuda") if gpu else None
    achieved = {}
    for shape in PAGED_ATTENTION.shapes("representative"):
        if args.only not in shape.label:
            continue
        cost = _cost(shape, dtype)
        t_mem, t_copy = cost.bytes / h200.hbm_bytes_per_s, cost.bytes / MEASURED_COPY_H200
        t_flop = cost.flops / h200.peak_for(DTYPE_NAMES[dtype])
        bound = "compute" if t_flop > t_copy else "memory"
        print(
            f"{shape.label:<62} {cost.bytes / 1e6:10.2f} MB {cost.flops / 1e9:9.2f} GFLOP  floor "
            f"{max(t_mem, t_flop) * 1e6:8.2f} us (sheet) {max(t_copy, t_flop) * 1e6:8.2f} us "
            f"(copy), {bound}-bound"
        )
        if not gpu:
            continue
        inputs = PAGED_ATTENTION.inputs(shape, dtype, "cuda", seed=0)
        inputs["check"] = False  # the serving loop's setting: no host synchronisation
        inputs["num_splits"] = None  # the split count this device's SM count gives
        fi = _flashinfer(inputs)
        extra = {"flashinfer": fi} if fi is not None else {}
        for name, t, agree in time_variants(PAGED_ATTENTION, inputs, args.samples, flush, extra):
            achieved[(shape.label, name)] = t
            print(
                f"    {name:<11} {t * 1e6:9.2f} us  {cost.bytes / t / 1e12:6.2f} TB/s  "
                f"{max(t_copy, t_flop) / t:6.1%} of copy floor  (rel L2 vs torch {agree:.1e})"
            )
    if gpu:
        _verdicts(achieved, dtype)


def _verdicts(achieved: dict, dtype) -> None:
    for label, what, share in TARGETS:
        t = achieved.get((label, "kernelab"))
        if t is None:
            continue
        shape = next(s for s in PAGED_ATTENTION.shapes("representative") if s.label == label)
        got = _cost(shape, dtype).bytes / t / MEASURED_COPY_H200
        print(f"{what}: {got:.1%} of measured bandwidth (target {share:.0%}): "
              f"{'met' if got >= share else 'NOT met'}")  # fmt: skip
    label, ratio = FLASHINFER_TARGET
    ours, theirs = achieved.get((label, "kernelab")), achieved.get((label, "flashinfer"))
    if ours and theirs:
        print(f"vs FlashInfer at {label}: {theirs / ours:.2f}x (target {ratio:.1f}x): "
              f"{'met' if theirs / ours >= ratio else 'NOT met'}")  # fmt: skip
    else:
        print("vs FlashInfer: not measured (flashinfer not installed)")


if __name__ == "__main__":
    main()
