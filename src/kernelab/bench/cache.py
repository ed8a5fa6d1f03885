"""Cold-cache timing: every sample reads inputs that are not in the last-level cache.

METHOD.md allows two ways: write a buffer of at least twice the cache between samples, or
rotate among input sets whose total size exceeds it. bench rotates (:func:`replicate`): each
subject cycles through copies of its arguments at new addresses that together hold twice the
cache, so a copy comes round again only after twice the cache has been read since its last
use. It costs one copy of the arguments per sample's worth of cache instead of a write of
twice the cache per sample (960 MiB on a host whose last-level cache is 480 MiB: ~20 samples
a case, never converged). The copies carry the input states of :mod:`kernelab.bench.rotation`
(against caches). :class:`Flush` is kept for what copies cannot do: more copies than
:data:`MAX_COPIES`, or copies that would not fit in :data:`COPY_MEMORY_SHARE` of the free
memory. A working set already twice the cache needs neither. GPUs: the L2 size comes from
the device table or torch; CPUs: the last-level cache from sysfs.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch

from kernelab._host import memory_available

#: Used when a device's cache size cannot be found: larger than any L2 in the table.
FALLBACK_CACHE_BYTES = 128 * 2**20


def _parse_size(text: str) -> int | None:
    text = text.strip().upper()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}
    try:
        if text and text[-1] in mult:
            return int(float(text[:-1]) * mult[text[-1]])
        return int(text)
    except ValueError:
        return None


def cpu_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Size of the CPU's last-level cache, from sysfs (None when not exposed)."""
    best_level, best = -1, None
    for index in sorted(Path(root).glob("index*")):
        with contextlib.suppress(OSError, ValueError):
            level = int((index / "level").read_text())
            size = _parse_size((index / "size").read_text())
            if size and level >= best_level:
                best_level, best = level, size
    return best


def cache_bytes(info) -> tuple[int, str]:
    """Last-level cache size of the device described by ``info`` and where it came from."""
    if info.type == "cpu":
        size = cpu_cache_bytes()
        return (size, "sysfs") if size else (FALLBACK_CACHE_BYTES, "fallback")
    if info.spec is not None:
        return int(info.spec.l2_bytes), f"datasheet {info.spec.name}"
    with contextlib.suppress(Exception):
        size = int(torch.cuda.get_device_properties(info.index).L2_cache_size)
        if size > 0:
            return size, "torch device properties"
    return FALLBACK_CACHE_BYTES, "fallback"


class Flush:
    """A buffer of ``factor`` × the cache size, rewritten by :meth:`__call__`."""

    def __init__(self, device: torch.device | str, cache_size: int, factor: float = 2.0):
        if cache_size <= 0:
            raise ValueError(f"cache_size: expected a positive byte count, got {cache_size!r}")
        if factor < 2.0:
            raise ValueError(f"factor: expected at least 2 (twice the cache), got {factor!r}")
        self.nbytes = int(cache_size * factor)
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        self._value = 0

    def __call__(self) -> None:
        self._value = (self._value + 1) % 251
        self.buffer.fill_(self._value)


def tensor_bytes(inputs: dict) -> int:
    seen, total = set(), 0
    for v in inputs.values():
        if isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            key = storage.data_ptr()
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total


#: Copies of a subject's arguments at most (tiny inputs take a flush instead), and the share
#: of the device's free memory all subjects' copies may take.
MAX_COPIES = 1 << 15
COPY_MEMORY_SHARE = 0.25
#: Each copy of a tensor starts on a multiple of this many bytes (vector loads and the
#: compiler's divisibility assumptions see the alignment the original had, at most this).
COPY_ALIGN = 256


def copies_for_cold(set_bytes: list[int], cache_size: int, device) -> int | None:
    """Places (the arguments and their copies) each set of arguments rotates through so that
    they hold twice the cache (at least 2), given the bytes of each set (one per group of
    subjects that share arguments); None when a flush must do instead (too many copies, or
    all the copies over the memory share)."""
    if cache_size <= 0 or not set_bytes:
        return None
    copies = max(2, math.ceil(2 * cache_size / max(1, min(set_bytes))))
    if copies > MAX_COPIES:
        return None
    need = sum(copies * (b + COPY_ALIGN * 4) for b in set_bytes)
    return copies if need <= COPY_MEMORY_SHARE * free_memory(device) else None


def free_memory(device) -> int:
    """Bytes free now on ``device``: the host's available memory, the CUDA driver's count on a
    GPU (0 where that cannot be read: no copies then)."""
    device = torch.device(device)
    if device.type == "cuda":
        with contextlib.suppress(Exception):
            return int(torch.cuda.mem_get_info(device)[0])
        return 0
    return memory_available()


def replicate(args: dict, count: int) -> list[dict]:
    """``count`` copies of ``args`` at new addresses: same shapes, strides, dtypes and values
    (the whole span of storage a strided tensor reaches). One block of memory per tensor
    argument holds all its copies, a row each, every row aligned to :data:`COPY_ALIGN`
    bytes; a tensor passed under two names is one tensor in each copy; other values are
    shared. The copies are plain (no autograd history): a tensor that requires grad cannot
    be copied this way (ValueError)."""
    if count < 1:
        return []
    copies: list[dict] = [dict(args) for _ in range(count)]
    done: dict[int, list[torch.Tensor]] = {}
    for name, t in args.items():
        if not isinstance(t, torch.Tensor):
            continue
        if id(t) not in done:
            done[id(t)] = _tensor_copies(name, t, count)
        for c, view in zip(copies, done[id(t)], strict=True):
            c[name] = view
    return copies


def _tensor_copies(name: str, t: torch.Tensor, count: int) -> list[torch.Tensor]:
    if t.requires_grad:
        raise ValueError(f"{name}: a tensor that requires grad cannot be copied for rotation")
    if not t.numel():
        return [t.clone() for _ in range(count)]
    span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    size = t.element_size()
    row = -(-span * size // COPY_ALIGN) * COPY_ALIGN // size
    block = torch.empty((count, row), dtype=t.dtype, device=t.device)
    block[:, :span] = t.detach().as_strided((span,), (1,), t.storage_offset())
    return [block[i].as_strided(t.shape, t.stride()) for i in range(count)]
