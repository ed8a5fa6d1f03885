"""Where tasks run: a pool of worker processes on this machine, or Ray tasks.

An engine takes tasks (``submit``), reports outcomes (``poll``) and cancels what runs
(``cancel``). An outcome is ``(key, status, payload)``:

- ``"ok"``: the task returned; payload is :func:`kernelab.sweep.work.execute`'s result;
- ``"error"``: the task raised; payload is the exception's line (not retried: it would raise
  again);
- ``"died"``: the worker running it died (killed, out of memory, a lost node); payload says
  how. The runner tries the task again, a bounded number of times.

The local engine forks its workers (they see every op registered in this process), one
pipe each, so it knows which task each worker runs and which one a dead worker took with it.
The Ray engine submits one remote function per task with the task's resource request
(:func:`kernelab.sweep.tasks.resources`) and ``max_retries=0``: retries are the runner's, the
same for both engines.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait

from kernelab import _workers
from kernelab.sweep.tasks import Task, resources


def _error_line(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    return f"{type(exc).__name__}: {exc}"[:1000] + where


#: How often a local worker checks that the sweep that started it still runs (seconds).
PARENT_CHECK_S = 0.5


def _exit_with_parent(parent: int) -> None:
    """End this worker soon after the sweep's process does, even if killed by SIGKILL (nothing
    of it runs then): a thread checks that the parent is still ours."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="kernelab-parent-check", daemon=True).start()


def _serve(conn, run: Callable[[Task], dict], parent: int, inherited=()) -> None:
    """A local worker: run each task it is sent and send back ("ok", result) or ("error", why).

    ``inherited``: the sweep's ends of this worker's pipe and the others', copied by the fork;
    closed at once, or each worker would keep its own and the others' pipes open (none seeing
    its end-of-file when the sweep ends)."""
    for other in inherited:
        with contextlib.suppress(OSError):
            other.close()
    _workers.in_worker()
    _exit_with_parent(parent)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            out = ("ok", run(task))
        except Exception as exc:
            out = ("error", _error_line(exc))
        try:
            conn.send(out)
        except Exception as exc:  # a result that cannot be sent is an error of the task
            conn.send(("error", f"result not sendable: {_error_line(exc)}"))


class LocalEngine:
    """``jobs`` forked worker processes on this machine (no Ray needed)."""

    name = "local"

    def __init__(self, jobs: int | None = None, run: Callable[[Task], dict] | None = None):
        from kernelab.sweep import work

        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
        self.jobs = jobs or max(1, os.cpu_count() or 1)
        self._run = run or work.execute
        self._ctx = multiprocessing.get_context("fork")
        self._idle: list = []  # (process, conn)
        self._busy: dict = {}  # conn -> (process, task)
        self.died = 0

    def capacity(self) -> int:
        return self.jobs - len(self._busy)

    def _start(self):
        parent, child = self._ctx.Pipe()
        others = [parent, *(c for _, c in self._idle), *self._busy]  # the sweep's ends
        p = self._ctx.Process(
            target=_serve, args=(child, self._run, os.getpid(), others), daemon=True
        )
        p.start()
        child.close()
        return p, parent

    def submit(self, task: Task) -> None:
        if task.gpu:
            raise RuntimeError(
                f"task {task.label()}: GPU tasks need --engine ray (the local engine runs "
                "CPU tasks only)"
            )
        while self._idle and not self._idle[-1][0].is_alive():  # died after its last result
            _, dead = self._idle.pop()
            dead.close()
        p, conn = self._idle.pop() if self._idle else self._start()
        conn.send(task)
        self._busy[conn] = (p, task)

    def busy_pids(self) -> dict[int, str]:
        """Worker pid -> key of the task it runs now."""
        return {p.pid: t.key for p, t in self._busy.values()}

    def running(self) -> int:
        return len(self._busy)

    def poll(self, timeout: float) -> list[tuple[str, str, object]]:
        if not self._busy:
            return []
        by_sentinel = {p.sentinel: c for c, (p, _) in self._busy.items()}
        ready = wait([*self._busy, *by_sentinel], timeout)
        out = []
        seen = set()
        for r in ready:
            conn = by_sentinel.get(r, r)
            if conn in seen or conn not in self._busy:
                continue
            seen.add(conn)
            p, task = self._busy.pop(conn)
            try:
                status, payload = conn.recv()
            except (EOFError, OSError):
                p.join(5)
                self.died += 1
                code = p.exitcode
                how = (
                    f"killed by signal {signal.Signals(-code).name}"
                    if code is not None and code < 0
                    else f"exit code {code}"
                )
                out.append((task.key, "died", f"worker pid {p.pid} died ({how})"))
                conn.close()
                continue
            self._idle.append((p, conn))
            out.append((task.key, status, payload))
        return out

    def cancel(self) -> None:
        """Kill the workers running tasks (their tasks are lost, nothing was stored)."""
        for p, _ in self._busy.values():
            with contextlib.suppress(OSError, ValueError):
                p.kill()
        for p, _ in self._busy.values():
            with contextlib.suppress(OSError, ValueError, AssertionError):
                p.join(5)
        self._busy.clear()

    def close(self) -> None:
        self.cancel()
        for p, conn in self._idle:
            with contextlib.suppress(OSError, ValueError, BrokenPipeError):
                conn.send(None)
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        self._idle.clear()


def _ray_execute(task: Task) -> dict:
    import os

    from kernelab.sweep import work

    out = work.execute(task)
    out["pid"] = os.getpid()
    return out


def ray_options(task: Task) -> dict:
    """The options of ``task``'s Ray remote call: its resources, and no retries by Ray (the
    runner retries, counting attempts the same way for both engines)."""
    return {**resources(task), "max_retries": 0, "retry_exceptions": False}


def _workers_import_this_kernelab() -> None:
    """A local Ray's workers are new processes started by its raylet, with this process's
    environment: put the folder this kernelab is imported from first on their PYTHONPATH, so
    they run the same code (a checkout, a test run) rather than another installed copy."""
    import kernelab

    root = os.path.dirname(os.path.dirname(os.path.abspath(kernelab.__file__)))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *[p for p in paths if p]])


class RayEngine:
    """Ray tasks, on the cluster at ``address`` or on a local Ray started now with this
    machine's CPUs (``ray.init(num_cpus=os.cpu_count())``; shut down at ``close``)."""

    name = "ray"

    def __init__(self, address: str | None = None, max_in_flight: int | None = None, **init):
        try:
            import ray
        except ImportError:
            raise RuntimeError(
                "engine ray: Ray is not installed (pip install 'kernelab[ray]'), or use "
                "--engine local"
            ) from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, **init)
            else:
                init.setdefault("num_cpus", os.cpu_count() or 1)
                init.setdefault("include_dashboard", False)
                _workers_import_this_kernelab()
                ray.init(**init)
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.max_in_flight = max_in_flight or max(4, 2 * cpus)
        self._remote = ray.remote(_ray_execute)
        self._refs: dict = {}  # ObjectRef -> task
        self.pids: set[int] = set()
        self.died = 0

    def capacity(self) -> int:
        return self.max_in_flight - len(self._refs)

    def submit(self, task: Task) -> None:
        ref = self._remote.options(**ray_options(task)).remote(task)
        self._refs[ref] = task

    def running(self) -> int:
        return len(self._refs)

    def poll(self, timeout: float) -> list[tuple[str, str, object]]:
        ray = self._ray
        if not self._refs:
            return []
        ready, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=timeout)
        out = []
        for ref in ready:
            task = self._refs.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the task raised
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                out.append((task.key, "error", _error_line(cause)))
                continue
            except ray.exceptions.RayError as exc:  # its worker or node died
                self.died += 1
                head = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                out.append((task.key, "died", f"{type(exc).__name__}: {head}"[:500]))
                continue
            self.pids.add(result.pop("pid", None))
            out.append((task.key, "ok", result))
        return out

    def cancel(self) -> None:
        for ref in list(self._refs):
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self._refs.clear()

    def close(self) -> None:
        self.cancel()
        if self._started:
            self._ray.shutdown()


def make(engine: str, jobs: int | None = None, address: str | None = None):
    if engine == "local":
        if address:
            raise ValueError("address: only --engine ray takes --address")
        return LocalEngine(jobs)
    if engine == "ray":
        return RayEngine(address, max_in_flight=jobs)
    raise ValueError(f"engine: expected local or ray, got {engine!r}")


__all__ = ["LocalEngine", "RayEngine", "make", "ray_options"]
