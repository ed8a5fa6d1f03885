"""Buffers that catch kernels out: poisoned outputs, canaries around every tensor, bit views.

Every tensor a candidate sees is a view into a larger buffer whose surroundings (and, for
strided views, gaps) hold canary values. Around outputs the canary is a finite value no kernel
computes by chance; around inputs it is NaN for floats, so that an out-of-bounds read shows up
in the results. Outputs are filled with a poison before each call: NaN (or a sentinel for
integers) on the first call, a different value on the second.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelab.numerics import bits

#: Canary elements on each side of every buffer.
PAD = 1024


def poison_value(dtype: torch.dtype, which: int):
    """The poison of call ``which`` (0 or 1): NaN, then the most negative finite value, for
    floats; the minimum, then the maximum, for integers; True, then False, for booleans."""
    if dtype == torch.bool:
        return which == 0
    if dtype.is_floating_point:
        return float("nan") if which == 0 else -torch.finfo(dtype).max
    info = torch.iinfo(dtype)
    return info.min if which == 0 else info.max


def canary_value(dtype: torch.dtype, around_input: bool):
    """The value that fills a buffer around a tensor (see module docstring)."""
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point:
        if around_input:
            return float("nan")
        return min(1337.0, torch.finfo(dtype).max / 4)
    info = torch.iinfo(dtype)
    return max(info.min, min(info.max, 0x5A5A5A5A5A5A5A5A if info.bits == 64 else 0x5A5A5A5A))


def _span(shape, stride) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((n - 1) * abs(st) for n, st in zip(shape, stride, strict=True))


def _overlapping(t: torch.Tensor) -> bool:
    return any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride(), strict=True)) or any(
        st < 0 for st in t.stride()
    )


@dataclass
class Guarded:
    """A view into a canary-filled buffer. ``view`` is what the candidate gets."""

    name: str
    view: torch.Tensor
    buffer: torch.Tensor | None  # None when the tensor could not be guarded (overlapping)
    canary: object

    def broken_canaries(self) -> tuple[int, list[int], list]:
        """How many canaries changed, the first offsets (relative to the view's first
        element; negative before it) and the values found there."""
        if self.buffer is None:
            return 0, [], []
        want = bits(torch.full((1,), self.canary, dtype=self.buffer.dtype)).to(self.buffer.device)
        span = _span(self.view.shape, self.view.stride())
        raw = bits(self.buffer)
        if self.view.is_contiguous() or not self.view.numel():
            # Only the two pads hold canaries.
            where = torch.cat(
                [
                    torch.nonzero(raw[:PAD] != want).flatten(),
                    torch.nonzero(raw[PAD + span :] != want).flatten() + PAD + span,
                ]
            ).cpu()
        else:
            changed = raw != want
            changed.as_strided(self.view.shape, self.view.stride(), PAD).fill_(False)
            where = torch.nonzero(changed).flatten().cpu()
        if not where.numel():
            return 0, [], []
        offsets = [int(i) - PAD for i in where[:5]]
        values = [_scalar(self.buffer[int(i)].cpu()) for i in where[:5]]
        return int(where.numel()), offsets, values


def guard(name: str, t: torch.Tensor, around_input: bool) -> Guarded:
    """A copy of ``t`` with the same sizes and strides, inside a canary-filled buffer."""
    canary = canary_value(t.dtype, around_input)
    if _overlapping(t):
        return Guarded(name, t.clone(), None, canary)
    span = _span(t.shape, t.stride())
    buf = torch.full((span + 2 * PAD,), canary, dtype=t.dtype, device=t.device)
    view = buf.as_strided(t.shape, t.stride(), PAD)
    view.copy_(t)
    return Guarded(name, view, buf, canary)


def output(name: str, shape, dtype: torch.dtype, device) -> Guarded:
    """A contiguous output of ``shape`` inside a canary-filled buffer (not yet poisoned)."""
    stride = torch.empty(shape, device="meta").stride() if len(shape) else ()
    canary = canary_value(dtype, around_input=False)
    span = _span(shape, stride)
    buf = torch.full((span + 2 * PAD,), canary, dtype=dtype, device=device)
    view = buf.as_strided(shape, stride, PAD)
    return Guarded(name, view, buf, canary)


def poison(t: torch.Tensor, which: int) -> None:
    if t.numel():
        t.fill_(poison_value(t.dtype, which))


#: Poisoned blocks freed per output shape before an allocating call.
PRIMED = 4
#: Outputs above this size are not primed: glibc maps them fresh (zero pages) at any setting of
#: its dynamic mmap threshold, whose ceiling on 64-bit Linux is 32 MiB (mallopt(3)).
PRIME_MAX_BYTES = 32 << 20


def prime_allocator(specs, which: int = 0) -> None:
    """Leave freed memory of each output's size holding the poison before an allocating call.

    A candidate that allocates its own output and leaves elements unwritten reads back whatever
    the allocator hands it, and that can be a freed copy of the right answer (an earlier call's
    output, a reference's temporary), so the flaw passes by luck. ``specs`` are
    ``(shape, dtype, device)``; each gets ``PRIMED`` blocks filled with the poison of call
    ``which``, then freed, so that an allocation of that size is likely to reuse poison.

    Likely, not certain. PyTorch's CUDA caching allocator hands out the best-fitting free block,
    which the priming blocks have just taken and filled, though a freed neighbour can merge with
    one and come first. On the CPU glibc serves torch's 64-byte-aligned requests from a larger
    chunk, and over 50 tries per size ``torch.empty`` came back all poison 0 to 50 times
    depending on the size. Where it counts (a planted column-mask defect on a 3x301 output, the
    allocating call repeated 200 times) the lucky passes went from 23 to 0. Calls with ``out=``
    do not depend on it: their outputs are poisoned in place.
    """
    blocks = []
    for shape, dtype, device in specs:
        if torch.Size(shape).numel() * dtype.itemsize <= PRIME_MAX_BYTES:
            fill = poison_value(dtype, which)
            blocks += [torch.full(tuple(shape), fill, dtype=dtype, device=device)
                       for _ in range(PRIMED)]  # fmt: skip
    del blocks


def first(mask: torch.Tensor, got: torch.Tensor, expected: torch.Tensor | None, n: int = 5):
    """Indices of the first ``n`` True elements of ``mask`` with the values there."""
    idx = torch.nonzero(mask.cpu())[:n]
    got_c = got.detach().cpu()
    exp_c = expected.detach().cpu() if expected is not None else None
    indices, g, e = [], [], []
    for row in idx:
        i = tuple(int(k) for k in row)
        indices.append(list(i))
        g.append(_scalar(got_c[i]))
        e.append(_scalar(exp_c[i]) if exp_c is not None else None)
    return indices, g, e


def _scalar(v: torch.Tensor):
    if v.dtype == torch.bool:
        return bool(v)
    if v.dtype.is_floating_point:
        return float(v.to(torch.float64))
    return int(v)
