"""Theoretical occupancy, computed as NVIDIA's occupancy calculator and AMD's rules do.

Formulas and limits: HARDWARE.md ("Occupancy limits"). Kineto's ``est. achieved occupancy %``
assumes the 48 KB default shared-memory limit and reads 0 for any kernel using more; this
module uses the real per-architecture carveouts instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ArchLimits:
    arch: str
    warp_size: int
    max_threads_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    max_registers_per_thread: int
    register_alloc_unit: int  # per warp, in registers
    shared_per_sm: int  # bytes (the maximum carveout)
    shared_per_block: int  # bytes, opt-in maximum
    reserved_shared_per_block: int
    shared_alloc_unit: int
    carveouts_kb: tuple[int, ...] = ()


KB = 1024
LIMITS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits(
        "sm_80",
        32,
        2048,
        64,
        32,
        65536,
        255,
        256,
        164 * KB,
        163 * KB,
        KB,
        128,
        (0, 8, 16, 32, 64, 100, 132, 164),
    ),
    "sm_90": ArchLimits(
        "sm_90",
        32,
        2048,
        64,
        32,
        65536,
        255,
        256,
        228 * KB,
        227 * KB,
        KB,
        128,
        (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    ),
    "sm_100": ArchLimits(
        "sm_100",
        32,
        2048,
        64,
        32,
        65536,
        255,
        256,
        228 * KB,
        227 * KB,
        KB,
        128,
        (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    ),
    # gfx942 (MI300): 4 SIMDs x 8 waves x 64 lanes; 512 VGPRs per lane per SIMD; 64 KB LDS/CU.
    "gfx942": ArchLimits("gfx942", 64, 2048, 32, 16, 512, 512, 8, 64 * KB, 64 * KB, 0, 1),
}


@dataclass(frozen=True)
class Occupancy:
    arch: str
    blocks_per_sm: int
    warps_per_block: int
    occupancy: float  # active warps / max warps, 0..1
    limiter: str  # "warps" | "registers" | "shared" | "blocks" | "none (cannot launch)"
    limits: dict[str, int]  # blocks per SM allowed by each resource

    def as_dict(self) -> dict:
        return {
            "arch": self.arch,
            "blocks_per_sm": self.blocks_per_sm,
            "warps_per_block": self.warps_per_block,
            "occupancy": round(self.occupancy, 4),
            "limiter": self.limiter,
            "limits": dict(self.limits),
        }


def _roundup(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(
    arch: str,
    threads_per_block: int,
    registers_per_thread: int,
    shared_bytes: int = 0,
    carveout_kb: int | None = None,
) -> Occupancy:
    """Blocks per SM/CU and theoretical occupancy for one kernel launch configuration.

    ``carveout_kb`` is a preferred shared-memory carveout (NVIDIA); it is rounded up to the next
    supported size. By default the SM's maximum is used, as the driver does for kernels that
    opt into large shared memory.
    """
    if arch not in LIMITS:
        raise ValueError(f"arch: expected one of {sorted(LIMITS)}, got {arch!r}")
    for argname, value in (
        ("threads_per_block", threads_per_block),
        ("registers_per_thread", registers_per_thread),
        ("shared_bytes", shared_bytes),
    ):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{argname}: expected a non-negative int, got {value!r}")
    if threads_per_block == 0:
        raise ValueError("threads_per_block: expected at least 1 thread, got 0")
    lim = LIMITS[arch]
    if arch.startswith("gfx"):
        return _amd_occupancy(lim, threads_per_block, registers_per_thread, shared_bytes)

    warps = math.ceil(threads_per_block / lim.warp_size)
    limits: dict[str, int] = {"blocks": lim.max_blocks_per_sm}
    limits["warps"] = lim.max_warps_per_sm // warps if threads_per_block <= 1024 else 0
    if registers_per_thread > lim.max_registers_per_thread:
        limits["registers"] = 0
    elif registers_per_thread == 0:
        limits["registers"] = lim.max_blocks_per_sm
    else:
        regs_per_warp = _roundup(registers_per_thread * lim.warp_size, lim.register_alloc_unit)
        warps_per_partition = (lim.registers_per_sm // 4) // regs_per_warp
        limits["registers"] = (warps_per_partition * 4) // warps
    carveout = lim.shared_per_sm
    if carveout_kb is not None:
        fitting = [c for c in lim.carveouts_kb if c >= carveout_kb]
        if not fitting:
            raise ValueError(
                f"carveout_kb: at most {lim.carveouts_kb[-1]} on {arch}, got {carveout_kb}"
            )
        carveout = fitting[0] * KB
    if shared_bytes > lim.shared_per_block:
        limits["shared"] = 0
    else:
        per_block = _roundup(shared_bytes + lim.reserved_shared_per_block, lim.shared_alloc_unit)
        limits["shared"] = carveout // per_block
    return _finish(arch, warps, lim, limits)


def _amd_occupancy(lim: ArchLimits, threads: int, vgprs: int, lds: int) -> Occupancy:
    waves = math.ceil(threads / lim.warp_size)
    limits: dict[str, int] = {"blocks": lim.max_blocks_per_sm}
    limits["warps"] = lim.max_warps_per_sm // waves if threads <= 1024 else 0
    if vgprs > lim.max_registers_per_thread:
        limits["registers"] = 0
    else:
        waves_per_simd = min(512 // max(_roundup(max(vgprs, 1), 8), 8), 8)
        limits["registers"] = (waves_per_simd * 4) // waves
    limits["shared"] = (lim.shared_per_sm // lds) if lds else lim.max_blocks_per_sm
    if lds > lim.shared_per_block:
        limits["shared"] = 0
    return _finish(lim.arch, waves, lim, limits)


def _finish(arch: str, warps: int, lim: ArchLimits, limits: dict[str, int]) -> Occupancy:
    blocks = min(limits.values())
    if blocks == 0:
        limiter = "none (cannot launch): " + ", ".join(k for k, v in limits.items() if v == 0)
    else:
        # Ties go to the resource a kernel author can most easily change, in this order.
        order = ("shared", "registers", "warps", "blocks")
        limiter = next(k for k in order if limits[k] == blocks)
    occ = blocks * warps / lim.max_warps_per_sm
    return Occupancy(arch, blocks, warps, min(occ, 1.0), limiter, limits)
