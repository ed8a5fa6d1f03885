"""The results ledger: every run, its cases, raw samples and provenance, in one database.

``open(url)`` takes ``None`` (``KERNELAB_LEDGER``, else ``ledger.sqlite`` in kernelab's data
folder), a file path, ``sqlite:///relative/path`` or ``sqlite:////absolute/path``, or
``:memory:``. A server URL (``postgresql://user@host/db``) goes through SQLAlchemy, an
optional extra (:mod:`kernelab.ledger._server`). The schema is documented in
:mod:`kernelab.ledger.schema`.
"""

from __future__ import annotations

from pathlib import Path

from kernelab import _flags
from kernelab.ledger._base import now_iso
from kernelab.ledger._sqlite import LedgerError, SQLiteBackend
from kernelab.ledger.provenance import git_info, provenance
from kernelab.ledger.schema import SCHEMA_VERSION
from kernelab.ledger.store import Ledger, pack_samples, unpack_samples
from kernelab.ledger.unrecorded import Recorded, record_or_keep, write_unrecorded


def default_path() -> Path:
    """Where the ledger lives when nothing else is configured."""
    return _flags.data_dir() / "ledger.sqlite"


def _sqlite_path(url: str) -> str | None:
    """The file an SQLite URL or plain path names; None for a server URL."""
    if url == ":memory:":
        return url
    if url.startswith("sqlite://"):
        rest = url[len("sqlite://") :]
        if not rest.startswith("/"):
            raise ValueError(f"ledger url: expected sqlite:///path, got {url!r}")
        rest = rest[1:]
        return rest or ":memory:"
    if "://" in url:
        return None
    return str(Path(url).expanduser())


def open(url: str | Path | None = None, *, readonly: bool = False) -> Ledger:
    """Open the ledger at ``url`` (see the module docstring): a path that does not exist
    becomes a new ledger; any other file must already be a kernelab ledger (an empty,
    foreign or partial file is refused, unchanged). ``readonly=True`` never creates a file,
    folder or schema and never writes: a missing ledger is a :class:`LedgerError`."""
    if url is None:
        url = _flags.ledger_url() or str(default_path())
    if isinstance(url, Path):
        url = str(url)
    if not isinstance(url, str) or not url:
        raise TypeError(f"url: expected a path or database URL, got {url!r}")
    path = _sqlite_path(url)
    if path is None:
        from kernelab.ledger._server import ServerBackend

        return Ledger(ServerBackend(url, readonly=readonly))
    return Ledger(SQLiteBackend(path, readonly=readonly))


__all__ = [
    "SCHEMA_VERSION",
    "Ledger",
    "LedgerError",
    "Recorded",
    "default_path",
    "git_info",
    "now_iso",
    "open",
    "pack_samples",
    "provenance",
    "record_or_keep",
    "unpack_samples",
    "write_unrecorded",
]
