"""TPU facts static analysis needs: VMEM per TensorCore, the vector register's tile, the
device kind JAX names each chip by, and the per-grid-step overhead of a Pallas pipeline.

Chip-level peaks (HBM, FLOP/s) are rows of :data:`kernelab.hardware.devices.DEVICES`. The
figures here are not on Google Cloud's TPU pages; each says where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20

#: A vector register holds 8 sublanes × 128 lanes of 32-bit words; narrower types pack along
#: the sublanes (2 bf16 or 4 int8 per word), so a native tile is (8 × 32 / bits) × 128.
#: Source: jax 0.10.2, ``jax/_src/pallas/mosaic/tpu_info.py`` (NUM_SUBLANES = 8,
#: NUM_LANES = 128 for every generation).
SUBLANES = 8
LANES = 128

#: Fixed cost of one grid step of a Pallas TPU pipeline, in seconds: about 0.35 µs, the figure
#: the JAX documentation's Pallas TPU pipelining guide gives (docs.jax.dev, "Pallas TPU
#: pipelining"). A step whose blocks move in less time than this is dominated by it.
STEP_OVERHEAD_S = 0.35e-6
STEP_OVERHEAD_SOURCE = "about 0.35 µs per grid step (JAX docs, Pallas TPU pipelining guide)"


def native_tile(bits: int) -> tuple[int, int]:
    """(sublane rows, lanes) of one vector register for an element of ``bits`` bits."""
    if bits not in (4, 8, 16, 32):
        return (SUBLANES, LANES)
    return (SUBLANES * 32 // bits, LANES)


@dataclass(frozen=True)
class TpuLimits:
    name: str  # the inspect target: "tpu_v5e"
    device_kind: str  # how JAX names the chip (``jax.Device.device_kind``)
    generation: int
    tensor_cores: int  # per chip
    #: Whether the chip's TensorCores form one device ("megacore") whose "parallel" grid axes
    #: are split across them.
    megacore: bool
    vmem_bytes: int  # per TensorCore
    source: str


# VMEM capacity and megacore support: jax 0.10.2, jax/_src/pallas/mosaic/tpu_info.py
# (vmem_capacity_bytes and ChipVersion.supports_megacore); TensorCores per chip: Google
# Cloud's TPU pages (see the DEVICES rows).
_SRC = "jax 0.10.2 jax/_src/pallas/mosaic/tpu_info.py (VMEM per TensorCore, megacore)"
TPU_LIMITS: dict[str, TpuLimits] = {
    "tpu_v5e": TpuLimits("tpu_v5e", "TPU v5 lite", 5, 1, False, 128 * MIB, _SRC),
    "tpu_v6e": TpuLimits("tpu_v6e", "TPU v6 lite", 6, 1, False, 128 * MIB, _SRC),
    "tpu_v5p": TpuLimits("tpu_v5p", "TPU v5", 5, 2, True, 64 * MIB, _SRC),
    "tpu7x": TpuLimits("tpu7x", "TPU7x", 7, 2, False, 64 * MIB, _SRC),
}
