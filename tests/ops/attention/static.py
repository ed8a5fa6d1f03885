"""Static checks of the attention family's launches for sm_80, sm_90, sm_100 and gfx942 (no GPU
needed), read from what ``kernelab inspect`` sees — the inspect gate's own facts — plus the
compiled code where a pattern matters (which loads are wide)."""

from __future__ import annotations

from triton.backends.compiler import GPUTarget

from kernelab.inspect import analyze

TARGETS = {
    "sm_90": GPUTarget("cuda", 90, 32),
    "sm_80": GPUTarget("cuda", 80, 32),
    "gfx942": GPUTarget("hip", "gfx942", 64),
}


def facts(launch, arch: str) -> dict:
    """inspect's facts of ``launch`` on ``arch``: registers, spill bytes and instructions,
    load and store widths, tensor-core instruction counts (cached by kernel source)."""
    report = analyze(launch, arch)
    assert report.facts, f"{launch.name} did not compile for {arch}: {report.error}"
    return report.facts


def assert_static(launch, arch: str, tensor_cores: bool = False) -> dict:
    """No spills (bytes, or instructions: AMD spills scalar registers into vector lanes),
    128-bit global loads, and (when asked) tensor-core instructions; returns the facts."""
    f = facts(launch, arch)
    assert f["spill_bytes"] == 0 and f["spill_instructions"] == 0, f"spills on {arch}: {f}"
    assert "128" in f["loads"], f"no 128-bit global loads on {arch}: {f['loads']}"
    if tensor_cores:
        assert f["tensor_cores"], f"no tensor-core instructions on {arch}"
    return f
