"""Run a Python callable or script under the PyTorch profiler (shapes recorded), with warm-up
and a chosen number of steps, and write the Kineto trace for :func:`summarize`.

``target`` is ``module:function`` or ``path/to/file.py:function`` (the function is called
with no arguments once per step), or ``path/to/script.py`` (the script is run once per step,
as ``__main__``). The target is user code and is executed: that is its purpose.
"""

from __future__ import annotations

import os
import re
import runpy
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from kernelab._loader import load_callable


def quiet_profiler() -> None:
    """Keep the profiler's own log lines (``USDT: ... profiler_start``, ``STAGE: ...``) off
    stderr, where they land between a command's own lines: Kineto prints at or above
    ``KINETO_LOG_LEVEL``, read when the profiler first starts (6, above its highest level,
    prints nothing; errors still surface as Python exceptions). A level the user set is kept."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def resolve(target: str) -> tuple[Callable[[], object], str]:
    """The zero-argument callable for one step, and a label."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"target: expected 'module:function' or a script path, got {target!r}")
    if ":" in target and not target.endswith(".py"):
        fn = load_callable(target, "target")
        return fn, target
    path = Path(target).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"target: no such script {str(path)!r}")
    if path.suffix != ".py":
        raise ValueError(f"target: expected a .py script or 'module:function', got {target!r}")
    return (lambda: runpy.run_path(str(path), run_name="__main__")), str(path)


def default_out(label: str) -> Path:
    """Where a trace goes when no ``out`` is given: ``<cache dir>/profiles/``, named by the
    target and the time (never the working directory, which the user did not name)."""
    from kernelab import _flags

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(label.replace(":", "-")).name).strip("._")
    folder = _flags.cache_dir() / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"{stem or 'profile'}-{when}.json.gz"
    n = 1
    while path.exists():  # two in one second
        n += 1
        path = folder / f"{stem or 'profile'}-{when}-{n}.json.gz"
    return path


def profile(
    target: str,
    *,
    steps: int = 5,
    warmup: int = 2,
    out: str | Path | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    memory: bool = True,
) -> Path:
    """Profile ``target`` and return the path of the written trace (.json or .json.gz).
    ``memory``: record allocations (``profile_memory=True``: ``[memory]`` events)."""
    import torch
    from torch.profiler import ProfilerActivity, schedule
    from torch.profiler import profile as torch_profile

    quiet_profiler()

    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive int, got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: expected a non-negative int, got {warmup!r}")
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device: expected 'auto', 'cpu' or 'cuda', got {device!r}")
    use_gpu = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_gpu and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but no CUDA or ROCm device is available")
    step, label = resolve(target)
    out_path = Path(out) if out else default_out(label)
    if not out_path.name.endswith((".json", ".json.gz")):
        raise ValueError(f"out: expected a .json or .json.gz path, got {str(out_path)!r}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_gpu else [])
    written: list[Path] = []

    def export(prof) -> None:
        tmp = out_path.with_name(out_path.name.removesuffix(".gz"))
        prof.export_chrome_trace(str(tmp))
        if out_path.name.endswith(".gz"):
            import gzip

            out_path.write_bytes(gzip.compress(tmp.read_bytes()))
            tmp.unlink()
        written.append(out_path)

    total = warmup + steps
    with warnings.catch_warnings():
        # With warmup=0 the profiler warns that it skips warm-up: that was asked for.
        warnings.filterwarnings("ignore", message=".*won't be using warmup.*")
        prof_ctx = torch_profile(
            activities=activities,
            record_shapes=True,
            profile_memory=bool(memory),
            schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
            on_trace_ready=export,
        )
    with prof_ctx as prof:
        for i in range(total):
            step()
            if use_gpu:
                torch.cuda.synchronize()
            prof.step()
            if progress is not None:
                progress(i + 1, total)
    if not written:
        raise ValueError(f"target: profiling {label!r} produced no trace")
    return written[0]
