"""Runs the ledger could not store (a full disk, a lost server), kept as JSON files, and
:func:`record_or_keep`, the one place commands record a run: in the ledger, else in a file.

A file holds ``{"schema", "ledger", "error", "saved", "run"}``; ``run`` is the arguments of
:meth:`kernelab.ledger.Ledger.record_run` (``kind``, ``label``, ``provenance``, ``cases`` with
their raw samples), so a run is stored later with::

    run = orjson.loads(path.read_bytes())["run"]
    kernelab.ledger.open(url).record_run(**run)
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import orjson

from kernelab import _flags
from kernelab.ledger._base import now_iso

SCHEMA = "kernelab.unrecorded-run/1"


def _jsonable(value):
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def _places(location: str) -> list[Path]:
    """Where to write, in order: beside the ledger file (when it is a file), then the cache
    folder."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tag = f"{stamp}-{uuid.uuid4().hex[:8]}"
    places = []
    if location and location != ":memory:" and "://" not in location:
        p = Path(location)
        places.append(p.with_name(f"{p.name}.unrecorded-{tag}.json"))
    places.append(_flags.cache_dir() / "unrecorded" / f"run-{tag}.json")
    return places


def write_unrecorded(location: str, run: Mapping, error: str) -> Path:
    """Write ``run`` (``record_run``'s arguments) that the ledger at ``location`` refused
    with ``error``: beside the ledger file, else in kernelab's cache folder. Returns the
    file; raises OSError naming every place tried when none could take it."""
    data = orjson.dumps(
        {"schema": SCHEMA, "ledger": location, "error": error, "saved": now_iso(), "run": run},
        option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2,
        default=_jsonable,
    )
    failures = []
    for path in _places(location):
        created = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "xb") as f:
                created = True
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return path
        except OSError as exc:
            failures.append(f"{path} ({exc.strerror or exc})")
            if created:  # no half-written file
                with contextlib.suppress(OSError):
                    path.unlink()
    raise OSError(f"could not write the run anywhere: {'; '.join(failures)}")


@dataclass(frozen=True)
class Recorded:
    """Where a run went: ``run_id`` when the ledger stored it; else ``path``, the file that
    keeps it (None when no file could take it either), and ``error``, the line to print (the
    ledger's failure, where the run is kept, or the run itself as JSON)."""

    run_id: str | None
    path: Path | None = None
    error: str | None = None

    @property
    def stored(self) -> bool:
        return self.run_id is not None


def record_or_keep(
    db, kind: str, cases: list, provenance: Mapping, label: str | None = None, write=None
) -> Recorded:
    """Store a run in the ledger ``db`` (a Ledger, or a path or URL to open; None: the
    default), or, when the ledger cannot take it (cannot be opened, a full disk, a lost
    server), keep it as a file (:func:`write_unrecorded`) and say where. ``write(db)`` stores
    it in place of ``db.record_run`` (a sweep's task write) and returns the run id.

    The one way a command records a run: whatever the ledger's failure, the measurements
    survive it."""
    run = {"kind": kind, "label": label, "provenance": dict(provenance), "cases": list(cases)}
    location, opened = _location(db), None
    try:
        if db is None or isinstance(db, str | Path):
            from kernelab import ledger

            db = opened = ledger.open(db)
            location = db.location
        run_id = write(db) if write is not None else db.record_run(**run)
        return Recorded(run_id)
    except Exception as exc:  # whatever the failure, the run is kept
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if opened is not None:
            with contextlib.suppress(Exception):
                opened.close()
    where = f"error: the ledger {location} could not store the {kind} run ({error})"
    try:
        path = write_unrecorded(location, run, error)
    except OSError as exc:
        opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
        text = orjson.dumps(run, option=opts, default=_jsonable).decode()
        return Recorded(None, None, f"{where}; {exc}; the run as JSON:\n{text}")
    return Recorded(
        None, path, f"{where}; the run is kept in {path} ('run': record_run's arguments)"
    )


def _location(db) -> str:
    """The ledger's path or URL, for the messages and the file beside it."""
    if db is None:
        from kernelab import ledger

        return _flags.ledger_url() or str(ledger.default_path())
    if isinstance(db, str | Path):
        return str(db)
    return str(getattr(db, "location", db))
