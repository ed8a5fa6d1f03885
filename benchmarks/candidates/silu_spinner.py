"""Planted cheat: SiLU-and-mul that starts, on its first call, a thread that polls a queue
in a busy loop (a "low-latency" worker that never sleeps). Its results are its own and right;
whatever is timed beside it runs on a machine with one core fewer."""

import queue
import threading

from kernelab.ops.activation.silu_and_mul import silu_and_mul_torch

_jobs: queue.Queue = queue.Queue()
_stop = threading.Event()
_thread = None


def _poll():
    while not _stop.is_set():
        try:
            _jobs.get_nowait()
        except queue.Empty:
            sum(range(200))  # a spin, not a sleep


def silu_and_mul_candidate(x, out=None):
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_poll, daemon=True, name="poller")
        _thread.start()
    return silu_and_mul_torch(x, out)


def stop():
    global _thread
    _stop.set()
    if _thread is not None:
        _thread.join(5)
    _thread = None
    _stop.clear()
