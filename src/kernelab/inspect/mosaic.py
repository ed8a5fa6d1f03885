"""Read a Mosaic module (the text :mod:`kernelab.core.runtime.mosaic` prints) into facts: grid,
dimension semantics, block shapes, scratch, VMEM limit and a VMEM estimate.

The text is parsed, never executed: a few regular expressions and a bracket-aware splitter
over the kernel function's signature and attributes::

    func.func @k(%arg0: i32, %arg1: memref<8x4096xbf16, #tpu.memory_space<vmem>>, ...)
        attributes {dimension_semantics = [#tpu.dimension_semantics<parallel>],
                    iteration_bounds = array<i64: 8>, scalar_prefetch = 0 : i64,
                    scratch_operands = 1 : i64, window_params = [{transform_indices = ...,
                    window_bounds = array<i64: 8, 4096>}, ...]}

Arguments come in Pallas's order: one index per grid axis, the scalar-prefetch operands, one
window per input and output (``window_params``, inputs first), then the scratch operands.

The VMEM estimate is what the pipeline itself needs: every block in VMEM twice (double
buffering; once when Mosaic marks it ``synchronous``, e.g. a block whose index never changes),
plus scratch in VMEM, each padded to the native tile of its dtype. It leaves out Mosaic's
internal scratch and whatever the vector layouts assigned later inside libtpu (not available
here) add, so it is a lower bound of the real footprint.
"""

from __future__ import annotations

import math
import re

from kernelab.hardware.tpu import LANES, native_tile

#: Bits of the element types Mosaic prints.
BITS = {
    "f64": 64, "f32": 32, "bf16": 16, "f16": 16, "i64": 64, "i32": 32, "i16": 16, "i8": 8,
    "ui32": 32, "ui16": 16, "ui8": 8, "i4": 4, "ui4": 4, "i1": 32,
    "f8E4M3FN": 8, "f8E5M2": 8, "f8E4M3B11FNUZ": 8, "f8E4M3FNUZ": 8, "f8E5M2FNUZ": 8,
}  # fmt: skip
#: The dtype names kernelab reports (torch's short spellings where they exist).
NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "i8": "int8", "i32": "int32",
         "f8E4M3FN": "fp8e4m3", "f8E5M2": "fp8e5m2"}  # fmt: skip

_FUNC = re.compile(r"func\.func\s+(?:\w+\s+)?@([\w$.-]+)\(")
_INTS = re.compile(r"-?\d+")


class MosaicParseError(ValueError):
    """The text is not a Mosaic kernel module this reader understands."""


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets (<>, (), [], {}) and quotes; '->' is not a bracket."""
    out, depth, start, quote = [], 0, 0, False
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"' and (i == 0 or text[i - 1] != "\\"):
            quote = not quote
        elif not quote:
            if c in "<([{":
                depth += 1
            elif c in ")]}" or (c == ">" and text[i - 1 : i] != "-"):
                depth -= 1
            elif c == sep and depth == 0:
                out.append(text[start:i].strip())
                start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def _closing(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at ``open_at``."""
    pairs = {"(": ")", "{": "}", "[": "]", "<": ">"}
    opener, closer = text[open_at], pairs[text[open_at]]
    depth = 0
    for i in range(open_at, len(text)):
        c = text[i]
        if c == opener:
            depth += 1
        elif c == closer and not (c == ">" and text[i - 1] == "-"):
            depth -= 1
            if depth == 0:
                return i
    raise MosaicParseError("unbalanced brackets in the Mosaic text")


def memref(ty: str) -> dict | None:
    """``memref<8x128xbf16, #tpu.memory_space<vmem>>`` → shape, dtype, bits, memory space;
    semaphores get dtype "semaphore"; None for a non-memref (a grid index, a scalar)."""
    ty = ty.strip()
    if not ty.startswith("memref<"):
        return None
    inner = split_top(ty[len("memref<") : _closing(ty, len("memref"))])
    space = re.search(r"memory_space<(\w+)>", ty)
    dims = inner[0].split("x")
    elem = dims[-1].strip()
    try:
        shape = [int(d) for d in dims[:-1]]
    except ValueError:
        raise MosaicParseError(f"memref with a dynamic or unknown shape: {ty[:120]}") from None
    if elem.startswith("!tpu.") and "semaphore" in elem:
        return {"shape": shape, "dtype": "semaphore", "bits": 0,
                "memory": space.group(1) if space else "semaphore_mem"}  # fmt: skip
    if elem not in BITS:
        raise MosaicParseError(f"element type {elem!r} not known to this reader")
    return {
        "shape": shape,
        "dtype": NAMES.get(elem, elem),
        "bits": BITS[elem],
        "memory": space.group(1) if space else "vmem",
    }


def padded_bytes(shape: list[int], bits: int) -> int:
    """Bytes of a VMEM buffer with its last two dims padded to the dtype's native tile."""
    if not bits:
        return 0
    rows, lanes = native_tile(bits)
    dims = list(shape) or [1]
    if len(dims) == 1:
        per = rows * lanes
        dims[0] = math.ceil(dims[0] / per) * per
    else:
        dims[-1] = math.ceil(dims[-1] / lanes) * lanes
        dims[-2] = math.ceil(dims[-2] / rows) * rows
    return math.prod(dims) * bits // 8


def raw_bytes(shape: list[int], bits: int) -> int:
    return math.prod(shape) * bits // 8


def tensor_shape(ty: str) -> list[int] | None:
    """``tensor<64x4096xbf16>`` → [64, 4096]; None for anything else."""
    m = re.fullmatch(r"\s*tensor<([^>]*)>\s*", ty)
    if not m:
        return None
    dims = m.group(1).split("x")[:-1]
    try:
        return [int(d) for d in dims]
    except ValueError:
        return None


def _kernel_func(text: str) -> tuple[str, list[str], dict[str, str]]:
    """(name, argument types, attributes) of the function that carries the grid."""
    for m in _FUNC.finditer(text):
        open_at = m.end() - 1
        close = _closing(text, open_at)
        rest = text[close + 1 : close + 1 + 40].lstrip()
        if not rest.startswith("attributes"):
            continue
        brace = text.index("{", close)
        attrs_text = text[brace + 1 : _closing(text, brace)]
        attrs = {}
        for item in split_top(attrs_text):
            key, _, value = item.partition("=")
            attrs[key.strip()] = value.strip()
        if "iteration_bounds" not in attrs and "window_params" not in attrs:
            continue
        args = [a.partition(":")[2].strip() for a in split_top(text[open_at + 1 : close])]
        return m.group(1), args, attrs
    raise MosaicParseError("no kernel function with iteration_bounds/window_params found")


def _int_attr(attrs: dict, key: str) -> int:
    m = _INTS.search(attrs.get(key, "0"))
    return int(m.group()) if m else 0


def parse_call(call: dict) -> dict:
    """Facts of one lowered ``tpu_custom_call`` (an entry of ``mosaic.lower(...)["calls"]``)."""
    name, args, attrs = _kernel_func(call["mosaic"])
    bounds = attrs.get("iteration_bounds", "array<i64>")
    grid = [int(x) for x in _INTS.findall(bounds.partition(":")[2])] if ":" in bounds else []
    semantics = re.findall(r"dimension_semantics<(\w+)>", attrs.get("dimension_semantics", ""))
    prefetch = _int_attr(attrs, "scalar_prefetch")
    n_scratch = _int_attr(attrs, "scratch_operands")
    params = attrs.get("window_params", "[]").strip()
    windows_text = split_top(params[1:-1]) if params.startswith("[") else []
    first = len(grid) + prefetch
    window_args = args[first : first + len(windows_text)]
    scratch_args = args[first + len(windows_text) : first + len(windows_text) + n_scratch]
    if len(window_args) != len(windows_text) or len(scratch_args) != n_scratch:
        raise MosaicParseError(
            f"{name}: {len(args)} arguments do not cover {len(grid)} grid indices, {prefetch} "
            f"scalar-prefetch operands, {len(windows_text)} windows and {n_scratch} scratch"
        )
    operands = [tensor_shape(t) for t in call.get("operands", [])][prefetch:]
    results = [tensor_shape(t) for t in call.get("results", [])]
    n_in = len(windows_text) - len(results) if results else len(windows_text)
    windows = []
    for i, (wtext, ty) in enumerate(zip(windows_text, window_args, strict=True)):
        ref = memref(ty) or {"shape": [], "dtype": "?", "bits": 0, "memory": "?"}
        wb = re.search(r"window_bounds\s*=\s*array<i64:([^>]*)>", wtext)
        block = [int(x) for x in _INTS.findall(wb.group(1))] if wb else None
        role, index = ("in", i) if i < n_in else ("out", i - n_in)
        array = operands if role == "in" else results
        array_shape = array[index] if index < len(array) else None
        synchronous = "pipeline_mode<synchronous>" in wtext
        in_vmem = ref["memory"] == "vmem" and block is not None
        windows.append(
            {
                "role": role,
                "index": index,
                "block": block,
                "array": array_shape,
                "dtype": ref["dtype"],
                "bits": ref["bits"],
                "memory": ref["memory"] if block is not None else "any",
                "buffers": (1 if synchronous else 2) if in_vmem else 0,
                "bytes": raw_bytes(ref["shape"], ref["bits"]) if block is not None else 0,
                "vmem_bytes": padded_bytes(ref["shape"], ref["bits"]) if in_vmem else 0,
            }
        )
    scratch = []
    for ty in scratch_args:
        ref = memref(ty) or {"shape": [], "dtype": "?", "bits": 0, "memory": "?"}
        scratch.append(
            {
                "shape": ref["shape"],
                "dtype": ref["dtype"],
                "memory": ref["memory"],
                "bytes": raw_bytes(ref["shape"], ref["bits"]),
                "vmem_bytes": padded_bytes(ref["shape"], ref["bits"])
                if ref["memory"] == "vmem"
                else 0,
            }
        )
    limit = None
    for cfg in call.get("config", {}).get("scoped_memory_configs") or []:
        if isinstance(cfg, dict) and cfg.get("memory_space") == 1:  # 1: VMEM
            limit = int(cfg.get("size", 0)) or None
    blocks_vmem = sum(w["vmem_bytes"] * w["buffers"] for w in windows)
    scratch_vmem = sum(s["vmem_bytes"] for s in scratch)
    return {
        "kernel": name,
        "grid": grid,
        "steps": math.prod(grid) if grid else 1,
        "semantics": semantics,
        "scalar_prefetch": prefetch,
        "windows": windows,
        "scratch": scratch,
        "vmem_limit_bytes": limit,
        "vmem_block_bytes": blocks_vmem,
        "vmem_scratch_bytes": scratch_vmem,
        "vmem_estimate_bytes": blocks_vmem + scratch_vmem,
        "smem_bytes": sum(s["bytes"] for s in scratch if s["memory"] == "smem"),
        #: Bytes the pipeline copies per grid step (blocks fetched or written back each step).
        "step_bytes": sum(w["bytes"] for w in windows if w["buffers"] == 2),
    }


def parse(art: dict) -> dict:
    """Facts of a lowered Pallas call: those of its first ``tpu_custom_call``, with how many
    there were and the jax version that lowered it."""
    calls = art.get("calls") or []
    if not calls:
        raise MosaicParseError("the lowering holds no tpu_custom_call (no Pallas kernel)")
    facts = parse_call(calls[0])
    facts["custom_calls"] = len(calls)
    facts["jax"] = art.get("jax")
    facts["lanes"] = LANES
    return facts
