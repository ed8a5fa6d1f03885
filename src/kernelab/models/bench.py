"""End-to-end model timing: prefill latency and decode tokens per second, original vs patched.

On CUDA each is also measured with CUDA graphs (static KV cache + torch.compile
``reduce-overhead``). Timings use a host clock with a device synchronisation at both ends of
each measured region (whole steps, not microsecond kernels, so the sync cost is negligible).
With ``profile``, one decode step of each eager variant is also profiled and analysed by
``kernelab.trace`` (see :mod:`kernelab.models.profile`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from kernelab.models import presets
from kernelab.models._patch import state_of, unpatch

VARIANTS_CPU = ("original", "patched")
VARIANTS_CUDA = ("original", "patched", "original+graphs", "patched+graphs")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Callable[[], object], device, repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append(time.perf_counter() - t0)
    return samples


@torch.no_grad()
def measure(
    model, device, prompt_tokens: int, decode_tokens: int, repeats: int, graphs: bool = False
) -> dict:
    """Prefill latency and decode throughput of ``model`` (batch 1, greedy)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), generator=gen).to(device)
    forward = model.forward
    if graphs:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)
    try:
        prefill = _median_time(lambda: model(input_ids=ids, use_cache=False), device, repeats, 2)
        gen_kwargs = dict(
            max_new_tokens=decode_tokens,
            min_new_tokens=decode_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        if graphs:
            gen_kwargs["cache_implementation"] = "static"
        one = dict(gen_kwargs, max_new_tokens=1, min_new_tokens=1)
        full = _median_time(lambda: model.generate(ids, **gen_kwargs), device, repeats, 1)
        first = _median_time(lambda: model.generate(ids, **one), device, repeats, 1)
    finally:
        if graphs:
            model.forward = forward
    decode_s = max(statistics.median(full) - statistics.median(first), 1e-12)
    return {
        "prefill_s": statistics.median(prefill),
        "prefill_samples": prefill,
        "decode_tokens_per_s": (decode_tokens - 1) / decode_s,
        "generate_samples": full,
    }


def run(
    preset: str,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    prompt_tokens: int = 32,
    decode_tokens: int = 16,
    repeats: int = 3,
    progress: Callable[[str], None] | None = None,
    quantize: str | None = None,
    profile: bool = False,
    profile_dir: str | None = None,
) -> list[dict]:
    """Measure every variant for ``preset`` on ``device``; one row per variant.

    ``quantize`` patches the linear projections with that weight format too (the patched rows
    are then named ``patched-<format>``). ``profile`` adds ``decode_profile`` (a
    :func:`kernelab.models.profile.digest`) and ``decode_trace`` to the eager rows.
    """
    from kernelab.models import _linear, patch
    from kernelab.models import profile as _profile

    _linear.check_quantize(quantize)

    dev = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = presets.build(preset, dtype=dtype, device=dev)
    variants = VARIANTS_CUDA if dev.type == "cuda" else VARIANTS_CPU
    rows = []
    for variant in variants:
        if progress:
            progress(f"{preset} {variant}")
        patched = variant.startswith("patched")
        if patched and quantize is not None:
            variant = variant.replace("patched", f"patched-{quantize}")
        extra = {}
        if patched:
            patch(model, quantize=quantize)
            linears = state_of(model).linears
            if linears:
                extra["linear_weight_bytes"] = sum(p.nbytes() for _, _, p in linears)
        try:
            graphs = variant.endswith("+graphs")
            result = measure(model, dev, prompt_tokens, decode_tokens, repeats, graphs=graphs)
            if profile and not graphs:
                if progress:
                    progress(f"{preset} {variant}: profiling a decode step")
                folder = None if profile_dir is None else f"{profile_dir}/{variant}"
                summary = _profile.profile_decode(model, dev, prompt_tokens, out=folder)
                extra["decode_profile"] = _profile.digest(summary)
                extra["decode_trace"] = summary["trace"]
        finally:
            if patched:
                unpatch(model)
        rows.append(
            {
                "preset": preset,
                "variant": variant,
                "quantize": quantize if patched else None,
                "device": str(dev),
                "dtype": str(dtype).removeprefix("torch."),
                "prompt_tokens": prompt_tokens,
                "decode_tokens": decode_tokens,
                **result,
                **extra,
            }
        )
    base = rows[0]
    for row in rows:
        row["prefill_speedup"] = base["prefill_s"] / row["prefill_s"]
        row["decode_speedup"] = row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    return rows
