"""End-to-end model timing: prefill latency and decode tokens per second, original vs patched.

On CUDA each is also measured with CUDA graphs (static KV cache + torch.compile
``reduce-overhead``). Timings use a host clock with a device synchronisation at both ends of
each measured region (whole steps, not microsecond kernels, so the sync cost is negligible).
With ``profile``, one decode step of each eager variant is also profiled and analysed by
``kernelab.trace`` (see :mod:`kernelab.workloads.profile`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from kernelab.bench.stats import StopRule, quantile, summarize
from kernelab.models import presets, state_of, unpatch

VARIANTS_CPU = ("original", "patched")
VARIANTS_CUDA = ("original", "patched", "original+graphs", "patched+graphs")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: Each measurement samples until the median's ~95% interval is within ±5% (at least
#: ``repeats`` samples, at most ``MAX_TIME_S`` of sampling, then reported as not converged).
REL_CI = 0.05
MAX_TIME_S = 10.0


def _timed(fn: Callable[[], object], device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _until(rule: StopRule, draw: Callable[[], float]) -> list[float]:
    """Samples of ``draw()`` until ``rule`` is met. The rule is asked at its minimum count,
    then each time the samples grow by a tenth (summarising sorts them all: asking after
    every one of thousands of millisecond samples would cost more than the samples), and
    whenever the time is up."""
    samples: list[float] = []
    t0 = time.perf_counter()
    check_at = rule.min_samples
    while True:
        samples.append(draw())
        elapsed = time.perf_counter() - t0
        if len(samples) >= check_at or elapsed >= rule.max_time:
            if rule.done(summarize(samples), elapsed):
                return samples
            check_at = min(len(samples) + max(1, len(samples) // 10), rule.max_samples)


def _sample(fn: Callable[[], object], device, rule: StopRule, warmup: int) -> list[float]:
    """Seconds of ``fn()`` per call, sampled until ``rule`` is met."""
    for _ in range(warmup):
        fn()
    return _until(rule, lambda: _timed(fn, device))


def _decode_samples(full, first, device, rule: StopRule) -> list[float]:
    """Decode seconds per pair: a generate of every token minus a generate of the first one,
    the two run back to back in each pair (so both see the machine in the same state)."""
    full()
    first()
    return _until(rule, lambda: max(_timed(full, device) - _timed(first, device), 1e-12))


def _spread(samples: list[float], rule: StopRule) -> dict:
    s = summarize(samples)
    return {"n": s.n, "q1_s": s.q1, "q3_s": s.q3, "rel_ci": s.rel_ci,
            "converged": rule.converged(s, float("inf"))}  # fmt: skip


@torch.no_grad()
def measure(
    model,
    device,
    prompt_tokens: int,
    decode_tokens: int,
    repeats: int,
    graphs: bool = False,
    max_time_s: float = MAX_TIME_S,
) -> dict:
    """Prefill latency and decode throughput of ``model`` (batch 1, greedy), each a median
    with its quartiles and whether the noise target was met."""
    rule = StopRule(rel_ci=REL_CI, min_samples=max(3, repeats), min_time=0.0,
                    max_time=max(max_time_s, 0.0))  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), generator=gen).to(device)
    forward = model.forward
    if graphs:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)
    try:
        prefill = _sample(lambda: model(input_ids=ids, use_cache=False), device, rule, 2)
        gen_kwargs = dict(
            max_new_tokens=decode_tokens,
            min_new_tokens=decode_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        if graphs:
            gen_kwargs["cache_implementation"] = "static"
        one = dict(gen_kwargs, max_new_tokens=1, min_new_tokens=1)
        decode = _decode_samples(
            lambda: model.generate(ids, **gen_kwargs), lambda: model.generate(ids, **one),
            device, rule,
        )  # fmt: skip
    finally:
        if graphs:
            model.forward = forward
    steps = decode_tokens - 1
    tok_s = sorted(steps / d for d in decode)
    d = _spread(decode, rule)
    decode_s = statistics.median(decode)
    return {
        "prefill_s": statistics.median(prefill),
        "prefill_samples": prefill,
        "prefill_spread": _spread(prefill, rule),
        "decode_tokens_per_s": steps / decode_s,
        "decode_step_s": decode_s / steps,
        "decode_samples": decode,
        "decode_spread": {
            **d,
            "tokens_per_s_q1": quantile(tok_s, 0.25),
            "tokens_per_s_q3": quantile(tok_s, 0.75),
        },
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
    max_time_s: float = MAX_TIME_S,
) -> list[dict]:
    """Measure every variant for ``preset`` on ``device``; one row per variant. ``repeats``:
    the fewest samples per measurement; each samples on until its median is known within
    ±5% or ``max_time_s`` of sampling is spent (``*_spread["converged"]`` says which).

    ``quantize`` patches the linear projections with that weight format too (the patched rows
    are then named ``patched-<format>``). ``profile`` adds ``decode_profile`` (a
    :func:`kernelab.workloads.profile.digest`) and ``decode_trace`` to the eager rows.
    """
    from kernelab.models import check_quantize, patch
    from kernelab.workloads import profile as _profile

    check_quantize(quantize)

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
            result = measure(model, dev, prompt_tokens, decode_tokens, repeats, graphs, max_time_s)
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
