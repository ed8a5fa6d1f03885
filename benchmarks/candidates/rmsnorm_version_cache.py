"""Planted cheat: RMSNorm results cached by address and version counter.

A write through ``copy_`` bumps ``_version``, so bench's fresh-input checks see a recompute;
a write through ``.data`` does not, and the stale result comes back."""

from kernelab.ops.norm.rmsnorm import rmsnorm_torch

_cache = {}


def rmsnorm_candidate(x, weight, eps=1e-6, residual=None, out=None):
    if residual is not None or out is not None:
        return rmsnorm_torch(x, weight, eps, residual, out)
    key = (x.data_ptr(), x._version, weight.data_ptr(), weight._version, x.shape, eps)
    if key not in _cache:
        _cache[key] = rmsnorm_torch(x, weight, eps)
    return _cache[key]


def stop():
    _cache.clear()
