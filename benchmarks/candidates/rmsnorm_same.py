"""An honest RMSNorm candidate, written differently from the reference (float32 math)."""

import torch


def rmsnorm_candidate(x, weight, eps=1e-6, residual=None, out=None):
    h = x
    if residual is not None:  # the fused form: the residual stream is updated in place
        residual.add_(x)
        h = residual
    xf = h.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = (y * weight.float()).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y
