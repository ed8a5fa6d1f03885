"""Planted cheat: SiLU-and-mul results cached by the input's address, shape and 32 elements
read at a fixed stride: a partial update rarely moves one of them."""

import torch

from kernelab.ops.activation.silu_and_mul import silu_and_mul_torch

_cache = {}


def silu_and_mul_candidate(x, out=None):
    flat = x.reshape(-1)
    picked = flat[torch.linspace(0, flat.numel() - 1, 32).long()]
    key = (x.data_ptr(), tuple(x.shape), x.dtype, tuple(picked.tolist()))
    if out is not None or key not in _cache:
        if out is None:
            _cache.clear()
        _cache[key] = silu_and_mul_torch(x, out)
    return _cache[key]


def stop():
    _cache.clear()
