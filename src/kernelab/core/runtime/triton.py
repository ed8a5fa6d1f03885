"""Where Triton kernels run: natively on CUDA/ROCm, through Triton's interpreter on CPU.

``@kernel`` replaces ``@triton.jit``. The object it returns *is* a ``triton.JITFunction``, so
the compiler, ``triton.compile`` and ``kernelab inspect`` treat it as any Triton kernel; in
addition, a launch whose tensor arguments live on the CPU executes through the interpreter
(``interpreter.py``: the launch, and the table of fixes to Triton's interpreter it installs),
and helper functions marked ``@kernel`` are interpreted when called from an interpreted kernel.
This replaces the process-wide ``TRITON_INTERPRET=1`` switch, which must be set before import
and then forbids compiling the same kernel for a GPU target in the same process.
"""

from __future__ import annotations

import torch
from triton.runtime.jit import JITFunction

from kernelab import _flags
from kernelab.core.runtime import interpreter


class Kernel(JITFunction):
    """A Triton JIT function that also runs on CPU tensors through the interpreter, with the
    fixes of ``interpreter.FIXES`` (resolved at the first CPU launch, never at import)."""

    def run(self, *args, grid, warmup, **kwargs):
        if not warmup and interpreter.all_on_cpu(args, kwargs):
            return interpreter.launch(self, grid, args, kwargs)
        return super().run(*args, grid=grid, warmup=warmup, **kwargs)

    def __call__(self, *args, **kwargs):
        # Reached only by the interpreter: compiled kernels inline helpers at code generation.
        return interpreter.call_device_function(self, args, kwargs)


def kernel(fn=None, **options):
    """Decorator: ``@kernel`` or ``@kernel(do_not_specialize=[...])``, as ``@triton.jit``.

    The result *is* a ``triton.JITFunction`` (compiled natively for GPU tensors, inspectable by
    ``triton.compile`` and ``kernelab inspect``); launched with all its tensors on the CPU, it
    runs through Triton's interpreter with kernelab's fixes, in any process, with no
    TRITON_INTERPRET. Published as ``kernelab.kernel``.
    """
    if fn is None:
        return lambda f: Kernel(f, **options)
    return Kernel(fn, **options)


def use_triton(t: torch.Tensor) -> bool:
    """Whether a public op should run its Triton kernel for a tensor on ``t``'s device.

    CUDA and ROCm (both ``cuda`` in torch): yes. CPU: only when KERNELAB_INTERPRET=1, which runs
    the kernel through Triton's interpreter; otherwise the torch implementation serves.
    """
    if t.device.type == "cuda":
        return True
    return t.device.type == "cpu" and _flags.interpret()


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def num_sms(device: torch.device | None) -> int:
    """Multiprocessors of ``device``; for CPU (interpreter) an H100/H200-sized guess of 132."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def arch_of(device) -> str | None:
    """ "sm_90", "gfx942"... for a GPU device; a string is taken as already an arch; else None
    (CPU, meta: a configuration that compiles within every target's limits)."""
    if isinstance(device, str) and device.startswith(("sm_", "gfx")):
        return device
    if device is None or (isinstance(device, str) and not device.startswith("cuda")):
        return None
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    gcn = getattr(props, "gcnArchName", "")
    return gcn.split(":")[0] if gcn else f"sm_{props.major}{props.minor}"


def sm_version(arch: str | None) -> int:
    """90 for "sm_90" (and "sm_90a"); 0 for AMD or unknown."""
    if arch and arch.startswith("sm_"):
        digits = "".join(ch for ch in arch[3:] if ch.isdigit())
        return int(digits) if digits else 0
    return 0
