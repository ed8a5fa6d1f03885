"""Compile a :class:`Spec` for a target with Triton, on a machine without a GPU.

``triton.compile`` with a ``GPUTarget`` and an ``ASTSource`` runs the whole pipeline for any
target on a CPU: Triton IR, PTX and a cubin (through the ptxas bundled in Triton's wheel) for
NVIDIA, AMDGCN and an HSA code object for AMD. Resource usage of a cubin is read with the
bundled ``cuobjdump``. :func:`compile_artifacts` returns only text (and small numbers), so the
result pickles across processes and parses into a report without Triton.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import warnings

from kernelab.inspect.spec import Spec
from kernelab.inspect.targets import Target


def triton_version() -> str:
    import triton

    return triton.__version__


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


def compile_artifacts(spec: Spec, target: Target) -> dict:
    """Compile ``spec`` for ``target``; return the texts and metadata inspect parses.

    Raises whatever Triton raises when the kernel does not compile (the caller records it).
    """
    import triton
    from triton.compiler import ASTSource

    sig, consts, attrs = spec.triton_signature()
    src = ASTSource(spec.kernel, sig, consts, attrs)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = triton.compile(src, target=target.gpu_target(), options=options)
    asm = compiled.asm
    md = compiled.metadata
    art = {
        "target": target.name,
        "kernel": spec.name,
        "triton": triton.__version__,
        "num_warps": int(getattr(md, "num_warps", spec.num_warps)),
        "num_stages": int(getattr(md, "num_stages", spec.num_stages)),
        "shared": int(getattr(md, "shared", 0) or 0),
        "tmem": int(getattr(md, "tmem_size", 0) or 0),
        "ttir": asm.get("ttir", ""),
        "ttgir": asm.get("ttgir", ""),
    }
    if target.backend == "cuda":
        art["ptx"] = asm.get("ptx", "")
        art["res_usage"], art["sass"] = _cuobjdump(asm["cubin"]) if "cubin" in asm else ("", "")
    else:
        art["amdgcn"] = asm.get("amdgcn", "")
    return art
