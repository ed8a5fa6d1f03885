"""Findings: what a kernel engineer should look at in one compiled kernel, and what to change.

Each rule reads the parsed facts (:mod:`kernelab.inspect.parse`), the occupancy, and, when the
kernel has memory accesses narrower than 128 bits and arguments Triton did not specialise as
16-divisible, the facts of the same kernel compiled with every argument 16-divisible: that
counterfactual tells whether alignment is what stood in the way of vector loads.

Rules (severity):
- spills (warn): local memory or spill instructions in the compiled code;
- shared-limit / cannot-launch (error): more shared memory (LDS) or registers than the target
  allows per block, so this config cannot launch there;
- occupancy (info): below 50% and limited by registers or shared memory, with the register
  count or shared-memory size at which one more block fits;
- no-tensor-cores (warn): a ``tl.dot`` without mma / wgmma / tcgen05 / MFMA instructions;
- dot-scaled (info): how a ``tl.dot_scaled`` compiled: native (Blackwell's block-scaled
  tcgen05 MMA) or emulated (operands scaled and upcast, then an ordinary MMA), naming the
  instructions found;
- offset-32bit (warn when the op's tensors reach 2^31 elements, info when sizes are unknown):
  pointers offset by 32-bit values scaled from the program id;
- vectorisation: accesses narrower than 128 bits that 16-divisible arguments would widen
  (warn, naming the arguments), or that stay narrow even then (info: stride or too few
  contiguous elements per thread).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kernelab.hardware.occupancy import LIMITS, Occupancy, occupancy
from kernelab.inspect.targets import Target

#: Widest global access Triton emits per thread (ld.global.v4.b32, global_load_dwordx4).
VECTOR_BITS = 128
INT32_ELEMENTS = 2**31


@dataclass(frozen=True)
class Finding:
    kind: str  # spills | shared-limit | cannot-launch | occupancy | no-tensor-cores | ...
    severity: str  # "error" (cannot launch) | "warn" | "info"
    message: str
    suggestion: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def narrow_accesses(facts: dict) -> int:
    """Global loads and stores narrower than 128 bits, less the kernel's scalar loads."""
    narrow = sum(n for w, n in facts["loads"].items() if int(w) < VECTOR_BITS)
    narrow += sum(n for w, n in facts["stores"].items() if int(w) < VECTOR_BITS)
    return max(0, narrow - facts.get("scalar_loads", 0))


def widths(facts: dict) -> str:
    keys = sorted({int(w) for w in (*facts["loads"], *facts["stores"])})
    return "/".join(str(k) for k in keys) + "-bit" if keys else "no global access"


def occupancy_of(facts: dict, target: Target) -> Occupancy | None:
    if facts.get("registers") is None:
        return None
    threads = facts["num_warps"] * target.warp_size
    return occupancy(target.name, threads, int(facts["registers"]), int(facts["shared_bytes"]))


def _lift_registers(target: Target, threads: int, regs: int, shared: int, blocks: int):
    """Largest register count per thread at which one more block fits (None if none does)."""
    for r in range(regs - 1, 0, -1):
        if occupancy(target.name, threads, r, shared).limits["registers"] > blocks:
            return r
    return None


def _lift_shared(target: Target, threads: int, regs: int, shared: int, blocks: int):
    lim = LIMITS[target.name]
    need = lim.shared_per_sm // (blocks + 1) - lim.reserved_shared_per_block
    need -= need % max(lim.shared_alloc_unit, 1)
    return need if need > 0 else None


def findings(
    facts: dict,
    target: Target,
    occ: Occupancy | None,
    missing_alignment: list[str],
    aligned: dict | None = None,
    max_elements: int | None = None,
) -> list[Finding]:
    out: list[Finding] = []
    lim = LIMITS[target.name]
    spill = facts.get("spill_bytes") or 0
    if spill or facts.get("spill_instructions"):
        out.append(
            Finding(
                "spills",
                "warn",
                f"spills: {spill} bytes of local memory per thread "
                f"({facts.get('spill_instructions', 0)} spill instructions)",
                "hold fewer values per thread: smaller blocks, more warps, or fewer stages",
            )
        )
    shared = facts["shared_bytes"]
    if shared > lim.shared_per_block:
        out.append(
            Finding(
                "shared-limit",
                "error",
                f"needs {shared / 1024:.1f} KB of shared memory, {target.name} allows "
                f"{lim.shared_per_block // 1024} KB per block: this config cannot launch there",
                "fewer stages (num_stages) or smaller tiles",
            )
        )
    if occ is not None and occ.blocks_per_sm == 0 and shared <= lim.shared_per_block:
        out.append(Finding("cannot-launch", "error", f"cannot launch: {occ.limiter}", ""))
    if occ is not None and occ.blocks_per_sm > 0 and occ.occupancy < 0.5:
        threads = facts["num_warps"] * target.warp_size
        regs = int(facts["registers"])
        if occ.limiter == "registers":
            r = _lift_registers(target, threads, regs, shared, occ.blocks_per_sm)
            hint = (
                f"at ≤{r} registers per thread {occ.blocks_per_sm + 1} blocks fit "
                "(fewer values per thread, or maxnreg)"
                if r
                else "fewer warps per block"
            )
            out.append(
                Finding(
                    "occupancy",
                    "info",
                    f"occupancy {occ.occupancy:.0%} ({occ.blocks_per_sm} blocks/SM), "
                    f"limited by registers ({regs} per thread)",
                    hint,
                )
            )
        elif occ.limiter == "shared":
            s = _lift_shared(target, threads, regs, shared, occ.blocks_per_sm)
            out.append(
                Finding(
                    "occupancy",
                    "info",
                    f"occupancy {occ.occupancy:.0%} ({occ.blocks_per_sm} blocks/SM), limited "
                    f"by shared memory ({shared / 1024:.1f} KB per block)",
                    f"at ≤{s / 1024:.1f} KB per block {occ.blocks_per_sm + 1} blocks fit "
                    "(fewer stages or smaller tiles)"
                    if s
                    else "smaller tiles",
                )
            )
    if facts.get("dots") and not facts.get("tensor_cores") and target.tensor_cores:
        out.append(
            Finding(
                "no-tensor-cores",
                "warn",
                f"tl.dot compiled without tensor-core instructions "
                f"(expected {' or '.join(target.tensor_cores)} on {target.name})",
                "16-bit or 8-bit inputs (or tf32 for fp32), tile sides ≥ 16, num_warps ≥ 4",
            )
        )
    if facts.get("scaled_dots"):
        found = ", ".join(facts.get("mma_instructions") or []) or "no tensor-core instruction"
        if (facts.get("tensor_cores") or {}).get("tcgen05_block_scale"):
            out.append(Finding("dot-scaled", "info", f"tl.dot_scaled native: {found}"))
        else:
            out.append(
                Finding(
                    "dot-scaled",
                    "info",
                    f"tl.dot_scaled emulated on {target.name} (operands scaled and upcast, "
                    f"then {found})",
                    "native only on sm_100 with both operands in fp8/fp6/fp4 formats"
                    if target.name != "sm_100"
                    else "both operands in fp8/fp6/fp4 formats (a bf16 operand is upcast)",
                )
            )
    risky = facts.get("offsets_32bit") or []
    if risky and (max_elements is None or max_elements >= INT32_ELEMENTS):
        sized = (
            f"tensors here reach {max_elements:,} elements"
            if max_elements is not None
            else "wrong past 2^31 elements"
        )
        out.append(
            Finding(
                "offset-32bit",
                "warn" if max_elements is not None else "info",
                f"offsets of {', '.join(risky)} computed in 32 bits from the program id: {sized}",
                "cast the program id (or the row index) to tl.int64 before scaling it",
            )
        )
    narrow = narrow_accesses(facts)
    if narrow:
        if aligned is not None and narrow_accesses(aligned) < narrow:
            out.append(
                Finding(
                    "vectorisation",
                    "warn",
                    f"{narrow} global accesses narrower than 128 bits ({widths(facts)}); with "
                    f"{', '.join(missing_alignment)} 16-divisible they become "
                    f"{widths(aligned)}",
                    "16-byte aligned tensors and sizes/strides that are multiples of 16 "
                    "(or tl.multiple_of / tl.max_contiguous hints)",
                )
            )
        elif not missing_alignment or aligned is not None:
            out.append(
                Finding(
                    "vectorisation",
                    "info",
                    f"{narrow} global accesses narrower than 128 bits ({widths(facts)}) even "
                    "with every argument 16-divisible",
                    "a non-unit stride on the contiguous dimension, or fewer than 128 bits "
                    "of contiguous elements per thread (BLOCK / (warp size × num_warps))",
                )
            )
    return out
