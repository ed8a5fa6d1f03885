"""Runs the ledger could not store (a full disk, a lost server), kept as JSON files.

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
