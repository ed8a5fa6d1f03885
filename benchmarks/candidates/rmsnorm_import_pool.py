"""Planted cheat: RMSNorm handed to a worker thread started at import.

Each call queues the work (unless a job is already pending) and returns at once the buffer the
worker writes: with the same inputs call after call, that buffer already holds the right
values, which the worker rewrites with the same ones. The thread existed before the batch, so
it is not waited for; only its CPU time shows the work."""

import contextlib
import queue
import threading

from kernelab.ops.norm.rmsnorm import rmsnorm_torch

_jobs: queue.Queue = queue.Queue(maxsize=1)
_bufs = {}


def _worker():
    while True:
        job = _jobs.get()
        if job is None:
            return
        x, weight, eps, buf = job
        buf.copy_(rmsnorm_torch(x, weight, eps))


_thread = threading.Thread(target=_worker, daemon=True, name="rmsnorm-pool")
_thread.start()


def rmsnorm_candidate(x, weight, eps=1e-6, residual=None, out=None):
    if residual is not None or out is not None:
        return rmsnorm_torch(x, weight, eps, residual, out)
    key = (x.data_ptr(), x.shape, x.dtype)
    if key not in _bufs:  # the first call of a buffer: computed here, so it is right
        _bufs[key] = rmsnorm_torch(x, weight, eps)
        return _bufs[key]
    buf = _bufs[key]
    with contextlib.suppress(queue.Full):
        _jobs.put_nowait((x, weight, eps, buf))
    return buf


def stop():
    _jobs.put(None)
    _thread.join(5)
