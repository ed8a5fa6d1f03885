"""One decode step under the PyTorch profiler, analysed by ``kernelab.trace``.

The model first reads a prompt (building its KV cache); then each profiled step feeds one
token with that cache, as ``generate`` does. The Kineto trace goes through
:func:`kernelab.trace.summarize`; :func:`digest` keeps what answers "where did a decode step's
time go, and how much of it was launch overhead": the top ops by self time, the framework
overhead (host time outside any op) and, on GPUs, kernel time, idle time and launch latency.
"""

from __future__ import annotations

import inspect
import tempfile
from pathlib import Path

import torch


def _cache_kwarg(model) -> str:
    """transformers ≥ 5.2x calls the KV cache ``cache``; earlier versions ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


@torch.no_grad()
def profile_decode(
    model,
    device,
    prompt_tokens: int = 16,
    steps: int = 3,
    warmup: int = 1,
    out: str | Path | None = None,
    top: int = 10,
) -> dict:
    """Profile ``steps`` decode steps (after ``warmup``) of ``model``; return the public
    summary from ``kernelab.trace`` with the trace's path under ``"trace"``."""
    from torch.profiler import ProfilerActivity, schedule
    from torch.profiler import profile as torch_profile

    from kernelab.trace.profile import quiet_profiler

    quiet_profiler()

    from kernelab.trace import public, summarize

    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive int, got {steps!r}")
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_tokens), generator=gen).to(dev)
    first = model(input_ids=ids, use_cache=True)
    cache = _cache_of(first)
    token = first.logits[:, -1:].argmax(-1)
    kwarg = _cache_kwarg(model)
    gpu = dev.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="kernelab-decode-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "decode-step.json"
    with torch_profile(
        activities=activities,
        record_shapes=True,
        schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(warmup + steps):
            step = model(input_ids=token, use_cache=True, **{kwarg: cache})
            cache = _cache_of(step) or cache
            token = step.logits[:, -1:].argmax(-1)
            if gpu:
                torch.cuda.synchronize(dev)
            prof.step()
    summary = public(summarize(str(path), top=top))
    summary["trace"] = str(path)
    return summary


def digest(summary: dict, top: int = 5) -> dict:
    """The decode-step answer from a ``profile_decode`` summary (JSON-ready, flat numbers)."""
    cpu = summary.get("cpu") or {}
    steps = cpu.get("steps") or 1
    out = {
        "steps": cpu.get("steps"),
        "step_us": round(cpu["window_us"] / steps, 3) if cpu.get("window_us") else None,
        "framework_overhead_share": cpu.get("overhead_share"),
        "top_cpu_ops": [
            {k: o[k] for k in ("name", "count", "self_us", "self_share")}
            for o in (cpu.get("ops") or [])[:top]
        ],
    }
    gpu = summary.get("gpu")
    if gpu:
        launch = gpu.get("launch") or {}
        out["gpu"] = {
            "breakdown": gpu.get("breakdown"),
            "idle": {k: v for k, v in (gpu.get("idle") or {}).items() if not k.startswith("_")},
            "kernels": launch.get("kernels"),
            "launch_latency_us_total": (launch.get("latency_us") or {}).get("total"),
            "launch_latency_us_p50": (launch.get("latency_us") or {}).get("p50"),
            "short_kernel_share": launch.get("short_share"),
            "top_kernels": (gpu.get("top_kernels") or [])[:top],
        }
    out["verdicts"] = [v.get("finding") for v in summary.get("verdicts") or []]
    return out
