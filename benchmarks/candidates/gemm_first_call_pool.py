"""Planted cheat: GEMM handed to a thread pool created on the first call.

As with a pool from import, calls return a buffer a pool thread keeps rewriting with the same
values; the pool's threads exist before every batch but the first, so they are not waited
for."""

from concurrent.futures import ThreadPoolExecutor

from kernelab.ops.matmul.gemm import gemm_torch

_pool = None
_pending = None
_bufs = {}


def gemm_candidate(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    global _pool, _pending
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1)
    args = (a, b, bias, residual, activation, b_layout)
    key = (a.data_ptr(), b.data_ptr(), a.shape, b.shape, activation, b_layout)
    if out is not None or key not in _bufs:
        _bufs[key] = gemm_torch(*args, out=out)
        return _bufs[key]
    buf = _bufs[key]
    if _pending is None or _pending.done():
        _pending = _pool.submit(lambda: buf.copy_(gemm_torch(*args)))
    return buf


def stop():
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None
