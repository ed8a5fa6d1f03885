"""Planted cheat: a GEMM that leaves a thread spinning from its return to its next call.

The spinner pauses while the candidate computes, so the candidate's own batches run alone;
every batch timed after its calls (the baseline's) shares the machine with it. The thread is
created at import."""

import threading

import torch

from kernelab.ops.matmul.gemm import gemm_torch

_run = threading.Event()
_quit = threading.Event()


def _spin():
    buf = torch.rand(1 << 16)
    while not _quit.is_set():
        if not _run.wait(0.05):
            continue
        buf.mul_(0.5).add_(0.5)


_thread = threading.Thread(target=_spin, daemon=True, name="between-calls")
_thread.start()


def gemm_candidate(a, b, bias=None, residual=None, activation="none", b_layout="kn", out=None):
    _run.clear()
    c = gemm_torch(a, b, bias, residual, activation, b_layout, out)
    _run.set()
    return c


def stop():
    _run.clear()
    _quit.set()
    _thread.join(5)
