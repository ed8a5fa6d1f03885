"""The same RMSNorm computed twice: a planted 2x slowdown with identical outputs."""

import torch


def rmsnorm_candidate(x, weight, eps=1e-6, residual=None, out=None):
    h = x
    if residual is not None:  # the fused form: the residual stream is updated in place
        residual.add_(x)
        h = residual
    xf = h.float()
    torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps).mul(xf).mul(weight.float())  # wasted
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = (y * weight.float()).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y
