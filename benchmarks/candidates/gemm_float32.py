"""An honest GEMM candidate: operands upcast to float32, one rounding at the end."""

import torch.nn.functional as F


def gemm_candidate(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    bk = b.float() if b_layout == "kn" else b.float().t()
    c = a.float() @ bk
    if bias is not None:
        c += bias.float()
    if activation == "gelu":
        c = F.gelu(c)
    elif activation == "silu":
        c = F.silu(c)
    elif activation != "none":
        raise ValueError(f"activation: unknown {activation!r}")
    if residual is not None:
        c += residual.float()
    c = c.to(a.dtype)
    return c if out is None else out.copy_(c)
