"""Server database URLs (``postgresql://user@host/db``, ``mysql://...``).

The schema (:mod:`kernelab.ledger.schema`) is plain SQL meant to be served by a database
server for a team, but this version stores ledgers only in SQLite files; a server URL gives a
clear error instead of being mistaken for a file name.
"""

from __future__ import annotations

from kernelab.ledger._sqlite import LedgerError


class ServerBackend:
    def __init__(self, url: str):
        scheme = url.split("://", 1)[0]
        raise LedgerError(
            f"ledger {scheme}://...: server databases are not supported by this kernelab "
            "version; use an SQLite file path or sqlite:///path (KERNELAB_LEDGER)"
        )
