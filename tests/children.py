"""Start a kernelab command, wait for its worker processes, signal it, and check that none of
its workers outlives it (Linux: read from /proc, no psutil needed)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def children(pid: int) -> set[int]:
    """The live child processes of ``pid``."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out |= {int(c) for c in (task / "children").read_text().split()}
    return {c for c in out if alive(c)}


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _is_python(pid: int) -> bool:
    try:
        return "python" in Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return False


#: Run the rest of the command line with SIGINT and SIGTERM as an interactive shell gives them
#: (default, unblocked), then exec it in place (same pid). A runner started in the background
#: of a non-interactive shell (``cmd &``) has SIGINT ignored, and an ignored signal is
#: inherited: the command under test would then rightly ignore the Ctrl-C it is sent.
_AS_FROM_A_SHELL = (
    "import os, signal, sys; "
    "[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)]; "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM}); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def signal_when_workers_run(
    args: list[str], env: dict, sig: int, workers: int = 2, timeout: float = 180.0
) -> tuple[set[int], subprocess.Popen]:
    """Run ``python -m kernelab *args``; once ``workers`` Python children run, send ``sig``
    to it alone (not to its process group). Returns the workers seen and the process, which
    has ended."""
    env = {**os.environ, "PYTHONPATH": SRC, **env}
    proc = subprocess.Popen(
        [sys.executable, "-c", _AS_FROM_A_SHELL, "-m", "kernelab", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            now = {c for c in children(proc.pid) if _is_python(c)}
            if len(now) >= workers:
                seen = now
                break
            time.sleep(0.02)
        assert seen, f"no {workers} workers within {timeout} s: {proc.communicate()[1][-2000:]}"
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:  # the test failed: leave nothing behind
            for c in children(proc.pid):
                os.kill(c, 9)
            proc.kill()
            proc.wait()
    return seen, proc


def outliving(pids: set[int], grace: float = 5.0) -> set[int]:
    """The processes of ``pids`` still running after ``grace`` seconds (then killed)."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    left = {p for p in pids if alive(p)}
    for p in left:
        with contextlib.suppress(OSError):
            os.kill(p, 9)
    return left
