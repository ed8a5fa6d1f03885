"""Planted cheat: GEMM results cached by the operands' addresses and version counters."""

from kernelab.ops.matmul.gemm import gemm_torch

_cache = {}


def gemm_candidate(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    args = (a, b, bias, residual)
    key = tuple((t.data_ptr(), t._version) if t is not None else None for t in args)
    key += (activation, b_layout, a.shape, b.shape)
    if out is not None or key not in _cache:
        _cache[key] = gemm_torch(a, b, bias, residual, activation, b_layout, out)
    return _cache[key]


def stop():
    _cache.clear()
