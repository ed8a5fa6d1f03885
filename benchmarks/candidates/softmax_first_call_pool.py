"""Planted cheat: softmax rows handed to a two-thread pool created on the first call.

Each call returns the buffer of its input's address, which the pool's threads rewrite (half
the rows each) with the same values as before; the call waits for nothing. The threads exist
before every batch but the first, so no check that waits for new threads sees them."""

from concurrent.futures import ThreadPoolExecutor

from kernelab.ops.logits.softmax import softmax_torch

_pool = None
_pending = []
_bufs = {}


def softmax_candidate(x, scale=1.0, mask=None, out=None):
    global _pool, _pending
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=2)
    key = (x.data_ptr(), tuple(x.shape), x.dtype, scale, None if mask is None else mask.data_ptr())
    if out is not None or key not in _bufs:
        _bufs[key] = softmax_torch(x, scale, mask, out)
        return _bufs[key]
    buf = _bufs[key]
    if all(f.done() for f in _pending):
        half = max(1, x.shape[0] // 2)

        def rows(lo, hi):
            m = None if mask is None else mask[lo:hi]
            buf[lo:hi].copy_(softmax_torch(x[lo:hi], scale, m))

        _pending = [_pool.submit(rows, 0, half), _pool.submit(rows, half, x.shape[0])]
    return buf


def stop():
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None
