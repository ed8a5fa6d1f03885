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

The command line goes further: inside :func:`sigterm_as_interrupt` (every command) SIGTERM
means what Ctrl-C means. It raises :class:`Terminated`, a KeyboardInterrupt, in the main
thread, so what a command keeps on Ctrl-C (finished cases stored, a sweep's results) it keeps
on SIGTERM too, and the command exits 143 (128 + SIGTERM) where Ctrl-C exits 130. Inside it,
``ending_with`` stops its workers as on Ctrl-C and raises :class:`Terminated` likewise.
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread inside :func:`sigterm_as_interrupt`."""


class _Term:
    """The SIGTERM handler of :func:`sigterm_as_interrupt` (one per command)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.received = False

    def __call__(self, signum, frame) -> None:
        if os.getpid() != self.owner:  # a forked worker before ``in_worker``
            _die(signum)
        self.received = True
        raise Terminated


_TERM: _Term | None = None


def terminated() -> bool:
    """Whether the command now running was sent SIGTERM (inside :func:`sigterm_as_interrupt`)."""
    return _TERM is not None and _TERM.received


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Run the block with SIGTERM raising :class:`Terminated` (a KeyboardInterrupt) in the
    main thread; the handler before it comes back after. Only over the default handler and
    only in the main thread (elsewhere the block runs as it is)."""
    global _TERM
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    outer, _TERM = _TERM, _Term()
    previous = signal.signal(signal.SIGTERM, _TERM)
    try:
        yield
    finally:
        if os.getpid() == _TERM.owner:
            signal.signal(signal.SIGTERM, previous)
        _TERM = outer


class Guard:
    """What ``ending_with`` yields: ``starting()`` defers the signals while a worker starts."""

    def __init__(self, stop: Callable[[], None], term_raises: bool = False):
        self._stop = stop
        self._owner = os.getpid()
        self._depth = 0
        self._pending: int | None = None
        #: SIGTERM raises Terminated (inside ``sigterm_as_interrupt``) instead of ending us
        self._term_raises = term_raises

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
        if self._term_raises and _TERM is not None:  # ``ending_with`` runs ``stop()``
            _TERM.received = True
            raise Terminated
        try:
            self._stop()
        finally:
            _die(signum)


@contextmanager
def ending_with(stop: Callable[[], None]) -> Iterator[Guard]:
    """Run the block; ``stop()`` (kill this process's workers, quickly, never raising) runs on
    SIGTERM before the process ends, and when an exception leaves the block."""
    term_raises = _TERM is not None and signal.getsignal(signal.SIGTERM) is _TERM
    guard = Guard(stop, term_raises)
    installed: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        defaults = {
            signal.SIGTERM: _TERM if term_raises else signal.SIG_DFL,
            signal.SIGINT: signal.default_int_handler,
        }
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
