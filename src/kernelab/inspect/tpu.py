"""Pallas launches on TPU targets: what one lowering is (:class:`TpuSpec`), and the findings
read from its Mosaic facts (:mod:`kernelab.inspect.mosaic`).

Rules (severity), each with the change that fixes it:

- tiling (warn): a block whose last two dims are not multiples of the dtype's native tile
  (8×128 for 32-bit, 16×128 for 16-bit, 32×128 for 8-bit types: a vector register is 8
  sublanes × 128 lanes of 32-bit words, narrower types packed along the sublanes), unless the
  dim is the whole array's. Lowering accepts sub-native second-minor blocks for bf16 and int8;
  the registers then run partly empty or need relayouts.
- vmem (error): the VMEM estimate is over the chip's VMEM per TensorCore, or over the scoped
  limit the call asks for (``vmem_limit_bytes``): Mosaic cannot allocate it. When the call
  asks for no limit, XLA's default scoped limit applies (``--xla_tpu_scoped_vmem_limit_kib``),
  which is not known here: the estimate is then checked against the capacity only.
- no-parallel-axis (warn on megacore chips, info elsewhere): a grid of several steps with no
  "parallel" axis, so steps run in order on one TensorCore and a megacore chip's second one
  idles; on a chip whose TensorCores are separate devices nothing idles, but the grid still
  does not say which steps are independent.
- small-blocks (warn): the blocks copied per grid step take less time at the chip's HBM
  bandwidth than the fixed per-step overhead (:data:`kernelab.hardware.tpu.STEP_OVERHEAD_S`),
  so the overhead dominates.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import orjson

from kernelab.hardware import lookup
from kernelab.hardware.tpu import STEP_OVERHEAD_S, STEP_OVERHEAD_SOURCE, TPU_LIMITS, native_tile
from kernelab.inspect.findings import Finding
from kernelab.inspect.targets import Target

MIB = 2**20


@dataclass(frozen=True)
class TpuSpec:
    """One declared Pallas call (``kernelab.core.runtime.pallas.PallasCall``) to lower.

    Lowered in this process (jax starts threads: never in forked workers). Cached under
    :meth:`source_key`: the full text of every source file defining the kernel or one of its
    index maps, and of the declaration module, with the call's description and jax's version.
    A helper imported from any other module is not covered: ``--no-cache`` after changing
    one."""

    call: Any
    label: str = ""
    max_elements: int | None = None
    backend: str = "pallas"
    extra: dict = field(default_factory=dict)
    cacheable = True
    in_process = True

    @property
    def name(self) -> str:
        return self.call.name

    def describe(self) -> dict:
        c = self.call
        return {
            "kernel": self.name,
            "grid": list(c.grid),
            "semantics": list(c.semantics),
            "inputs": [[list(t.shape), str(t.dtype)] for t in c.inputs],
            "in_blocks": [[b.shape, b.memory] for b in c.in_specs],
            "outputs": [[list(o.shape), str(o.dtype), o.block.shape] for o in c.outputs],
            "scratch": [[s.kind, list(s.shape), str(s.dtype)] for s in c.scratch],
            "vmem_limit_bytes": c.vmem_limit_bytes,
            "params": {k: repr(v) for k, v in sorted(c.params.items())},
        }

    def identity(self) -> str:
        text = orjson.dumps(self.describe(), option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(text).hexdigest()[:20]

    def source_key(self) -> str:
        from kernelab.core.runtime import pallas

        h = hashlib.sha256(self.identity().encode())
        fns = [self.call.kernel] + [b.index_map for b in self.call.in_specs]
        fns += [o.block.index_map for o in self.call.outputs]
        files = {_source_file(f) for f in fns if f is not None} | {_source_file(pallas.PallasCall)}
        # Helpers the kernel imports from its own family or the shared runtime are covered by
        # their folders' files (the gate trusts an entry whose key is unchanged).
        files |= {str(q) for f in list(files) if f for q in Path(f).parent.glob("*.py")}
        for path in sorted(f for f in files if f):
            h.update(_portable(path).encode())
            h.update(_file_digest(path))
        for f in fns:  # which function of those files (two lambdas of one file differ here)
            h.update(_code_key(f))
        h.update(repr(sorted((k, repr(v)) for k, v in self.call.params.items())).encode())
        return h.hexdigest()

    def compiler_version(self) -> str:
        """jax's version, read without importing jax (the cache key is computed before any
        forked workers start)."""
        from importlib import metadata

        try:
            return metadata.version("jax")
        except metadata.PackageNotFoundError:
            return "none"

    def local_key(self) -> str:
        """Names this call within the process: the declaration's own key (kernel and index-map
        code, closures, shapes, blocks), which :meth:`identity` (stable across processes, for
        report keys) does not fully cover."""
        try:
            return f"{self.identity()}:{hash(self.call.key())}"
        except TypeError:  # an unhashable parameter: never deduplicated
            return f"{self.identity()}:{id(self.call)}"

    def config_text(self) -> str:
        cfg = self.call.config
        if cfg is not None and is_dataclass(cfg):
            return " ".join(f"{f.name}={getattr(cfg, f.name)}" for f in fields(cfg))
        if cfg is not None:
            return str(cfg)
        return "grid " + "×".join(str(g) for g in self.call.grid)

    def missing_alignment(self) -> list[str]:
        return []

    def all_aligned(self) -> TpuSpec:
        return self


def _source_file(obj) -> str | None:
    while isinstance(obj, functools.partial):
        obj = obj.func
    try:
        return inspect.getsourcefile(obj)
    except TypeError:  # a builtin or a C function: nothing to hash
        return None


#: The package's root folder: sources under it are named relative to it in cache keys.
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def _portable(path: str) -> str:
    """``path`` as a cache key names it: relative to the package for kernelab's own files, so
    that a clone in another folder computes the same keys (the gate trusts the baseline's)."""
    try:
        return "kernelab/" + Path(path).resolve().relative_to(_PACKAGE_ROOT).as_posix()
    except ValueError:  # a user's file: where it is is part of what it is
        return path


def _code_key(fn) -> bytes:
    """A function's name, line, bytecode and closure values, stable across processes (a
    closure value whose repr holds an address only costs cache hits)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    if code is None:
        return repr(fn).encode()
    cells = [repr(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ())]
    head = f"{fn.__qualname__}:{code.co_firstlineno}:{cells!r}:{fn.__defaults__!r}"
    return head.encode() + code.co_code


@functools.lru_cache(maxsize=256)
def _file_digest_cached(path: str, mtime_ns: int, size: int) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


def _file_digest(path: str) -> bytes:
    try:
        st = os.stat(path)
        return _file_digest_cached(path, st.st_mtime_ns, st.st_size)
    except OSError:  # the file is gone: a key that matches nothing cached
        return os.urandom(16)


def _kb(n: float) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / 1024:.1f} KB"


def _what(w: dict) -> str:
    return f"{'input' if w['role'] == 'in' else 'output'} {w['index']}"


def hbm_bytes_per_s(target: Target) -> float | None:
    """HBM bandwidth one TensorCore sees (the chip's, shared by its TensorCores)."""
    spec = lookup(target.name)
    lim = TPU_LIMITS[target.name]
    if spec is None:
        return None
    return spec.hbm_bytes_per_s / max(1, lim.tensor_cores)


def findings(facts: dict, target: Target) -> list[Finding]:
    out: list[Finding] = []
    lim = TPU_LIMITS[target.name]
    for w in facts["windows"]:
        block, array = w.get("block"), w.get("array")
        if not block or w["memory"] != "vmem" or not w["bits"]:
            continue
        rows, lanes = native_tile(w["bits"])
        last = block[-1]
        second = block[-2] if len(block) >= 2 else None
        full = array if array and len(array) == len(block) else [None] * len(block)
        off = []
        if last % lanes and last != full[-1]:
            off.append(f"last dim {last} is not a multiple of {lanes}")
        if second is not None and second % rows and second != full[-2]:
            off.append(f"second-minor dim {second} is not a multiple of {rows}")
        if off:
            out.append(
                Finding(
                    "tiling",
                    "warn",
                    f"{_what(w)} ({w['dtype']}): block {tuple(block)}: {'; '.join(off)} "
                    f"(native {w['dtype']} tile {rows}×{lanes}: vector registers run partly "
                    "empty, or the data is relaid out)",
                    f"last two block dims multiples of {rows} and {lanes} (or the whole "
                    "array's dims)",
                )
            )
    est = facts["vmem_estimate_bytes"]
    limit = facts.get("vmem_limit_bytes")
    parts = f"blocks {_kb(facts['vmem_block_bytes'])} + scratch {_kb(facts['vmem_scratch_bytes'])}"
    if est > lim.vmem_bytes:
        out.append(
            Finding(
                "vmem",
                "error",
                f"VMEM estimate {_kb(est)} ({parts}) is over the {_kb(lim.vmem_bytes)} of VMEM "
                f"per TensorCore on {target.name}: this config cannot run there",
                "smaller blocks, fewer buffers (pl.Buffered(1) for blocks whose index does not "
                "change) or less scratch",
            )
        )
    elif limit is not None and est > limit:
        out.append(
            Finding(
                "vmem",
                "error",
                f"VMEM estimate {_kb(est)} ({parts}) is over the scoped VMEM limit the call "
                f"asks for ({_kb(limit)}): Mosaic cannot allocate it",
                f"raise vmem_limit_bytes (≤ {_kb(lim.vmem_bytes)} on {target.name}) or use "
                "smaller blocks",
            )
        )
    steps = facts["steps"]
    if (
        steps > 1
        and "parallel" not in facts["semantics"]
        and "core_parallel" not in facts["semantics"]
    ):
        sem = ", ".join(facts["semantics"]) or "none given (all arbitrary)"
        if lim.megacore:
            why = f"{target.name}'s {lim.tensor_cores} TensorCores form one device: one idles"
        else:
            why = (
                f"{target.name} runs one TensorCore per device, so nothing idles here; on a "
                "megacore chip (v4, v5p) one TensorCore would"
            )
        out.append(
            Finding(
                "no-parallel-axis",
                "warn" if lim.megacore else "info",
                f"grid {tuple(facts['grid'])} has no parallel axis (semantics: {sem}): the "
                f"{steps} steps run in order; {why}",
                'mark the axes whose steps are independent "parallel" (keep a reduction axis, '
                'e.g. a K loop, "arbitrary" and last)',
            )
        )
    bw = hbm_bytes_per_s(target)
    moved = facts["step_bytes"]
    if steps > 1 and bw and moved and moved / bw < STEP_OVERHEAD_S:
        need = STEP_OVERHEAD_S * bw
        out.append(
            Finding(
                "small-blocks",
                "warn",
                f"each of the {steps} grid steps copies {_kb(moved)} of blocks: "
                f"{moved / bw * 1e6:.2g} µs at {bw / 1e9:.0f} GB/s, under the fixed per-step "
                f"overhead ({STEP_OVERHEAD_SOURCE}), which then dominates",
                f"larger blocks, fewer steps: at least {_kb(need)} copied per step on "
                f"{target.name}",
            )
        )
    return out


def summary(facts: dict) -> str:
    grid = "×".join(str(g) for g in facts["grid"]) or "1"
    return f"grid {grid}, VMEM ≥{_kb(facts['vmem_estimate_bytes'])}"
