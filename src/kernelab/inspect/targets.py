"""The compile targets inspect knows: what Triton is told, and what each chip has."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str  # "sm_90", also the key into kernelab.hardware.occupancy.LIMITS
    backend: str  # "cuda" | "hip"
    arch: int | str  # what triton.backends.compiler.GPUTarget takes
    warp_size: int
    #: Tensor-core instructions a dot should compile to here (PTX / AMDGCN mnemonics).
    tensor_cores: tuple[str, ...]
    tma: bool  # bulk tensor copies (cp.async.bulk.tensor) exist

    def gpu_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


TARGETS: dict[str, Target] = {
    "sm_80": Target("sm_80", "cuda", 80, 32, ("mma",), False),
    "sm_90": Target("sm_90", "cuda", 90, 32, ("wgmma", "mma"), True),
    "sm_100": Target("sm_100", "cuda", 100, 32, ("tcgen05", "wgmma", "mma"), True),
    "gfx942": Target("gfx942", "hip", "gfx942", 64, ("mfma",), False),
}
DEFAULT_TARGETS = tuple(TARGETS)


def parse_targets(text: str | None) -> list[Target]:
    """``"sm_80,sm_90"`` → targets; None or empty → all four. Unknown names are an error."""
    if not text:
        return [TARGETS[t] for t in DEFAULT_TARGETS]
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if bad or not names:
        raise ValueError(
            f"target: expected a comma-separated subset of {list(TARGETS)}, got {text!r}"
        )
    return [TARGETS[t] for t in dict.fromkeys(names)]
