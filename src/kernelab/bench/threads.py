"""CPU time of every thread and child process around the timed loop: work handed to a thread
that already existed, and load left running between calls.

Only threads created during a batch are waited for by the integrity checks; a pool created at
import or on the first call finishes its work after the clock stops, and a thread left
spinning between calls slows whatever is timed next (the interleaved baseline). Both show as
CPU time on a thread other than the timing thread. :class:`Watch` reads each thread's CPU
time (``/proc/self/task/*/schedstat``, nanoseconds) and each live child process's at the
start of every batch and charges the difference to the subject whose batch (and the
bookkeeping after it, its checks included) ran in between. torch's own intra-op workers are
found first by :func:`torch_workers` and left out: they run only inside a parallel region
started by the timing thread itself.

Verdicts (:func:`verdicts`), per subject, from the threads that are neither the timing
thread nor torch's workers:

- *work on another thread*: their CPU time in the subject's windows exceeds
  ``ALARM_ABS_S + ALARM_FRAC`` × the subject's timed time (its samples × calls per sample),
  counting each thread whose rate there (CPU seconds per second of window) is more than
  ``ATTRIBUTE_FACTOR`` times its rate in the other subjects' windows;
- *background load*: a thread busy at ``LOAD_RATE`` of a core or more during the other
  subjects' windows: those subjects are *slowed by background load*, and the subject that
  started the thread (in its first call, warm-up or batches; a thread from before the first
  call is a candidate's, from its import) is flagged for *background load* it left running.

Without ``/proc`` (not Linux) nothing is read and no verdict is given.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import torch

ALARM_ABS_S = 0.002
ALARM_FRAC = 0.05
ATTRIBUTE_FACTOR = 2.0
LOAD_RATE = 0.05
PROBE_S = 0.02
WORKER_FACTOR = 3.0
PROBE_TRIES = 3


def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode()
    except OSError:
        return None
    finally:
        os.close(fd)


def _tasks(pid: str) -> tuple[dict, list[str]]:
    """CPU ns per thread of process ``pid`` ("self" or a number) and its child processes."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}, []
    ns, kids = {}, []
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/schedstat")
        if text:
            ns[int(tid)] = int(text.split()[0])
        more = _read(f"/proc/{pid}/task/{tid}/children")
        if more:
            kids += more.split()
    return ns, kids


def cpu_times() -> dict | None:
    """CPU nanoseconds per thread of this process (key: tid) and per live descendant process
    (key: ("process", pid), all its threads), and of reaped children ("reaped children");
    None where ``/proc`` does not give them."""
    out, todo = _tasks("self")
    if not out:
        return None
    seen = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        ns, kids = _tasks(pid)
        out[("process", int(pid))] = sum(ns.values())
        todo += kids
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["reaped children"] = int((ru.ru_utime + ru.ru_stime) * 1e9)
    return out


def _delta(a: dict, b: dict) -> dict:
    return {k: v - a.get(k, 0) for k, v in b.items() if v - a.get(k, 0) > 0}


#: Workers found by earlier probes in this process (kept while their threads live).
_KNOWN: set = set()


def _probe_once(probe_s: float) -> set:
    a = torch.rand(256, 256)
    t0 = cpu_times()
    start = time.perf_counter()
    while time.perf_counter() - start < probe_s:
        a = (a @ a).clamp_(0, 1)  # a BLAS call and an elementwise op, both parallel
    wall = time.perf_counter() - start
    t1 = cpu_times()
    time.sleep(probe_s / 2)  # workers spin a little after a parallel region, then sleep
    t2 = cpu_times()
    start = time.perf_counter()
    time.sleep(probe_s)
    slept = time.perf_counter() - start
    t3 = cpu_times()
    if t0 is None or t1 is None or t2 is None or t3 is None:
        return set()
    busy, idle = _delta(t0, t1), _delta(t2, t3)
    me = threading.get_native_id()
    return {
        k
        for k, ns in busy.items()
        if isinstance(k, int)
        and k != me
        and ns > 0.05 * wall * 1e9
        and ns / wall > WORKER_FACTOR * idle.get(k, 0) / slept
    }


def torch_workers(probe_s: float = PROBE_S, tries: int = PROBE_TRIES) -> set:
    """The threads that run torch's intra-op parallel regions for this thread: busy while this
    thread runs parallel ops, at least ``WORKER_FACTOR`` times busier than while it sleeps (a
    thread about as busy in both is not a worker, however loaded the machine). Probed until
    ``torch.get_num_threads() - 1`` are found (at most ``tries`` times: on a loaded machine a
    worker may still spin when the idle phase starts), with those of earlier probes."""
    now = cpu_times()
    if now is None or torch.get_num_threads() <= 1:
        return set()
    found = {k for k in _KNOWN if k in now}
    for _ in range(tries):
        if len(found) >= torch.get_num_threads() - 1:
            break
        found |= _probe_once(probe_s)
    _KNOWN.clear()
    _KNOWN.update(found)
    return found


def _who(key) -> str:
    if isinstance(key, int):
        try:
            name = Path(f"/proc/self/task/{key}/comm").read_text().strip()
        except OSError:
            name = "?"
        return f"thread {key} ({name})"
    if isinstance(key, tuple):
        return f"child process {key[1]}"
    return str(key)


class Watch:
    """CPU time per thread, charged to the subject that ran in each window."""

    def __init__(self, workers: set):
        self.me = threading.get_native_id()
        self.workers = set(workers)
        self.last = cpu_times()
        self.available = self.last is not None
        self.t = time.perf_counter()
        self.who = None  # (phase, run index) of the window now open
        self.owner: dict = dict.fromkeys(self.last or (), None)  # None: before any call
        self.cpu: dict = {}  # run -> {key: ns in its timed windows}
        self.wall: dict = {}  # run -> seconds of its timed windows

    def mark(self, who=None) -> None:
        """Close the open window (charging its CPU time) and open one for ``who``:
        ("warm", run) for a run's first call and warm-up, ("time", run) for its batches,
        None between them."""
        if not self.available:
            return
        now, t = cpu_times(), time.perf_counter()
        if now is None:
            return
        for k in now:
            if k not in self.owner:
                self.owner[k] = None if self.who is None else self.who[1]
        if self.who is not None and self.who[0] == "time":
            i = self.who[1]
            acc = self.cpu.setdefault(i, {})
            for k, ns in _delta(self.last, now).items():
                acc[k] = acc.get(k, 0) + ns
            self.wall[i] = self.wall.get(i, 0.0) + (t - self.t)
        self.last, self.t, self.who = now, t, who

    def others(self, acc: dict) -> dict:
        return {k: ns for k, ns in acc.items() if k != self.me and k not in self.workers}

    def summary(self, i) -> dict:
        """Seconds of CPU in run ``i``'s windows: timing thread, torch workers, the rest."""
        acc = self.cpu.get(i, {})
        return {
            "window_s": self.wall.get(i, 0.0),
            "timing_thread_cpu_s": acc.get(self.me, 0) * 1e-9,
            "torch_workers_cpu_s": sum(acc.get(k, 0) for k in self.workers) * 1e-9,
            "other_cpu_s": sum(self.others(acc).values()) * 1e-9,
        }


def verdicts(watch: Watch, timed: dict, candidates: set) -> dict:
    """Flags per run (see the module docstring); ``timed``: seconds on the clock per run;
    ``candidates``: the runs of users' candidates, to which a busy thread from before the
    first call is charged."""
    flags: dict = {i: [] for i in watch.cpu}
    if not watch.available:
        return flags
    runs = list(watch.cpu)
    for i in runs:
        mine = watch.others(watch.cpu[i])
        wall = max(watch.wall.get(i, 0.0), 1e-9)
        main = watch.cpu[i].get(watch.me, 0) * 1e-9
        rest = [j for j in runs if j != i]
        rest_wall = sum(watch.wall.get(j, 0.0) for j in rest)
        attributed = 0.0
        worst = None
        for k, ns in mine.items():
            theirs = sum(watch.cpu[j].get(k, 0) for j in rest) * 1e-9
            rate_other = theirs / rest_wall if rest_wall > 0 else 0.0
            rate = ns * 1e-9 / wall
            if rate > ATTRIBUTE_FACTOR * rate_other:
                attributed += ns * 1e-9
                if worst is None or ns > mine[worst]:
                    worst = k
        clock = timed.get(i, 0.0)
        if attributed > ALARM_ABS_S + ALARM_FRAC * clock:
            flags[i].append(
                f"work on another thread: {attributed * 1e3:.1f} ms of CPU on other threads "
                f"around its batches ({clock * 1e3:.1f} ms on the clock, timing thread "
                f"{main * 1e3:.1f} ms of CPU; most on {_who(worst)})"
            )
    for i in runs:  # load seen in run i's windows, from a thread whose rate stays high
        wall = max(watch.wall.get(i, 0.0), 1e-9)
        for k, ns in watch.others(watch.cpu[i]).items():
            rate = ns * 1e-9 / wall
            owner = watch.owner.get(k)
            owners = [owner] if owner is not None else list(candidates)
            if rate < LOAD_RATE or ns * 1e-9 < ALARM_ABS_S or i in owners:
                continue
            flags[i].append(
                f"slowed by background load: {_who(k)} ran {ns * 1e-6:.1f} ms "
                f"({rate * 100:.0f}% of a core) during its timed batches"
            )
            for o in owners:
                if o in flags and not any(f.startswith("background load") for f in flags[o]):
                    whence = "it started" if owner is not None else "from before the first call"
                    flags[o].append(
                        f"background load: {_who(k)} ({whence}) kept {rate * 100:.0f}% of a "
                        "core busy while another subject was timed"
                    )
    return flags
