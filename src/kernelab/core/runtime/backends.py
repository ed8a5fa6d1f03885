"""Backends: how a variant runs, and how static analysis compiles its launches.

An op says *what* it computes; a backend says *how it runs*. Every :class:`Variant` names one
(``Variant.kind``), and the instruments ask the backend, never the kind string:

- ``runs_on(device_type)``: whether a variant of this backend can run on a device, and a note;
- ``timed_on(device_type)``: whether bench may time it there (an interpreter cannot be timed);
- ``targets``: the names static analysis can compile for (empty: nothing to compile);
- ``compile(launch, target)``: compile one launch for a target without the device, returning
  text artifacts and small numbers (picklable) that ``kernelab.inspect`` reads;
- ``version()``: the compiler's version, part of inspect's cache key;
- ``requires`` (optional): the packages whose presence ``runs_on`` depends on, so that a
  listing made without them (``kernelab ops``'s catalogue) knows when to ask again.

Adding a backend is one adapter registered with :func:`register_backend` (a duplicate name is
an error): its variants then pass through verify and bench unchanged, and inspect compiles its
launches (``Launch.backend`` names the adapter) once it has a reader for the artifacts.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import warnings
from typing import Any, Protocol, runtime_checkable

from kernelab.core.runtime import registry


@runtime_checkable
class Backend(Protocol):
    name: str
    #: Names of the compile targets static analysis knows for this backend.
    targets: tuple[str, ...]

    def runs_on(self, device_type: str) -> tuple[bool, str]: ...

    def timed_on(self, device_type: str) -> tuple[bool, str]: ...

    def compile(self, launch: Any, target: Any) -> dict: ...

    def version(self) -> str: ...

    # Optional: ``interpreted`` (bool), whether on CPU tensors an interpreter runs its kernels
    # (verify caps the sizes it gives them; a full-size rerun is for the others).
    # Optional: ``tuned`` (bool), whether the op's tuning space configures this backend's
    # variant (it takes ``config=``): the autotuner's and the sweep's variant.
    # Optional: ``by_default(device_type) -> (bool, why)``, whether verify, bench and sweep
    # take this backend's variants when no variant is named (False, with the line they print,
    # for a backend that is slow to start there). An adapter without it is always taken.


#: Why an interpreted variant is never timed (bench reports it with this text).
INTERPRETED = "Triton interpreter on CPU: correctness only, timing it would be meaningless"


class _Eager:
    """Host-framework code (eager torch, torch.compile): runs and is timed anywhere.
    ``cpu_start``: why it is not taken unasked on a CPU (None: it is)."""

    targets: tuple[str, ...] = ()

    def __init__(self, name: str, cpu_start: str | None = None):
        self.name = name
        self.cpu_start = cpu_start

    def by_default(self, device_type: str) -> tuple[bool, str]:
        if device_type == "cpu" and self.cpu_start:
            return False, self.cpu_start
        return True, ""

    def runs_on(self, device_type: str) -> tuple[bool, str]:
        return True, ""

    def timed_on(self, device_type: str) -> tuple[bool, str]:
        return True, ""

    def compile(self, launch: Any, target: Any) -> dict:
        raise NotImplementedError(f"{self.name}: nothing to compile statically")

    def version(self) -> str:
        import torch

        return torch.__version__


class _External(_Eager):
    """A third-party package's kernels: GPUs only (they do not run on CPU tensors)."""

    def runs_on(self, device_type: str) -> tuple[bool, str]:
        if device_type == "cpu":
            return False, "needs a GPU"
        return True, ""


class Triton:
    """Triton kernels: native on CUDA/ROCm, Triton's interpreter on CPU tensors (correctness
    only), compiled for sm_80/sm_90/sm_100/gfx942 on a machine without a GPU."""

    name = "triton"
    targets = ("sm_80", "sm_90", "sm_100", "gfx942")
    tuned = True
    interpreted = True

    def runs_on(self, device_type: str) -> tuple[bool, str]:
        if device_type == "cpu":
            return True, "interpreter: correctness only"
        return True, ""

    def timed_on(self, device_type: str) -> tuple[bool, str]:
        if device_type == "cpu":
            return False, INTERPRETED
        return True, ""

    def version(self) -> str:
        import triton

        return triton.__version__

    def compile(self, launch: Any, target: Any) -> dict:
        """Compile ``launch`` (an ops ``Launch`` or an inspect ``Spec``: kernel, signature,
        constexprs, divisible_16, equal_1, num_warps, num_stages) for ``target`` (an inspect
        ``Target``: name, backend "cuda"/"hip", ``gpu_target()``) through Triton's whole
        pipeline on the CPU; return the texts and metadata inspect parses.

        Raises whatever Triton raises when the kernel does not compile (the caller records it).
        """
        import triton
        from triton.compiler import ASTSource

        kern = jit_of(launch.kernel)
        sig, consts, attrs = triton_signature(launch)
        src = ASTSource(kern, sig, consts, attrs)
        options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = triton.compile(src, target=target.gpu_target(), options=options)
        asm = compiled.asm
        md = compiled.metadata
        art = {
            "target": target.name,
            "kernel": kern.fn.__name__,
            "triton": triton.__version__,
            "num_warps": int(getattr(md, "num_warps", launch.num_warps)),
            "num_stages": int(getattr(md, "num_stages", launch.num_stages)),
            "shared": int(getattr(md, "shared", 0) or 0),
            "tmem": int(getattr(md, "tmem_size", 0) or 0),
            "ttir": asm.get("ttir", ""),
            "ttgir": asm.get("ttgir", ""),
        }
        if target.backend == "cuda":
            art["ptx"] = asm.get("ptx", "")
            cubin = asm.get("cubin")
            art["res_usage"], art["sass"] = _cuobjdump(cubin) if cubin else ("", "")
        else:
            art["amdgcn"] = asm.get("amdgcn", "")
        return art


def jit_of(obj) -> Any:
    """The Triton JITFunction behind ``obj`` (itself, or an autotuner/heuristics wrapper)."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn") and seen < 8:
        obj, seen = obj.fn, seen + 1
    if not isinstance(obj, JITFunction):
        raise TypeError(
            "kernel: expected a @triton.jit function (or kernelab @kernel), "
            f"got {type(obj).__name__}"
        )
    return obj


def triton_signature(launch: Any) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) as ``triton.compiler.ASTSource`` takes them.

    Arguments Triton would specialise as equal to 1 become constexpr 1 (as the JIT does);
    16-divisible ones get the ``tt.divisibility`` attribute (same format in triton 3.6-3.9).
    """
    names = list(jit_of(launch.kernel).arg_names)
    sig = dict(launch.signature)
    consts = dict(launch.constexprs)
    for n in launch.equal_1:
        sig[n] = "constexpr"
        consts[n] = 1
    attrs = {
        (names.index(n),): [["tt.divisibility", 16]]
        for n in launch.divisible_16
        if n not in launch.equal_1 and n in names
    }
    return sig, consts, attrs


def _cuobjdump(cubin: bytes) -> tuple[str, str]:
    """``cuobjdump -res-usage`` and ``-sass`` of a cubin ('' when the tool is unavailable)."""
    try:
        from triton import knobs

        tool = knobs.nvidia.cuobjdump.path
    except Exception:  # older layouts: the tool is not found, the PTX still is parsed
        return "", ""
    if not tool or not os.path.exists(tool):
        return "", ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = []
        for flag in ("-res-usage", "-sass"):
            try:
                r = subprocess.run(
                    [tool, flag, f.name], capture_output=True, text=True, timeout=60, check=False
                )
                out.append(r.stdout if r.returncode == 0 else "")
            except (OSError, subprocess.TimeoutExpired):
                out.append("")
    return out[0], out[1]


class Pallas:
    """Pallas TPU kernels (jax, an extra): native on a TPU, the TPU interpreter on CPU tensors
    (correctness only: races, bounds, uninitialised memory), lowered for TPU generations on a
    machine without one. Its launches are ``kernelab.core.runtime.pallas.PallasCall`` s."""

    name = "pallas"
    targets = ("tpu_v5e", "tpu_v6e", "tpu7x")
    interpreted = True
    #: The packages whose presence ``runs_on`` depends on (``pallas.available`` looks for them).
    requires = ("jax", "jaxlib")

    def runs_on(self, device_type: str) -> tuple[bool, str]:
        from kernelab.core.runtime import pallas

        ok, why = pallas.available()
        if not ok:
            return False, why
        if device_type == "cpu":
            return True, "TPU interpreter: correctness only"
        return False, "Pallas TPU kernels run on TPUs, or on CPU tensors through the interpreter"

    def timed_on(self, device_type: str) -> tuple[bool, str]:
        from kernelab.core.runtime import pallas

        if device_type == "cpu":
            return False, pallas.INTERPRETED_TPU
        return True, ""

    def by_default(self, device_type: str) -> tuple[bool, str]:
        if device_type == "cpu":
            return False, "the TPU interpreter compiles each shape for seconds on CPU"
        return True, ""

    def version(self) -> str:
        import jax

        return jax.__version__

    def compile(self, launch: Any, target: Any) -> dict:
        """Lower ``launch`` (a ``PallasCall``) for the TPU generation ``target`` names, under
        an abstract device of that kind; the Mosaic text of each kernel, its backend config
        and operand types (``kernelab.core.runtime.mosaic``)."""
        from kernelab.core.runtime import mosaic

        return mosaic.compile_call(launch, target)


# --- the registry -------------------------------------------------------------------------

_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Add ``backend``; a second backend with the same name is an error."""
    if not isinstance(backend, Backend):
        raise TypeError(f"backend: expected a Backend adapter, got {type(backend).__name__}")
    return registry.add(_BACKENDS, backend.name, backend, "a backend")


def get_backend(name: str) -> Backend:
    return registry.lookup(_BACKENDS, name, "kind", "a backend, ")


def backends() -> list[Backend]:
    return list(_BACKENDS.values())


register_backend(Triton())
register_backend(_Eager("torch"))
register_backend(_Eager("compile", "torch.compile builds C++ on CPU (slow, ~20 s to start)"))
register_backend(_External("external"))
register_backend(Pallas())
