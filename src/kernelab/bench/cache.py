"""Cold-cache timing: evict the last-level cache between samples, outside the timed window.

METHOD.md allows two ways: write a buffer of at least twice the cache between samples, or
rotate among input sets whose total size exceeds it. A working set already twice the cache
needs neither. GPUs: the L2 size comes from the device table or torch; CPUs: the last-level
cache from sysfs.

- On a GPU bench writes a buffer (:class:`Flush`, 2x L2) between samples: the write runs at
  device bandwidth (tens of µs) and device events time the kernel alone.
- On the CPU the host clock times the call and the flush is the expensive part: writing twice
  a 480 MiB last-level cache (what a KVM guest's sysfs may report) costs about 50 ms a
  sample, so a stopping rule with half a second gets ~20 samples and never converges. There
  bench rotates among copies of each subject's arguments (:class:`Rotation`) whose total is
  twice the cache: each sample calls the next copy, which was last touched a whole cycle ago,
  so its inputs come from memory, and a sample costs only the call. The copies hold the same
  values, so the outputs of the timed calls are still checked against one reference; the
  output buffers the candidate allocates are recycled by the allocator (warm), as in a
  serving loop, where a GPU flush would have evicted them too.
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


class Rotation:
    """``copies`` sets of one subject's arguments at distinct addresses, used in turn.

    ``current`` is the set the next call uses; :meth:`advance` first restores the in-place
    arguments of the set just used (from ``pristine``: outside the timed window, and a whole
    cycle before that set is used again) and then moves to the next set.
    """

    def __init__(self, args: dict, copies: int, pristine: dict, inplace: list[str]):
        if copies < 2:
            raise ValueError(f"copies: expected at least 2 sets to rotate, got {copies!r}")
        clone = _clone_tensors
        self.sets = [args] + [clone(args) for _ in range(copies - 1)]
        self.pristine, self.inplace = pristine, list(inplace)
        self.index = 0

    @property
    def current(self) -> dict:
        return self.sets[self.index]

    def advance(self) -> dict:
        used = self.sets[self.index]
        for n in self.inplace:
            used[n].copy_(self.pristine[n])
        self.index = (self.index + 1) % len(self.sets)
        return self.sets[self.index]


def rotation_copies(set_bytes: int, cache_size: int, subjects: int) -> int:
    """Copies per subject so that the subjects' copies together hold twice the cache."""
    if set_bytes <= 0 or subjects < 1:
        return 2
    return max(2, -(-2 * cache_size // (set_bytes * subjects)))


def _clone_tensors(args: dict) -> dict:
    """New storage for every tensor, with the same sizes, strides and values."""

    def clone(v):
        if not isinstance(v, torch.Tensor):
            return v
        try:
            out = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
            return out.copy_(v)
        except RuntimeError:  # overlapping strides (an expanded tensor): a dense copy
            return v.clone()

    return {k: clone(v) for k, v in args.items()}


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
