"""Sweeps in the ledger: a sweep's row, its tasks' outcomes, and exactly-once results.

A task is identified by its key (a hash of op, variant, shape, dtype, config, target, kernel
source hash and versions: :mod:`kernelab.sweep.tasks`). :func:`record_task` stores a finished
task's run and its ``sweep_tasks`` row in one transaction, and only when no result for that key
is stored yet: the row is claimed first (``INSERT ... ON CONFLICT DO UPDATE ... WHERE status
<> 'done'``), and when that changes no row the transaction ends without the run. Two sweeps
that finish the same task at the same time therefore store it once (SQLite serialises the
writers; PostgreSQL makes the second insert wait for the first and then see its row).
A failure is recorded the same way and never replaces a stored result.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

import orjson

from kernelab.ledger._base import LedgerError, now_iso
from kernelab.ledger.store import Ledger, _dumps, insert_run

#: The fields of a task row, in the order of the table's columns after ``key``.
TASK_FIELDS = ("kind", "op", "variant", "shape_key", "dtype", "config", "target")
_TASK_COLS = "key, sweep_id, " + ", ".join(TASK_FIELDS) + ", status, attempts, reason, run_id"

_CLAIM = (
    f"INSERT INTO sweep_tasks ({_TASK_COLS}, updated) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET sweep_id = excluded.sweep_id, status = excluded.status, "
    "attempts = excluded.attempts, reason = excluded.reason, run_id = excluded.run_id, "
    "updated = excluded.updated WHERE sweep_tasks.status <> 'done'"
)


def _needs_sweeps(db: Ledger) -> None:
    if db.version is not None and db.version < 2:
        raise LedgerError(
            f"ledger {db.location}: schema version {db.version} has no sweeps (open it for "
            "writing once, e.g. with `kernelab sweep`, to migrate it)"
        )


def _task_values(task: Mapping) -> tuple:
    where = "task"
    key = task.get("key")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.key: expected a non-empty string, got {key!r}")
    out = [key]
    for name in TASK_FIELDS:
        v = task.get(name)
        if not isinstance(v, str):
            raise ValueError(f"{where}.{name}: expected a string, got {v!r}")
        out.append(v)
    return tuple(out)


def start_sweep(db: Ledger, sweep_id: str, spec: Mapping, provenance: Mapping) -> bool:
    """Store the sweep's row unless it exists (a re-run of the same spec); True when new."""
    _needs_sweeps(db)
    if not isinstance(sweep_id, str) or not sweep_id:
        raise ValueError(f"sweep_id: expected a non-empty string, got {sweep_id!r}")
    spec_json, prov_json = _dumps(dict(spec), "spec"), _dumps(dict(provenance), "provenance")

    def write(conn) -> bool:
        cur = conn.execute(
            "INSERT INTO sweeps (id, created, spec, provenance) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING",
            (sweep_id, now_iso(), spec_json, prov_json),
        )
        return cur.rowcount == 1

    return db._db.write(write)


def done_keys(db: Ledger, keys: Iterable[str] | None = None) -> set[str]:
    """The keys among ``keys`` (all when None) whose result is stored."""
    if db.version is not None and db.version < 2:
        return set()
    rows = db._db.query("SELECT key FROM sweep_tasks WHERE status = 'done'")
    found = {r[0] for r in rows}
    return found if keys is None else found & set(keys)


def record_task(
    db: Ledger,
    sweep_id: str,
    task: Mapping,
    kind: str,
    cases: Iterable[Mapping],
    provenance: Mapping,
    attempts: int = 1,
) -> str | None:
    """Store a finished task's run (``kind``, ``cases``, ``provenance``, as
    :meth:`Ledger.record_run`) and mark its key done; None, and nothing stored, when a result
    for the key is already there. Returns the run's id."""
    _needs_sweeps(db)
    values = _task_values(task)
    if not isinstance(provenance, Mapping):
        raise TypeError(f"provenance: expected a dict, got {type(provenance).__name__}")
    run_id = uuid.uuid4().hex[:12]

    def write(conn) -> str | None:
        cur = conn.execute(
            _CLAIM,
            (values[0], sweep_id, *values[1:], "done", attempts, None, run_id, now_iso()),
        )
        if cur.rowcount != 1:
            return None  # stored already (by this sweep's earlier run, or another sweep)
        insert_run(conn, run_id, kind, cases, provenance, None, sweep_id)
        return run_id

    return db._db.write(write)


def record_failure(db: Ledger, sweep_id: str, task: Mapping, reason: str, attempts: int) -> bool:
    """Mark a task failed with ``reason`` (never over a stored result); True when recorded."""
    _needs_sweeps(db)
    values = _task_values(task)
    if not isinstance(reason, str) or not reason:
        raise ValueError(f"reason: expected a non-empty string, got {reason!r}")

    def write(conn) -> bool:
        cur = conn.execute(
            _CLAIM,
            (values[0], sweep_id, *values[1:], "failed", attempts, reason[:2000], None, now_iso()),
        )
        return cur.rowcount == 1

    return db._db.write(write)


def list_sweeps(db: Ledger, limit: int | None = 50) -> list[dict]:
    """Sweeps, newest first, with their task counts by status."""
    if db.version is not None and db.version < 2:
        return []
    sql = (
        "SELECT s.id, s.created, s.spec, "
        "(SELECT COUNT(*) FROM sweep_tasks t WHERE t.sweep_id = s.id AND t.status = 'done'), "
        "(SELECT COUNT(*) FROM sweep_tasks t WHERE t.sweep_id = s.id AND t.status = 'failed') "
        "FROM sweeps s ORDER BY s.created DESC"
    )
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    out = []
    for sid, created, spec, n_done, n_failed in db._db.query(sql):
        out.append(
            {
                "id": sid,
                "created": created,
                "spec": orjson.loads(spec),
                "done": n_done,
                "failed": n_failed,
            }
        )
    return out


def get_sweep(db: Ledger, sweep_id: str) -> dict:
    """A sweep (an id or unique id prefix) with every task row it recorded, in key order."""
    _needs_sweeps(db)
    if not isinstance(sweep_id, str) or not sweep_id:
        raise ValueError(f"sweep: expected a sweep id, got {sweep_id!r}")
    rows = db._db.query(
        "SELECT id, created, spec, provenance FROM sweeps WHERE id = ?", (sweep_id,)
    )
    if not rows and len(sweep_id) >= 4:
        rows = db._db.query(
            "SELECT id, created, spec, provenance FROM sweeps WHERE id LIKE ?", (sweep_id + "%",)
        )
        if len(rows) > 1:
            raise ValueError(f"sweep: id prefix {sweep_id!r} is ambiguous ({len(rows)} sweeps)")
    if not rows:
        raise ValueError(
            f"sweep: no sweep {sweep_id!r} in ledger {db.location} (see `kernelab history "
            "--sweeps`)"
        )
    sid, created, spec, prov = rows[0]
    tasks = db._db.query(
        f"SELECT {_TASK_COLS}, updated FROM sweep_tasks WHERE sweep_id = ? ORDER BY key", (sid,)
    )
    names = [c.strip() for c in _TASK_COLS.split(",")] + ["updated"]
    return {
        "id": sid,
        "created": created,
        "spec": orjson.loads(spec),
        "provenance": orjson.loads(prov),
        "tasks": [dict(zip(names, r, strict=True)) for r in tasks],
    }


__all__ = [
    "done_keys",
    "get_sweep",
    "list_sweeps",
    "record_failure",
    "record_task",
    "start_sweep",
]
