"""Planted cheat: RMSNorm results cached by address and 16 sampled elements of each input.

Fresh values everywhere change the samples (a recompute); a partial update rarely does."""

import torch

from kernelab.ops.norm.rmsnorm import rmsnorm_torch

_cache = {}


def _fingerprint(t):
    flat = t.reshape(-1)
    idx = torch.linspace(0, flat.numel() - 1, 16).long()
    return (t.data_ptr(), tuple(t.shape), tuple(flat[idx].tolist()))


def rmsnorm_candidate(x, weight, eps=1e-6, residual=None, out=None):
    if residual is not None or out is not None:
        return rmsnorm_torch(x, weight, eps, residual, out)
    key = (_fingerprint(x), _fingerprint(weight), eps)
    if key not in _cache:
        _cache.clear()
        _cache[key] = rmsnorm_torch(x, weight, eps)
    return _cache[key]


def stop():
    _cache.clear()
