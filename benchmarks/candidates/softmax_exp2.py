"""An honest softmax candidate, written differently from the reference: base-2 exponentials
of the max-shifted row in float32, the sum by a matrix-vector product."""

import math

import torch


def softmax_candidate(x, scale=1.0, mask=None, out=None):
    z = x.float() * (scale * math.log2(math.e))
    if mask is not None:
        z = z + mask.float() * math.log2(math.e)
    m = z.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row of -inf stays NaN-free
    e = torch.exp2(z - m)
    s = e @ torch.ones(e.shape[-1], 1, dtype=e.dtype, device=e.device)
    y = (e / s).to(x.dtype)
    return y if out is None else out.copy_(y)
