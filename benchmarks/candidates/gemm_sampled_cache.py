"""Planted cheat: GEMM results cached by the operands' addresses and a few sampled rows."""

from kernelab.ops.matmul.gemm import gemm_torch

_cache = {}


def _fingerprint(t):
    if t is None:
        return None
    rows = t.reshape(-1, t.shape[-1])
    picked = rows[:: max(1, rows.shape[0] // 4), :8]  # 8 elements of every quarter's first row
    return (t.data_ptr(), tuple(t.shape), tuple(picked.reshape(-1).tolist()))


def gemm_candidate(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    key = (*tuple(_fingerprint(t) for t in (a, b, bias, residual)), activation, b_layout)
    if out is not None or key not in _cache:
        _cache[key] = gemm_torch(a, b, bias, residual, activation, b_layout, out)
    return _cache[key]


def stop():
    _cache.clear()
