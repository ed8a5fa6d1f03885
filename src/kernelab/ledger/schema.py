"""The ledger's schema: tables, version, and the checks run when a database is opened.

Schema version 1 (``SCHEMA_VERSION``)
-------------------------------------

``schema_version``  one row: ``app`` ("kernelab"), ``version`` (int), ``created`` (ISO UTC).
                    A file whose ``app`` differs, or whose version is newer than this code
                    knows, is refused with an error naming the file; it is never rewritten.
``runs``            one row per run: ``seq`` (insertion order), ``id`` (text, unique),
                    ``kind`` ("bench", "verify", "tune", ...), ``label`` (user's name for the
                    run, may repeat), ``created`` (ISO-8601 UTC, microseconds), ``device_key``,
                    ``provenance`` (JSON object: commit, versions, device, host, seeds, ...).
``cases``           one row per measured case of a run: ``run_id``, ``idx`` (order in the run),
                    ``op``, ``variant``, ``shape_key``, ``shape_label``, ``dtype``, ``device``,
                    ``mode`` ("cold", "hot", ...), ``metrics`` (JSON object of numbers and
                    strings: median_s, q1_s, q3_s, min_s, cv, n, gbps, tflops, pct_roofline,
                    floor_s, bound, ceiling_source, ...), ``flags`` (JSON array of strings),
                    ``n_samples`` and ``samples`` (raw per-sample seconds, little-endian float64).
``ceilings``        measured device ceilings: ``device_key``, ``name`` (e.g. "copy_gbps",
                    "matmul_tflops"), ``value``, ``unit``, ``source``, ``measured`` (ISO UTC).
``cache``           small JSON values by (``namespace``, ``key``), e.g. tuned configurations.

A run and all its cases are written in one transaction: a crash leaves either the whole run or
nothing. JSON is written with orjson and read back with orjson; nothing is ever unpickled.
"""

from __future__ import annotations

APP = "kernelab"
SCHEMA_VERSION = 1

#: Statements that create schema version 1 (idempotent).
DDL = (
    """CREATE TABLE IF NOT EXISTS schema_version (
        app TEXT NOT NULL,
        version INTEGER NOT NULL,
        created TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS runs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        label TEXT,
        created TEXT NOT NULL,
        device_key TEXT,
        provenance TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS cases (
        run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        op TEXT NOT NULL,
        variant TEXT NOT NULL,
        shape_key TEXT NOT NULL,
        shape_label TEXT,
        dtype TEXT NOT NULL,
        device TEXT NOT NULL,
        mode TEXT NOT NULL,
        metrics TEXT NOT NULL,
        flags TEXT NOT NULL,
        n_samples INTEGER NOT NULL,
        samples BLOB,
        PRIMARY KEY (run_id, idx)
    )""",
    "CREATE INDEX IF NOT EXISTS cases_by_op ON cases (op, variant, shape_key, dtype)",
    "CREATE INDEX IF NOT EXISTS runs_by_kind ON runs (kind, label)",
    """CREATE TABLE IF NOT EXISTS ceilings (
        device_key TEXT NOT NULL,
        name TEXT NOT NULL,
        value REAL NOT NULL,
        unit TEXT NOT NULL,
        source TEXT NOT NULL,
        measured TEXT NOT NULL,
        PRIMARY KEY (device_key, name)
    )""",
    """CREATE TABLE IF NOT EXISTS cache (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        updated TEXT NOT NULL,
        PRIMARY KEY (namespace, key)
    )""",
)

#: Tables a version-1 ledger has; used to tell a kernelab ledger from a foreign database.
TABLES = ("schema_version", "runs", "cases", "ceilings", "cache")
