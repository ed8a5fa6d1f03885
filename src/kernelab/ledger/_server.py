"""Ledgers in a database server (``postgresql://user@host/db``), through SQLAlchemy.

A team shares one ledger by pointing ``KERNELAB_LEDGER`` at a server database; this needs the
optional extra ``pip install 'kernelab[server]'`` (SQLAlchemy and psycopg 3). The PostgreSQL
driver: ``postgresql://`` (or ``postgres://``) uses psycopg (3) when it is importable, else
psycopg2 (SQLAlchemy alone would take psycopg and fail where only psycopg2 is installed);
``postgresql+psycopg2://`` or ``postgresql+psycopg://`` names one explicitly. The schema is the
one of :mod:`kernelab.ledger.schema`, with column types spelled for the server. Any
SQLAlchemy SQLite URL (``sqlite+pysqlite:///path``) works too and gives the same file as the
built-in backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelab.ledger._base import LedgerError, check_version, now_iso
from kernelab.ledger.schema import APP, DDL, MIGRATIONS, SCHEMA_VERSION

#: The drivers a plain ``postgresql://`` URL may use, in order of preference.
PG_DRIVERS = ("psycopg", "psycopg2")

#: Dialects whose SQL the schema and the store's statements are written for.
SUPPORTED = ("postgresql", "sqlite")

#: Column types spelled per dialect (SQLite's are the reference).
_TYPES = {
    "postgresql": (
        ("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY"),
        ("BLOB", "BYTEA"),
        ("REAL", "DOUBLE PRECISION"),
    ),
    "sqlite": (),
}
_LOCK_KEY = 0x6B65726E656C  # a fixed advisory-lock number for schema creation (PostgreSQL)


def ddl_for(dialect: str, statements=DDL) -> list[str]:
    """The schema's statements (or ``statements``, e.g. a migration's) for ``dialect``."""
    if dialect not in _TYPES:
        raise LedgerError(
            f"ledger: {dialect} databases are not supported; use one of {', '.join(SUPPORTED)}"
        )
    out = []
    for stmt in statements:
        for old, new in _TYPES[dialect]:
            stmt = stmt.replace(old, new)
        out.append(stmt)
    return out


def with_driver(url: str, importable=None) -> str:
    """``url`` with its PostgreSQL driver named: ``postgresql://`` and ``postgres://`` get the
    first of ``PG_DRIVERS`` that imports; any other URL (a driver named, another database)
    stays as it is. Without any driver, a LedgerError saying what to install."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("postgresql", "postgres"):
        return url
    importable = importable or _importable
    for driver in PG_DRIVERS:
        if importable(driver):
            return f"postgresql+{driver}://{rest}"
    raise LedgerError(
        f"ledger {scheme}://...: no PostgreSQL driver is installed; pip install "
        "'kernelab[server]' (psycopg 3), or psycopg2-binary"
    )


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:  # not installed, or psycopg without a libpq to use
        return False
    return True


def convert_params(sql: str, paramstyle: str) -> str:
    """The store's ``?`` placeholders in the driver's style."""
    if paramstyle == "qmark":
        return sql
    if paramstyle in ("format", "pyformat"):
        return sql.replace("%", "%%").replace("?", "%s")
    raise LedgerError(f"ledger: database driver paramstyle {paramstyle!r} is not supported")


class _Conn:
    """What the store's write functions see: ``execute(sql, params)`` with ``?`` placeholders."""

    def __init__(self, conn, paramstyle: str):
        self._conn, self._style = conn, paramstyle

    def execute(self, sql: str, params: tuple = ()):
        return self._conn.exec_driver_sql(convert_params(sql, self._style), tuple(params))


class ServerBackend:
    """A ledger in a database server. ``readonly=True`` creates no schema (an empty database
    is an error) and writes nothing; an SQLite URL to a missing file is an error too."""

    def __init__(self, url: str, *, readonly: bool = False):
        self.readonly = readonly
        scheme = url.split("://", 1)[0]
        try:
            import sqlalchemy
        except ImportError:
            raise LedgerError(
                f"ledger {scheme}://...: server databases need SQLAlchemy "
                "(pip install 'kernelab[server]') and the database's driver; or use an SQLite "
                "file path"
            ) from None
        self._sa = sqlalchemy
        url = with_driver(url)
        try:
            self.engine = sqlalchemy.create_engine(url, pool_pre_ping=True)
        except (ImportError, sqlalchemy.exc.ArgumentError) as exc:
            raise LedgerError(f"ledger {scheme}://...: cannot use this URL ({exc})") from None
        self.location = self.engine.url.render_as_string(hide_password=True)
        self.dialect = self.engine.dialect.name
        self._ddl = ddl_for(self.dialect)
        self._style = self.engine.dialect.paramstyle
        convert_params("", self._style)
        nothing = "nothing was created: this command only reads"
        if readonly and self.dialect == "sqlite":
            db = self.engine.url.database
            if db and db != ":memory:" and not Path(db).exists():
                self.engine.dispose()
                raise LedgerError(f"ledger {self.location}: no such ledger ({nothing})")
        self.version = SCHEMA_VERSION
        try:
            found = self._check_version()
            if found:
                self.version = found
                if not readonly and found < SCHEMA_VERSION:
                    self.version = self.write(self._migrate)
            else:
                if readonly:
                    raise LedgerError(
                        f"ledger {self.location}: no such ledger, the database has no tables "
                        f"({nothing})"
                    )
                self._create_schema()
        except sqlalchemy.exc.DBAPIError as exc:
            self.engine.dispose()
            raise self._error(exc) from None
        except LedgerError:
            self.engine.dispose()
            raise

    def _error(self, exc) -> LedgerError:
        return LedgerError(f"ledger {self.location}: {getattr(exc, 'orig', exc)}")

    def _check_version(self) -> int:
        tables = set(self._sa.inspect(self.engine).get_table_names()) - {"sqlite_sequence"}
        rows = None
        if "schema_version" in tables:
            rows = self.query("SELECT app, version FROM schema_version")
        return check_version(self.location, tables, rows)

    def _migrate(self, conn: _Conn) -> int:
        """Bring an older schema to ``SCHEMA_VERSION``, one migrator at a time (the version is
        read again under the lock: another process may have migrated it meanwhile)."""
        if self.dialect == "postgresql":
            conn.execute(f"SELECT pg_advisory_xact_lock({_LOCK_KEY})")
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        while version < SCHEMA_VERSION:
            for stmt in ddl_for(self.dialect, MIGRATIONS[version]):
                conn.execute(stmt)
            version += 1
            conn.execute("UPDATE schema_version SET version = ?", (version,))
        return version

    def _create_schema(self) -> None:
        def create(conn: _Conn) -> None:
            if self.dialect == "postgresql":  # one creator at a time
                conn.execute(f"SELECT pg_advisory_xact_lock({_LOCK_KEY})")
            tables = set(self._sa.inspect(conn._conn).get_table_names())
            if "schema_version" in tables:
                rows = conn.execute("SELECT app, version FROM schema_version").fetchall()
                if check_version(self.location, tables, rows):
                    return
            for stmt in self._ddl:
                conn.execute(stmt)
            conn.execute(
                "INSERT INTO schema_version (app, version, created) VALUES (?, ?, ?)",
                (APP, SCHEMA_VERSION, now_iso()),
            )

        self.write(create)

    def write(self, fn: Callable[[_Conn], Any]) -> Any:
        """Run ``fn(conn)`` in one transaction; roll back on any exception."""
        if self.readonly:
            raise LedgerError(f"ledger {self.location}: opened read-only, nothing can be written")
        try:
            with self.engine.begin() as conn:
                return fn(_Conn(conn, self._style))
        except self._sa.exc.DBAPIError as exc:
            raise self._error(exc) from None

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            with self.engine.connect() as conn:
                rows = conn.exec_driver_sql(convert_params(sql, self._style), tuple(params))
                return [
                    tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows
                ]
        except self._sa.exc.DBAPIError as exc:
            raise self._error(exc) from None

    def check(self) -> str:
        if self.dialect == "sqlite":
            return "; ".join(str(r[0]) for r in self.query("PRAGMA integrity_check"))
        self.query("SELECT COUNT(*) FROM runs")
        return "ok"

    def close(self) -> None:
        self.engine.dispose()
