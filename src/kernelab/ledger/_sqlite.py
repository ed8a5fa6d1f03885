"""The embedded SQLite backend: opening, schema checks, transactions that survive contention.

Concurrency: the database runs in WAL mode (readers never block the writer), every
connection waits up to ``BUSY_TIMEOUT_S`` for a lock, and a write transaction starts with
``BEGIN IMMEDIATE`` (the write lock is taken up front, so two writers never deadlock on a
lock upgrade); if the lock still cannot be had, the start is retried with jittered back-off
until ``RETRY_FOR_S`` has passed. A write either commits whole or leaves nothing behind.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelab.ledger._base import LedgerError, check_version, now_iso
from kernelab.ledger.schema import APP, DDL, SCHEMA_VERSION

__all__ = ["LedgerError", "SQLiteBackend", "now_iso"]

BUSY_TIMEOUT_S = 30.0
RETRY_FOR_S = 120.0
_MAGIC = b"SQLite format 3\x00"


def _busy(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


class SQLiteBackend:
    """One connection to one SQLite ledger file (or ``:memory:``)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.location = self.path
        if self.path != ":memory:":
            self._check_file(Path(self.path))
        try:
            self.conn = sqlite3.connect(
                self.path,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path}: cannot open ({exc})") from None
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self.conn.execute("PRAGMA foreign_keys = ON")
            known = self._retry(self._check_version)  # before anything writes to the file
            self._retry(self._set_wal)
            if not known:
                self._create_schema()
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise self._error(exc) from None
        except LedgerError:
            self.conn.close()
            raise

    # -- opening ---------------------------------------------------------------------------

    def _check_file(self, p: Path) -> None:
        if p.is_dir():
            raise LedgerError(f"ledger {p}: is a directory, expected an SQLite file")
        if p.exists():
            with p.open("rb") as f:
                head = f.read(len(_MAGIC))
            if head and head != _MAGIC:
                raise LedgerError(
                    f"ledger {p}: not an SQLite database (foreign or corrupt file); "
                    "refusing to use or overwrite it"
                )
        else:
            p.parent.mkdir(parents=True, exist_ok=True)

    def _set_wal(self) -> None:
        if self.path == ":memory:":
            return
        mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LedgerError(f"ledger {self.path}: could not switch to WAL mode (got {mode})")
        self.conn.execute("PRAGMA synchronous = NORMAL")

    def _check_version(self) -> bool:
        """True when the file already holds a usable kernelab schema."""
        rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        tables = {r[0] for r in rows}
        found = None
        if "schema_version" in tables:
            found = self.conn.execute("SELECT app, version FROM schema_version").fetchall()
        return check_version(self.path, tables, found)

    def _create_schema(self) -> None:
        def create(conn: sqlite3.Connection) -> None:
            if self._check_version():  # another process created it meanwhile
                return
            for stmt in DDL:
                conn.execute(stmt)
            conn.execute(
                "INSERT INTO schema_version (app, version, created) VALUES (?, ?, ?)",
                (APP, SCHEMA_VERSION, now_iso()),
            )

        self.write(create)

    # -- errors and retries ----------------------------------------------------------------

    def _error(self, exc: sqlite3.Error) -> LedgerError:
        msg = str(exc)
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(
            exc, sqlite3.OperationalError | sqlite3.IntegrityError
        ):
            return LedgerError(f"ledger {self.path}: corrupt or not a ledger ({msg})")
        if "malformed" in msg or "not a database" in msg:
            return LedgerError(f"ledger {self.path}: corrupt or not a ledger ({msg})")
        return LedgerError(f"ledger {self.path}: {msg}")

    def _retry(self, fn: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + RETRY_FOR_S
        delay = 0.01
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)

    # -- the two primitives the store uses -------------------------------------------------

    def write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(conn)`` in one write transaction; roll back on any exception."""
        conn = self.conn
        try:
            self._retry(lambda: conn.execute("BEGIN IMMEDIATE"))
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            result = fn(conn)
            self._retry(lambda: conn.execute("COMMIT"))
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from None
            raise
        return result

    def query(self, sql: str, params: dict | tuple = ()) -> list[tuple]:
        try:
            return self._retry(lambda: self.conn.execute(sql, params).fetchall())
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def check(self) -> str:
        """SQLite's integrity check: "ok" or the problems found."""
        return "; ".join(str(r[0]) for r in self.query("PRAGMA integrity_check"))

    def close(self) -> None:
        self.conn.close()
