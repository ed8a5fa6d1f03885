"""Planted candidates right on small inputs and wrong above a size, and honest rewrites.

On CPU verify caps batch sizes (4 rows for representative shapes, 32 for edge ones); each
flawed candidate here is right below its threshold, so only a case at full size can catch
it, and the honest ones (written differently from the reference) must pass there too.

    kernelab verify --candidate benchmarks/candidates/above_a_size.py:rmsnorm_zero_above_1000 \\
        --op rmsnorm

Flawed (rows counted along the op's batch dimension):

- ``rmsnorm_zero_above_{33,1000,3000}``: rows from the threshold on are zeros.
- ``silu_and_mul_stale_above_{100,4000}``: rows from the threshold on are the gate alone
  (the multiplication by ``up`` skipped).
- ``gemm_half_k_above_{64,1000}``: output rows from the threshold on accumulate only the
  first half of K.
- ``rmsnorm_bad_last_tile``: rows are processed in tiles of 256; past two tiles, the last
  partial tile is written unnormalised (a grid whose last program mishandles its mask).
- ``silu_and_mul_bad_last_tile``: tiles of 64 rows, past two tiles the last partial one
  holds the gate times zero.
- ``gemm_bad_last_column_tile``: tiles of 128 columns, past two tiles the last partial
  column tile is dropped (zeros).

Honest: ``rmsnorm_chunked``, ``silu_and_mul_chunked``, ``gemm_chunked`` process rows in
chunks with their own arithmetic, in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _emit(y, out):
    if out is None:
        return y
    out.copy_(y)
    return out


def _rms(h, weight, eps):
    hf = h.float()
    return hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def _rmsnorm_with(damage):
    def candidate(x, weight, eps=1e-6, residual=None, out=None):
        h = x
        if residual is not None:
            residual.add_(x)
            h = residual
        y = _rms(h, weight, eps)
        damage(y, h)
        return _emit(y.to(x.dtype), out)

    return candidate


def _zero_rows_from(threshold):
    def damage(y, h):
        y[threshold:] = 0

    return damage


rmsnorm_zero_above_33 = _rmsnorm_with(_zero_rows_from(33))
rmsnorm_zero_above_1000 = _rmsnorm_with(_zero_rows_from(1000))
rmsnorm_zero_above_3000 = _rmsnorm_with(_zero_rows_from(3000))


def _last_partial(n, tile):
    """The first row of the last partial tile of ``n`` rows when the grid has more than two
    tiles and the last is partial, else None."""
    if n > 2 * tile and n % tile:
        return n - n % tile
    return None


def _bad_last_tile(y, h):
    start = _last_partial(y.shape[0], 256)
    if start is not None:
        y[start:] = h[start:].float()


rmsnorm_bad_last_tile = _rmsnorm_with(_bad_last_tile)


def _silu_with(damage):
    def candidate(x, out=None):
        d = x.shape[-1] // 2
        g, u = x[..., :d], x[..., d:]
        y = F.silu(g.float()) * u.float()
        damage(y, g)
        return _emit(y.to(x.dtype), out)

    return candidate


def _gate_only_from(threshold):
    def damage(y, g):
        y[threshold:] = F.silu(g[threshold:].float())

    return damage


def _silu_last_tile(y, g):
    start = _last_partial(y.shape[0], 64)
    if start is not None:
        y[start:] = 0 * y[start:]


silu_and_mul_stale_above_100 = _silu_with(_gate_only_from(100))
silu_and_mul_stale_above_4000 = _silu_with(_gate_only_from(4000))
silu_and_mul_bad_last_tile = _silu_with(_silu_last_tile)


def _gemm_with(damage):
    def candidate(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
        bk = b if b_layout == "kn" else b.t()
        c = a.float() @ bk.float()
        damage(c, a, bk)
        if bias is not None:
            c = c + bias.float()
        if activation == "silu":
            c = F.silu(c)
        elif activation == "gelu":
            c = F.gelu(c)
        if residual is not None:
            c = c + residual.float()
        return _emit(c.to(a.dtype), out)

    return candidate


def _half_k_from(threshold):
    def damage(c, a, bk):
        half = a.shape[1] // 2
        if a.shape[0] > threshold and half:
            c[threshold:] = a[threshold:, :half].float() @ bk[:half].float()

    return damage


def _drop_last_column_tile(c, a, bk):
    start = _last_partial(c.shape[1], 128)
    if start is not None:
        c[:, start:] = 0


gemm_half_k_above_64 = _gemm_with(_half_k_from(64))
gemm_half_k_above_1000 = _gemm_with(_half_k_from(1000))
gemm_bad_last_column_tile = _gemm_with(_drop_last_column_tile)

# --- honest rewrites ---------------------------------------------------------------------

CHUNK = 300


def rmsnorm_chunked(x, weight, eps=1e-6, residual=None, out=None):
    h = x
    if residual is not None:
        residual.add_(x)
        h = residual
    y = torch.empty(h.shape, dtype=x.dtype, device=x.device)
    w = weight.float()
    for i in range(0, h.shape[0], CHUNK):
        part = h[i : i + CHUNK].float()
        inv = (part * part).sum(-1, keepdim=True).div_(part.shape[-1]).add_(eps).rsqrt_()
        y[i : i + CHUNK] = (part * inv * w).to(x.dtype)
    return _emit(y, out)


def silu_and_mul_chunked(x, out=None):
    d = x.shape[-1] // 2
    y = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    for i in range(0, x.shape[0], CHUNK):
        g, u = x[i : i + CHUNK, :d].float(), x[i : i + CHUNK, d:].float()
        y[i : i + CHUNK] = (g / (1 + torch.exp(-g)) * u).to(x.dtype)
    return _emit(y, out)


def gemm_chunked(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    bk = (b if b_layout == "kn" else b.t()).float()
    c = torch.empty((a.shape[0], bk.shape[1]), dtype=a.dtype, device=a.device)
    for i in range(0, a.shape[0], CHUNK):
        part = a[i : i + CHUNK].float() @ bk
        if bias is not None:
            part += bias.float()
        if activation == "silu":
            part = part * torch.sigmoid(part)
        elif activation == "gelu":
            part = F.gelu(part)
        if residual is not None:
            part += residual[i : i + CHUNK].float()
        c[i : i + CHUNK] = part.to(a.dtype)
    return _emit(c, out)
