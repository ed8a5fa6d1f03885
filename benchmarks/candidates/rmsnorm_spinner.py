"""Planted cheat: RMSNorm whose first call starts a thread that keeps a core busy.

Its own results are right and honestly timed; the baseline, timed in between, runs on a
machine with one core fewer."""

import threading

import torch

from kernelab.ops.norm.rmsnorm import rmsnorm_torch

_stop = threading.Event()
_thread = None


def _spin():
    buf = torch.rand(1 << 16)
    while not _stop.is_set():
        buf.mul_(0.5).add_(0.5)  # torch releases the GIL: a busy core, not a held lock


def rmsnorm_candidate(x, weight, eps=1e-6, residual=None, out=None):
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_spin, daemon=True, name="spinner")
        _thread.start()
    return rmsnorm_torch(x, weight, eps, residual, out)


def stop():
    global _thread
    _stop.set()
    if _thread is not None:
        _thread.join(5)
    _thread = None
    _stop.clear()
