"""The embedded SQLite backend: opening, schema checks, transactions that survive contention.

What becomes a ledger: only a path that does not exist, and only for a writer. A new ledger
is made whole under a temporary name beside it and then linked into place, so no process
ever sees it empty or half made. An existing file must already be a whole kernelab ledger:
an empty (0-byte) file, another format, an SQLite database without kernelab's tables, a
foreign or partial one are refused before anything is written to them (their bytes stay as
they are). ``readonly=True`` (what ``history``, ``compare`` and ``report`` use) never creates
a file or folder and never writes: a missing path is an error naming it.

Concurrency: the database runs in WAL mode (readers never block the writer), every
connection waits up to ``BUSY_TIMEOUT_S`` for a lock, and a write transaction starts with
``BEGIN IMMEDIATE`` (the write lock is taken up front, so two writers never deadlock on a
lock upgrade); if the lock still cannot be had, the start is retried with jittered back-off
until ``RETRY_FOR_S`` has passed. A write either commits whole or leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelab.ledger._base import LedgerError, check_version, now_iso
from kernelab.ledger.schema import APP, DDL, MIGRATIONS, SCHEMA_VERSION

__all__ = ["LedgerError", "SQLiteBackend", "now_iso"]

BUSY_TIMEOUT_S = 30.0
RETRY_FOR_S = 120.0
_MAGIC = b"SQLite format 3\x00"


def _busy(exc: sqlite3.OperationalError) -> bool:
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


def _fill(conn: sqlite3.Connection) -> None:
    """Create schema version ``SCHEMA_VERSION`` in the (open, empty) database of ``conn``."""
    for stmt in DDL:
        conn.execute(stmt)
    conn.execute(
        "INSERT INTO schema_version (app, version, created) VALUES (?, ?, ?)",
        (APP, SCHEMA_VERSION, now_iso()),
    )


class SQLiteBackend:
    """One connection to one SQLite ledger file (or ``:memory:``)."""

    def __init__(self, path: str | Path, *, readonly: bool = False):
        self.path = str(path)
        self.location = self.path
        self.readonly = readonly
        memory = self.path == ":memory:"
        if not memory and not self._check_file(Path(self.path)):
            if readonly:
                raise LedgerError(
                    f"ledger {self.path}: no such ledger (nothing was created: this command "
                    "only reads; check --ledger or KERNELAB_LEDGER)"
                )
            self._create_file(Path(self.path))
        self.conn = self._connect(memory, readonly)
        self.version = SCHEMA_VERSION
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self.conn.execute("PRAGMA foreign_keys = ON")
            if memory:  # a new, empty ledger of its own (read-only or not: nothing on disk)
                self.conn.execute("PRAGMA query_only = OFF")
                self.conn.execute("BEGIN")
                _fill(self.conn)
                self.conn.execute("COMMIT")
                self.conn.execute(f"PRAGMA query_only = {'ON' if readonly else 'OFF'}")
            else:  # the checks come before anything writes to the file
                self.version = self._retry(self._check_version)
                if not self.version:
                    raise LedgerError(
                        f"ledger {self.path}: an SQLite database without kernelab's tables, "
                        "not a ledger; refusing to use or change it (a new ledger needs a path "
                        "that does not exist)"
                    )
            if not readonly:
                self._retry(self._set_wal)
                if self.version < SCHEMA_VERSION:
                    self.version = self.write(self._migrate)
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise self._error(exc) from None
        except LedgerError:
            self.conn.close()
            raise

    # -- opening ---------------------------------------------------------------------------

    def _connect(self, memory: bool, readonly: bool) -> sqlite3.Connection:
        """A connection that never creates the file (it exists, whole, by now). Read-only
        connections are read-write ones that SQLite itself keeps from writing (query_only):
        a connection opened with mode=ro cannot remove the WAL's side files when it closes,
        so it would leave them behind; mode=ro is the fallback for a file we may not write."""
        modes = [None] if memory else (["rw", "ro"] if readonly else ["rw"])
        for i, mode in enumerate(modes):
            target = self.path if mode is None else f"{Path(self.path).absolute().as_uri()}"
            try:
                conn = sqlite3.connect(
                    target if mode is None else f"{target}?mode={mode}",
                    timeout=BUSY_TIMEOUT_S,
                    isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                    check_same_thread=False,
                    uri=mode is not None,
                )
                if readonly:
                    conn.execute("PRAGMA query_only = ON")
                return conn
            except sqlite3.Error as exc:
                if i + 1 == len(modes):
                    raise LedgerError(f"ledger {self.path}: cannot open ({exc})") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_file(self, p: Path) -> bool:
        """True when ``p`` exists and may be an SQLite file; False when it does not exist."""
        if p.is_dir():
            raise LedgerError(f"ledger {p}: is a directory, expected an SQLite file")
        if not p.exists():
            return False
        with p.open("rb") as f:
            head = f.read(len(_MAGIC))
        if not head:
            raise LedgerError(
                f"ledger {p}: an empty file (0 bytes), not a ledger; refusing to use it "
                "(a new ledger needs a path that does not exist)"
            )
        if head != _MAGIC:
            raise LedgerError(
                f"ledger {p}: not an SQLite database (foreign or corrupt file); "
                "refusing to use or overwrite it"
            )
        return True

    def _create_file(self, p: Path) -> None:
        """A new ledger at the missing path ``p``: made whole under a temporary name beside
        it, then linked to ``p`` (never over a file another process put there first)."""
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.new")
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("BEGIN")
                _fill(conn)
                conn.execute("COMMIT")
            finally:
                conn.close()  # the last connection: its WAL is checkpointed into the file
            try:
                os.link(tmp, p)
            except FileExistsError:
                pass  # another process made it meanwhile: that one is the ledger
            except OSError:  # a file system without hard links
                if not p.exists():
                    os.replace(tmp, p)
        except (OSError, sqlite3.Error) as exc:
            raise LedgerError(f"ledger {p}: cannot create it ({exc})") from None
        finally:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    Path(f"{tmp}{suffix}").unlink()

    def _set_wal(self) -> None:
        if self.path == ":memory:":
            return
        mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LedgerError(f"ledger {self.path}: could not switch to WAL mode (got {mode})")
        self.conn.execute("PRAGMA synchronous = NORMAL")

    def _migrate(self, conn: sqlite3.Connection) -> int:
        """Bring an older schema to ``SCHEMA_VERSION`` (inside the write transaction: the
        version is read again, another process may have migrated it meanwhile)."""
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        while version < SCHEMA_VERSION:
            for stmt in MIGRATIONS[version]:
                conn.execute(stmt)
            version += 1
            conn.execute("UPDATE schema_version SET version = ?", (version,))
        return version

    def _check_version(self) -> int:
        """The schema version the file holds (0: no tables); see ``check_version``."""
        rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        tables = {r[0] for r in rows}
        found = None
        if "schema_version" in tables:
            found = self.conn.execute("SELECT app, version FROM schema_version").fetchall()
        return check_version(self.path, tables, found)

    # -- errors and retries ----------------------------------------------------------------

    def _error(self, exc: sqlite3.Error) -> LedgerError:
        msg = str(exc)
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(
            exc, sqlite3.OperationalError | sqlite3.IntegrityError
        ):
            return LedgerError(f"ledger {self.path}: corrupt or not a ledger ({msg})")
        if "malformed" in msg or "not a database" in msg:
            return LedgerError(f"ledger {self.path}: corrupt or not a ledger ({msg})")
        if msg in ("disk I/O error", "database or disk is full"):
            return LedgerError(f"ledger {self.path}: {msg} (is its disk full or failing?)")
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
        if self.readonly:
            raise LedgerError(f"ledger {self.path}: opened read-only, nothing can be written")
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
                with contextlib.suppress(sqlite3.Error):  # a failing disk may refuse it too
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
