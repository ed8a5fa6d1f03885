"""Static checks of the attention family's compiled launches for sm_90, sm_80 and gfx942 (no GPU
needed): tensor-core instructions, spills, the width of global loads."""

from __future__ import annotations

import re
import subprocess

from triton.backends.compiler import GPUTarget

TARGETS = {
    "sm_90": GPUTarget("cuda", 90, 32),
    "sm_80": GPUTarget("cuda", 80, 32),
    "gfx942": GPUTarget("hip", "gfx942", 64),
}
#: Tensor-core instructions: wgmma needs 64-row tiles per warpgroup; smaller M runs mma.sync.
TENSOR_CORES = {
    "sm_90": r"wgmma\.mma_async|mma\.sync\.aligned",
    "sm_80": r"mma\.sync\.aligned",
    "gfx942": r"v_mfma_",
}
#: 128-bit global loads.
WIDE_LOADS = {
    "sm_90": r"ld\.global(?:\.[A-Za-z0-9_:]+)*\.v4\.(?:b|u|f)32",
    "sm_80": r"ld\.global(?:\.[A-Za-z0-9_:]+)*\.v4\.(?:b|u|f)32",
    "gfx942": r"(?:global|buffer)_load_dwordx4",
}


def code(compiled, arch: str) -> str:
    return compiled.asm["amdgcn"] if arch.startswith("gfx") else compiled.asm["ptx"]


def spills(compiled, arch: str, tmp_path) -> int:
    """Bytes spilled: from ptxas -v on NVIDIA, from the code object's metadata on AMD."""
    if arch.startswith("gfx"):
        counts = re.findall(r"\.[sv]gpr_spill_count:\s*(\d+)", compiled.asm["amdgcn"])
        assert counts, "no spill counts in the AMD code object metadata"
        return sum(int(c) for c in counts)
    from triton.backends.nvidia.compiler import get_ptxas

    ptx = tmp_path / "k.ptx"
    ptx.write_text(compiled.asm["ptx"])
    sm = "sm_90a" if arch == "sm_90" else arch
    proc = subprocess.run(
        [get_ptxas(int(arch[3:])).path, "-v", f"--gpu-name={sm}", str(ptx), "-o", "/dev/null"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert found, f"no spill report from ptxas: {proc.stderr[:300]}"
    return sum(int(a) + int(b) for a, b in found)


def assert_static(compiled, arch: str, tmp_path, tensor_cores: bool = False) -> str:
    """No spills, 128-bit global loads, and (when asked) tensor-core instructions; returns the
    target's code."""
    text = code(compiled, arch)
    assert spills(compiled, arch, tmp_path) == 0, f"spills on {arch}"
    assert re.search(WIDE_LOADS[arch], text), f"no 128-bit global loads on {arch}"
    if tensor_cores:
        assert re.search(TENSOR_CORES[arch], text), f"no tensor-core instructions on {arch}"
    return text
