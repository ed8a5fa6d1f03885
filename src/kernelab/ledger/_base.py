"""What every ledger backend shares: the error type, timestamps, the schema version check."""

from __future__ import annotations

from datetime import datetime, timezone

from kernelab.ledger.schema import APP, SCHEMA_VERSION, TABLES_OF


class LedgerError(ValueError):
    """The ledger cannot be used: foreign, newer, corrupt or locked for too long."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def check_version(location: str, tables: set[str], rows: list[tuple] | None) -> int:
    """The schema version when the database holds a usable kernelab schema (an older one is
    usable: a writer migrates it), 0 when it is empty.

    ``tables``: its table names; ``rows``: the (app, version) rows of ``schema_version`` when
    that table exists. Anything else (a foreign database, another app's, a newer schema, a
    partial ledger missing some of its tables) is a :class:`LedgerError` naming ``location``.
    """
    tables = set(tables) - {"sqlite_sequence"}
    if "schema_version" in tables:
        rows = rows or []
        if len(rows) != 1:
            raise LedgerError(
                f"ledger {location}: schema_version holds {len(rows)} rows, expected 1 "
                "(corrupt ledger)"
            )
        app, version = rows[0]
        if app != APP:
            raise LedgerError(
                f"ledger {location}: belongs to {app!r}, not {APP!r}; refusing to use it"
            )
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise LedgerError(
                f"ledger {location}: schema version {version} is newer than this kernelab "
                f"understands ({SCHEMA_VERSION}); upgrade kernelab to read it"
            )
        missing = sorted(set(TABLES_OF.get(version, ())) - tables)
        if missing:
            raise LedgerError(
                f"ledger {location}: a partial kernelab ledger (missing tables: "
                f"{', '.join(missing)}); refusing to use or change it"
            )
        return version
    if tables:
        names = ", ".join(sorted(tables))
        raise LedgerError(
            f"ledger {location}: a foreign database (tables: {names}), not a kernelab "
            "ledger; refusing to use or overwrite it"
        )
    return 0
