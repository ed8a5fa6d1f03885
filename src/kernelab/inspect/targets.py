"""The compile targets inspect knows: what Triton (GPUs) or Mosaic (TPUs) is told, and what
each chip has. A TPU target's chip facts are ``kernelab.hardware.tpu.TPU_LIMITS[name]``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str  # "sm_90" (key into occupancy.LIMITS), "tpu_v5e" (key into tpu.TPU_LIMITS)
    backend: str  # "cuda" | "hip" | "tpu"
    arch: int | str  # what triton.backends.compiler.GPUTarget takes; the TPU's generation
    warp_size: int
    #: Tensor-core instructions a dot should compile to here (PTX / AMDGCN mnemonics).
    tensor_cores: tuple[str, ...]
    tma: bool  # bulk tensor copies (cp.async.bulk.tensor) exist

    @property
    def is_tpu(self) -> bool:
        return self.backend == "tpu"

    def gpu_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


TARGETS: dict[str, Target] = {
    "sm_80": Target("sm_80", "cuda", 80, 32, ("mma",), False),
    "sm_90": Target("sm_90", "cuda", 90, 32, ("wgmma", "mma"), True),
    "sm_100": Target("sm_100", "cuda", 100, 32, ("tcgen05", "wgmma", "mma"), True),
    "gfx942": Target("gfx942", "hip", "gfx942", 64, ("mfma",), False),
    # TPUs: Pallas launches lowered to Mosaic (no warps; the MXU is not an instruction to find).
    "tpu_v5e": Target("tpu_v5e", "tpu", "v5e", 0, (), False),
    "tpu_v6e": Target("tpu_v6e", "tpu", "v6e", 0, (), False),
    "tpu7x": Target("tpu7x", "tpu", "7x", 0, (), False),
}
DEFAULT_TARGETS = tuple(TARGETS)
GPU_TARGETS = tuple(t for t in TARGETS if not TARGETS[t].is_tpu)
TPU_TARGETS = tuple(t for t in TARGETS if TARGETS[t].is_tpu)


def resolve_target(t: str | Target) -> Target:
    """``t`` as a :class:`Target` (a name such as ``"sm_90"``, or a Target as it is)."""
    if isinstance(t, Target):
        return t
    if t not in TARGETS:
        raise ValueError(f"target: expected one of {list(TARGETS)}, got {t!r}")
    return TARGETS[t]


def parse_targets(text: str | None) -> list[Target]:
    """``"sm_80,sm_90"`` → targets; None or empty → all of them (each launch goes only to its
    backend's targets). Unknown names are an error."""
    if not text:
        return [TARGETS[t] for t in DEFAULT_TARGETS]
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TARGETS]
    if bad or not names:
        raise ValueError(
            f"target: expected a comma-separated subset of {list(TARGETS)}, got {text!r}"
        )
    return [TARGETS[t] for t in dict.fromkeys(names)]
