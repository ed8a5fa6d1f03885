"""Cold-cache timing: evict the last-level cache between samples, outside the timed window.

METHOD.md allows two ways: write a buffer of at least twice the cache between samples, or
rotate among input sets whose total size exceeds it. bench writes a buffer (:class:`Flush`):
its input sets (:mod:`kernelab.bench.rotation`, against caches) are few and small, and a
working set already twice the cache needs no flush. GPUs: the L2 size comes
from the device table or torch; CPUs: the last-level cache from sysfs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

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
