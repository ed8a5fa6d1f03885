"""Running a sweep: expand, skip what is stored, run the rest on an engine, store each result.

The process that runs the sweep is the only one that writes to the ledger; tasks are
independent, so the write is the only step they share. Each result is stored as it arrives
(:func:`kernelab.ledger.sweeps.record_task`: exactly once per task key), so an interrupted
sweep keeps what finished and a re-run of the same spec runs only what is missing.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from kernelab.sweep.spec import SweepSpec
from kernelab.sweep.tasks import Task, expand


@dataclass
class Progress:
    total: int = 0  # tasks of the spec
    stored: int = 0  # already in the ledger before this run: skipped
    done: int = 0
    failed: int = 0
    running: int = 0
    queued: int = 0
    retried: int = 0
    duplicates: int = 0  # finished here but stored meanwhile by another sweep: dropped
    last: str = ""


@dataclass
class SweepResult:
    id: str
    kind: str
    engine: str
    progress: Progress
    failures: list[dict] = field(default_factory=list)  # {task, reason, attempts}
    skipped: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)  # run ids stored by this run
    seconds: float = 0.0
    interrupted: bool = False
    cancelled: int = 0  # tasks running or queued when interrupted or stopped
    #: the ledger's failure that stopped the sweep (a full disk, a lost server), if any
    ledger_error: str | None = None
    #: files keeping the finished results the ledger could not store (``record_run``'s
    #: arguments, :func:`kernelab.ledger.unrecorded.write_unrecorded`)
    unrecorded: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        p = self.progress
        return {
            "sweep": self.id,
            "kind": self.kind,
            "engine": self.engine,
            "tasks": p.total,
            "already_stored": p.stored,
            "done": p.done,
            "failed": p.failed,
            "retried": p.retried,
            "duplicates_dropped": p.duplicates,
            "interrupted": self.interrupted,
            "cancelled": self.cancelled,
            "ledger_error": self.ledger_error,
            "unrecorded": self.unrecorded,
            "seconds": round(self.seconds, 2),
            "failures": self.failures,
            "skipped": self.skipped,
            "runs": self.runs,
        }


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep; ``result`` holds what was stored before it."""

    def __init__(self, result: SweepResult):
        super().__init__("sweep interrupted")
        self.result = result


def sweep_id(spec: SweepSpec) -> str:
    """The same spec always has the same id: a re-run continues the sweep (how often a task
    is tried again changes no result, so ``retries`` is not part of it)."""
    what = {k: v for k, v in spec.as_dict().items() if k != "retries"}
    text = orjson.dumps(what, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()[:12]


def run(
    spec: SweepSpec,
    db,
    engine,
    progress: Callable[[Progress], None] | None = None,
    tasks: list[Task] | None = None,
    poll_s: float = 0.2,
) -> SweepResult:
    """Run ``spec`` on ``engine`` (:mod:`kernelab.sweep.engines`), storing into the ledger
    ``db``. ``tasks``: already expanded (default: ``expand(spec)``).

    When the ledger fails (a full disk, a lost server), every result finished so far is kept
    in a file beside it (:func:`kernelab.ledger.record_or_keep`; ``result.unrecorded``), the
    rest is cancelled and the result returned with ``ledger_error`` set."""
    from kernelab import ledger
    from kernelab.ledger import sweeps

    started = time.perf_counter()
    skipped: list[str] = []
    if tasks is None:
        tasks, skipped = expand(spec)
    sid = sweep_id(spec)
    result = SweepResult(sid, spec.kind, engine.name, Progress(total=len(tasks)), skipped=skipped)
    prov = ledger.provenance("cpu", sweep={"engine": engine.name})
    try:
        sweeps.start_sweep(db, sid, spec.as_dict(), prov)
        stored = sweeps.done_keys(db, [t.key for t in tasks])
    except OSError as exc:  # a full disk before the first task: nothing to keep
        raise ledger.LedgerError(
            f"ledger {db.location}: cannot be written ({exc.strerror or exc}); sweep {sid} "
            "was not started, no task ran"
        ) from None
    p = result.progress
    p.stored = len(stored)
    by_key = {t.key: t for t in tasks}
    pending = deque(t for t in tasks if t.key not in stored)
    if len(by_key) != len(tasks):
        raise AssertionError("two tasks of one sweep share a key")  # pragma: no cover
    attempts: dict[str, int] = {}
    in_flight: set[str] = set()

    def tell(last: str = "") -> None:
        p.running, p.queued = len(in_flight), len(pending)
        if last:
            p.last = last
        if progress:
            progress(p)

    def stop(error: str) -> None:
        if result.ledger_error is None:
            result.ledger_error = error

    def store(task: Task, payload: dict) -> None:
        def write(d) -> str | None:
            return sweeps.record_task(
                d,
                sid,
                task.row(),
                payload["kind"],
                payload["cases"],
                payload["provenance"],
                attempts[task.key],
            )

        rec = ledger.record_or_keep(
            db, payload["kind"], payload["cases"], payload["provenance"], write=write
        )
        if rec.run_id is not None:
            result.runs.append(rec.run_id)
            p.done += 1
        elif rec.error is not None:  # kept in a file (or, failing that, in the message)
            if rec.path is not None:
                result.unrecorded.append(str(rec.path))
            stop(rec.error)
        else:
            p.duplicates += 1

    def fail(task: Task, reason: str) -> None:
        try:
            sweeps.record_failure(db, sid, task.row(), reason, attempts[task.key])
        except Exception as exc:  # a failure is no result: it is reported, not kept
            stop(f"error: the ledger {db.location} could not store a failure ({exc})")
        result.failures.append(
            {
                "task": task.label(),
                "key": task.key,
                "reason": reason,
                "attempts": attempts[task.key],
            }
        )
        p.failed += 1

    tell()
    try:
        while (pending or in_flight) and result.ledger_error is None:
            while pending and engine.capacity() > 0:
                task = pending.popleft()
                attempts[task.key] = attempts.get(task.key, 0) + 1
                engine.submit(task)
                in_flight.add(task.key)
            for key, status, payload in engine.poll(poll_s):
                in_flight.discard(key)
                task = by_key[key]
                if status == "ok":
                    store(task, payload)
                    tell(f"{task.label()}: {payload.get('summary', '')}")
                elif status == "died" and attempts[key] <= spec.retries:
                    p.retried += 1
                    pending.append(task)
                    tell(f"{task.label()}: {payload}; trying again")
                elif status == "died":
                    fail(task, f"{payload} (tried {attempts[key]} times)")
                    tell(f"{task.label()}: failed")
                else:
                    fail(task, str(payload))
                    tell(f"{task.label()}: failed")
            tell()
        if result.ledger_error is not None:  # stopped: what still runs is not waited for
            result.cancelled = len(in_flight) + len(pending)
            engine.cancel()
            in_flight.clear()
            pending.clear()
            tell()
    except KeyboardInterrupt:
        result.cancelled = len(in_flight) + len(pending)
        engine.cancel()
        result.interrupted = True
        result.seconds = time.perf_counter() - started
        raise SweepInterrupted(result) from None
    result.seconds = time.perf_counter() - started
    return result


__all__ = ["Progress", "SweepInterrupted", "SweepResult", "run", "sweep_id"]
