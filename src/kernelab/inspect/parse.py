"""Read what the compiler made: resources, memory access widths, tensor cores, offset width.

Input: the texts :func:`kernelab.inspect.compile.compile_artifacts` returns (Triton IR, PTX and
``cuobjdump`` output for NVIDIA, AMDGCN for AMD). Output: plain dicts and numbers. Counts are of
instructions in the code (static), not of instructions executed.
"""

from __future__ import annotations

import re
from collections import Counter

# --- NVIDIA ---------------------------------------------------------------------------------

_RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_PTX_MEM = re.compile(r"\b(ld|st)\.global((?:\.[A-Za-z0-9_:]+)+)")
_PTX_CP_ASYNC = re.compile(
    r"\bcp\.async\.(?:ca|cg)\.shared(?:::\w+)?\.global[^;]*?\],\s*(0x[0-9a-fA-F]+|\d+)\s*[;,]"
)
_PTX_TMA = re.compile(r"\bcp\.async\.bulk\.tensor\.\S+")
_PTX_TC = {
    "mma": re.compile(r"\bmma\.sync\.aligned\.\S+"),
    "wgmma": re.compile(r"\bwgmma\.mma_async\.\S+"),
    "tcgen05": re.compile(r"\btcgen05\.mma\.\S+"),
    # Blackwell's block-scaled MMA (kind::mxf4, mxf4nvf4, mxf8f6f4 with .block_scale): what a
    # tl.dot_scaled is when the hardware does the scaling; without it the scales were applied
    # to upcast operands before an ordinary MMA (emulated).
    "tcgen05_block_scale": re.compile(r"\btcgen05\.mma\S*\.block_scale\S*"),
}
#: Every tensor-core instruction, spelled as in the PTX without its operands.
_PTX_TC_ANY = re.compile(r"\b(?:tcgen05\.mma|wgmma\.mma_async|mma\.sync\.aligned)\.[^\s;,]+")
_SASS_SPILL = re.compile(r"\b(STL|LDL)(?:\.\w+)*\b")


def _ptx_width(suffix: str) -> int | None:
    parts = suffix.strip(".").split(".")
    vec = 1
    bits = None
    for p in parts:
        if re.fullmatch(r"v\d+", p):
            vec = int(p[1:])
        elif re.fullmatch(r"[busf](8|16|32|64|128)", p):
            bits = int(p[1:])
    return None if bits is None else vec * bits


def ptx_memory(ptx: str) -> tuple[Counter, Counter]:
    """Global loads and stores by width in bits (cp.async copies count as loads)."""
    loads: Counter = Counter()
    stores: Counter = Counter()
    for m in _PTX_MEM.finditer(ptx):
        width = _ptx_width(m.group(2))
        if width is not None:
            (loads if m.group(1) == "ld" else stores)[width] += 1
    for m in _PTX_CP_ASYNC.finditer(ptx):
        loads[int(m.group(1), 0) * 8] += 1
    return loads, stores


def nvidia(art: dict) -> dict:
    res = _RES.search(art.get("res_usage", ""))
    ptx = art.get("ptx", "")
    loads, stores = ptx_memory(ptx)
    spill_instrs = len(_SASS_SPILL.findall(art.get("sass", "")))
    tc = {k: len(r.findall(ptx)) for k, r in _PTX_TC.items()}
    return {
        "registers": int(res.group(1)) if res else None,
        "spill_bytes": (int(res.group(4)) + int(res.group(2))) if res else None,
        "spill_instructions": spill_instrs,
        "shared_bytes": int(art.get("shared", 0)),
        "loads": _bits(loads),
        "stores": _bits(stores),
        "tensor_cores": {k: v for k, v in tc.items() if v},
        "mma_instructions": sorted(set(_PTX_TC_ANY.findall(ptx))),
        "tma": len(_PTX_TMA.findall(ptx)),
    }


# --- AMD --------------------------------------------------------------------------------------

_AMD_MEM = re.compile(
    r"\b(?:global|buffer)_(load|store)_(lds_)?"
    r"(dwordx4|dwordx3|dwordx2|dword|b128|b96|b64|b32|ushort|sshort|short|u16|i16|b16|"
    r"ubyte|sbyte|byte|u8|i8|b8)(_d16(?:_hi)?)?\b"
)
_AMD_BITS = {
    "dwordx4": 128, "b128": 128, "dwordx3": 96, "b96": 96, "dwordx2": 64, "b64": 64,
    "dword": 32, "b32": 32, "ushort": 16, "sshort": 16, "short": 16, "u16": 16, "i16": 16,
    "b16": 16, "ubyte": 8, "sbyte": 8, "byte": 8, "u8": 8, "i8": 8, "b8": 8,
}  # fmt: skip
_AMD_MFMA = re.compile(r"\bv_(?:s)?mfma\w*")


def _amd_field(text: str, *patterns: str) -> int | None:
    for p in patterns:
        m = re.search(p, text, re.MULTILINE)
        if m:
            return int(m.group(1))
    return None


def amd(art: dict) -> dict:
    gcn = art.get("amdgcn", "")
    loads: Counter = Counter()
    stores: Counter = Counter()
    for m in _AMD_MEM.finditer(gcn):
        (loads if m.group(1) == "load" else stores)[_AMD_BITS[m.group(3)]] += 1
    vgprs = _amd_field(gcn, r"^; TotalNumVgprs:\s*(\d+)", r"^\s*\.vgpr_count:\s*(\d+)")
    scratch = _amd_field(gcn, r"^\s*\.private_segment_fixed_size:\s*(\d+)", r"ScratchSize:\s*(\d+)")
    vspill = _amd_field(gcn, r"^\s*\.vgpr_spill_count:\s*(\d+)") or 0
    sspill = _amd_field(gcn, r"^\s*\.sgpr_spill_count:\s*(\d+)") or 0
    lds = _amd_field(gcn, r"^\s*\.group_segment_fixed_size:\s*(\d+)") or 0
    mfma = len(_AMD_MFMA.findall(gcn))
    return {
        "registers": vgprs,
        "sgprs": _amd_field(gcn, r"^\s*\.sgpr_count:\s*(\d+)"),
        "spill_bytes": scratch,
        "spill_instructions": vspill + sspill,
        "shared_bytes": max(int(art.get("shared", 0)), lds),
        "loads": _bits(loads),
        "stores": _bits(stores),
        "tensor_cores": {"mfma": mfma} if mfma else {},
        "mma_instructions": sorted(set(_AMD_MFMA.findall(gcn))),
        "tma": 0,
    }


def _bits(c: Counter) -> dict[str, int]:
    """Widths as sorted string keys, so that the result is stable JSON."""
    return {str(k): c[k] for k in sorted(c)}


# --- Triton IR: dots, scalar loads, 32-bit offsets -------------------------------------------

_DEF = re.compile(r"^\s*(%[\w.$-]+)\s*=\s*([\w.]+)\s*(.*)$")
_VAL = re.compile(r"%[\w.$-]+")
_FUNC = re.compile(r"tt\.func\s+\w*\s*@[\w$.]+\((.*)\)\s*(?:->|attributes|\{)")
_ARG = re.compile(r"(%[\w.$-]+)\s*:\s*(!tt\.ptr<[^>]*>|[\w<>x!.]+)")


def _strip_loc(rest: str) -> str:
    return re.sub(r"\s+loc\(.*$", "", rest)


def ttir(text: str) -> dict:
    """Dots, scalar loads, and global pointers offset by 32-bit values scaled by program id.

    A 32-bit offset risk is a ``tt.addptr`` whose offset is an i32 value computed from a
    multiplication involving ``tt.get_program_id`` or a loaded value: ``pid * BLOCK + arange``
    in 32 bits wraps once the tensor has more than 2^31 elements.
    """
    defs: dict[str, tuple[str, list[str], str]] = {}
    args: dict[str, str] = {}
    addptrs: list[tuple[str, str, str]] = []
    dots = 0
    scaled_dots = 0
    scalar_loads = 0
    tensor_loads = 0
    for line in text.splitlines():
        if "tt.func" in line:
            m = _FUNC.search(line)
            if m:
                for a in _ARG.finditer(m.group(1)):
                    args[a.group(1)] = a.group(2)
            continue
        m = _DEF.match(line)
        if not m:
            continue
        name, op, rest = m.group(1), m.group(2), _strip_loc(m.group(3))
        operands_text, _, types = rest.rpartition(" : ") if " : " in rest else (rest, "", "")
        operands = _VAL.findall(operands_text)
        defs[name] = (op, operands, types)
        if op == "tt.dot" or op == "tt.dot_scaled":
            dots += 1
            scaled_dots += op == "tt.dot_scaled"
        elif op == "tt.load":
            if "tensor<" in types:
                tensor_loads += 1
            else:
                scalar_loads += 1
        elif op == "tt.addptr" and len(operands) >= 2:
            offset_type = types.rsplit(",", 1)[-1]
            if re.search(r"\bi32\b|xi32>", offset_type):
                addptrs.append((operands[0], operands[1], name))

    def ancestors(value: str, limit: int = 400) -> set[str]:
        seen: set[str] = set()
        stack = [value]
        while stack and len(seen) < limit:
            v = stack.pop()
            if v in seen or v not in defs:
                continue
            seen.add(v)
            stack.extend(defs[v][1])
        return seen

    def base_arg(value: str) -> str:
        for v in [value, *sorted(ancestors(value))]:
            if v in args:
                return v.lstrip("%")
            if v in defs:
                for o in defs[v][1]:
                    if o in args and args[o].startswith("!tt.ptr"):
                        return o.lstrip("%")
        return "?"

    risky: set[str] = set()
    for base, offset, _ in addptrs:
        anc = ancestors(offset)
        for v in anc:
            op, operands, _ = defs[v]
            if op != "arith.muli":
                continue
            sub = set().union(*(ancestors(o) for o in operands)) if operands else set()
            if any(defs[s][0] in ("tt.get_program_id", "tt.load") for s in sub):
                risky.add(base_arg(base))
                break
    return {
        "dots": dots,
        "scaled_dots": scaled_dots,
        "scalar_loads": scalar_loads,
        "tensor_loads": tensor_loads,
        "offsets_32bit": sorted(risky),
    }


def parse(art: dict) -> dict:
    """All facts of one compiled kernel, as a JSON-ready dict."""
    facts = nvidia(art) if "ptx" in art else amd(art)
    facts.update(ttir(art.get("ttir", "")))
    facts["num_warps"] = art["num_warps"]
    facts["num_stages"] = art["num_stages"]
    facts["tmem_bytes"] = art.get("tmem", 0)
    return facts
