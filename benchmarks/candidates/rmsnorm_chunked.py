"""An honest RMSNorm candidate: rows in chunks, the sum of squares by a dot product."""

import torch


def rmsnorm_candidate(x, weight, eps=1e-6, residual=None, out=None):
    if residual is not None:
        residual.add_(x)
        x2 = residual
    else:
        x2 = x
    rows = x2.reshape(-1, x2.shape[-1])
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    w = weight.float()
    for start in range(0, rows.shape[0], 64):
        h = rows[start : start + 64].float()
        ms = torch.einsum("rc,rc->r", h, h).div_(h.shape[-1]).unsqueeze(-1)
        y[start : start + 64] = (h * ms.add_(eps).rsqrt_() * w).to(x.dtype)
    y = y.reshape(x.shape)
    return y if out is None else out.copy_(y)
