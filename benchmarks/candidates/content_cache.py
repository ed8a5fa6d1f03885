"""Planted cheat: results cached by a few sampled values of each input, whatever its address.

Every entry is kept, so a copy of the inputs at a new address holding values seen before is
a hit: rotating copies of one input set across addresses would be answered from the cache.
A partial update changes few elements and rarely the sampled ones."""

from kernelab.ops.activation.silu_and_mul import silu_and_mul_torch
from kernelab.ops.matmul.gemm import gemm_torch
from kernelab.ops.norm.rmsnorm import rmsnorm_torch

_cache = {}


def _sampled(t):
    if t is None:
        return None
    flat = t.reshape(-1)
    return (tuple(t.shape), tuple(flat[:: max(1, flat.numel() // 12)][:12].tolist()))


def rmsnorm_candidate(x, weight, eps=1e-6, residual=None, out=None):
    if residual is not None or out is not None:
        return rmsnorm_torch(x, weight, eps, residual, out)
    key = ("rmsnorm", _sampled(x), _sampled(weight), eps)
    if key not in _cache:
        _cache[key] = rmsnorm_torch(x, weight, eps)
    return _cache[key]


def gemm_candidate(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    if out is not None:
        return gemm_torch(a, b, bias, residual, activation, b_layout, out)
    key = ("gemm", *(_sampled(t) for t in (a, b, bias, residual)), activation, b_layout)
    if key not in _cache:
        _cache[key] = gemm_torch(a, b, bias, residual, activation, b_layout)
    return _cache[key]


def silu_and_mul_candidate(x, out=None):
    if out is not None:
        return silu_and_mul_torch(x, out=out)
    key = ("silu", _sampled(x))
    if key not in _cache:
        _cache[key] = silu_and_mul_torch(x)
    return _cache[key]


def stop():
    _cache.clear()
