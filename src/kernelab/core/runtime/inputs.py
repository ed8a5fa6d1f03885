"""Random inputs from several distributions, reproducible from a seed.

Never zeros or constants: they hide unwritten outputs and wrong indexing (METHOD.md).
"""

from __future__ import annotations

import torch

#: The distributions every op is exercised with (METHOD.md, "Correct first").
DISTRIBUTIONS = ("normal", "shifted", "heavy", "tiny", "huge")
#: Distributions an op adds to its trials (``Contract.distributions``). "offset": N(0, 1)
#: plus a common offset of 1000σ (100σ in float16, 30σ in bfloat16: the formats' spacing
#: there still resolves σ), where E[x²] − E[x]² in float32 loses ~(μ/σ)²·2⁻²⁴ ≈ 6 % of the
#: variance and a two-pass or Welford variance loses nothing that matters.
EXTRA_DISTRIBUTIONS = ("offset",)
_OFFSET = {torch.float16: 100.0, torch.bfloat16: 30.0}

# Magnitudes for "tiny" and "huge", per dtype: far from the format's limits so that the op
# itself, not the input generator, decides what is representable.
_TINY = {torch.float16: 1e-3, torch.bfloat16: 1e-6, torch.float32: 1e-6, torch.float64: 1e-6}
_HUGE = {torch.float16: 1e2, torch.bfloat16: 1e6, torch.float32: 1e6, torch.float64: 1e6}


def generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator for ``device`` seeded with ``seed``."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev.type if dev.type != "meta" else "cpu")
    gen.manual_seed(int(seed))
    return gen


def randn(
    shape,
    dtype: torch.dtype,
    device,
    gen: torch.Generator | None,
    dist: str = "normal",
    scale: float = 1.0,
    mean: float = 0.0,
) -> torch.Tensor:
    """A tensor of ``shape`` drawn from ``dist``, created in float32 and cast to ``dtype``."""
    device = torch.device(device)
    if device.type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    if dist not in DISTRIBUTIONS + EXTRA_DISTRIBUTIONS:
        raise ValueError(
            f"dist: expected one of {DISTRIBUTIONS + EXTRA_DISTRIBUTIONS}, got {dist!r}"
        )
    gdev = gen.device if gen is not None else device
    x = torch.randn(shape, generator=gen, device=gdev, dtype=torch.float32)
    if dist == "shifted":
        x = x + 3.0
    elif dist == "heavy":
        # About one element in a thousand is a 50x outlier.
        u = torch.rand(shape, generator=gen, device=gdev)
        x = torch.where(u < 1e-3, x * 50.0, x)
    elif dist == "tiny":
        x = x * _TINY.get(dtype, 1e-6)
    elif dist == "huge":
        x = x * _HUGE.get(dtype, 1e6)
    elif dist == "offset":
        x = x + _OFFSET.get(dtype, 1000.0)
    x = x * scale + mean
    return x.to(device=device, dtype=dtype)


def randint(
    shape,
    low: int,
    high: int,
    device,
    gen: torch.Generator | None,
    dtype: torch.dtype = torch.int64,
) -> torch.Tensor:
    device = torch.device(device)
    if device.type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    gdev = gen.device if gen is not None else device
    return torch.randint(low, high, shape, generator=gen, device=gdev, dtype=dtype).to(device)


def strided_rows(t: torch.Tensor, pad: int) -> torch.Tensor:
    """The same values as 2-D ``t`` in a view whose row stride is ``cols + pad`` (not contiguous).

    The padding holds NaN, so a kernel that ignores the row stride reads poison.
    """
    rows, cols = t.shape
    buf = torch.full((rows, cols + pad), float("nan"), dtype=t.dtype, device=t.device)
    view = buf[:, :cols]
    view.copy_(t)
    return view
