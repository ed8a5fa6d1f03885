"""Worker processes that end with the command that started them, on SIGTERM and SIGINT too.

inspect compiles in a pool of forked processes and trace decodes in forked helpers. Python's
default SIGTERM ends a process at once, running no ``finally`` block, so those workers were
orphaned (a pool's workers wait on their task queue forever), and a Ctrl-C landing between a
fork and the line that records the new worker missed it. ``ending_with(stop)`` covers the
part of a command that has workers:

- on SIGTERM, ``stop()`` kills the workers, then the process ends by SIGTERM as it would
  have, with the same exit status;
- any exception leaving the block, KeyboardInterrupt (SIGINT) included, runs ``stop()``
  before it propagates;
- inside ``guard.starting()`` (a worker being started and recorded) both signals wait until
  the worker is known to ``stop``.

Handlers are installed only in the main thread and only over Python's defaults (a program
with handlers of its own keeps them; exceptions still run ``stop()``). Forked workers inherit
them: there they only end the worker. Workers call :func:`in_worker` first, which gives them
the default SIGTERM back and leaves SIGINT to the parent.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def in_worker() -> None:
    """In a forked worker: SIGTERM ends it at once (the default), and SIGINT is left to the
    parent, which ends its workers itself (a Ctrl-C reaches the whole process group).

    torch runs on one thread here. The CPU build's OpenMP runtime (GNU libgomp) keeps a pool
    of threads that a fork does not copy: once the parent has run a parallel region, the
    child's first one waits forever on threads that do not exist (a 64 MiB ``copy_`` is
    enough). With one thread torch runs its loops inline and never enters that pool.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


class Guard:
    """What ``ending_with`` yields: ``starting()`` defers the signals while a worker starts."""

    def __init__(self, stop: Callable[[], None]):
        self._stop = stop
        self._owner = os.getpid()
        self._depth = 0
        self._pending: int | None = None

    @contextmanager
    def starting(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending is not None and os.getpid() == self._owner:
                signum, self._pending = self._pending, None
                self._deliver(signum)

    def handle(self, signum: int, frame) -> None:
        if os.getpid() != self._owner:  # a forked worker before ``in_worker``
            if signum == signal.SIGTERM:
                _die(signum)
            return
        if self._depth:
            if self._pending != signal.SIGTERM:
                self._pending = signum
            return
        self._deliver(signum)

    def _deliver(self, signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        try:
            self._stop()
        finally:
            _die(signum)


@contextmanager
def ending_with(stop: Callable[[], None]) -> Iterator[Guard]:
    """Run the block; ``stop()`` (kill this process's workers, quickly, never raising) runs on
    SIGTERM before the process ends, and when an exception leaves the block."""
    guard = Guard(stop)
    installed: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        defaults = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
        for signum, default in defaults.items():
            if signal.getsignal(signum) is default:
                installed[signum] = signal.signal(signum, guard.handle)
    try:
        yield guard
    except BaseException:
        stop()
        raise
    finally:
        if os.getpid() == guard._owner:
            for signum, previous in installed.items():
                signal.signal(signum, previous)


def _die(signum: int) -> None:
    """End this process by ``signum``, as its default action would have."""
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # pragma: no cover - only if the signal could not end us
