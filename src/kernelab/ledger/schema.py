"""The ledger's schema: tables, version, and the checks run when a database is opened.

Schema version 2 (``SCHEMA_VERSION``)
-------------------------------------

``schema_version``  one row: ``app`` ("kernelab"), ``version`` (int), ``created`` (ISO UTC).
                    A file whose ``app`` differs, or whose version is newer than this code
                    knows, is refused with an error naming the file; it is never rewritten.
``runs``            one row per run: ``seq`` (insertion order), ``id`` (text, unique),
                    ``kind`` ("bench", "verify", "tune", ...), ``label`` (user's name for the
                    run, may repeat), ``created`` (ISO-8601 UTC, microseconds), ``device_key``,
                    ``provenance`` (JSON object: commit, versions, device, host, seeds, ...),
                    ``sweep_id`` (the sweep that produced the run, NULL otherwise; version 2).
``cases``           one row per measured case of a run: ``run_id``, ``idx`` (order in the run),
                    ``op``, ``variant``, ``shape_key``, ``shape_label``, ``dtype``, ``device``,
                    ``mode`` ("cold", "hot", ...), ``metrics`` (JSON object of numbers and
                    strings: median_s, q1_s, q3_s, min_s, cv, n, gbps, tflops, pct_roofline,
                    floor_s, bound, ceiling_source, ...), ``flags`` (JSON array of strings),
                    ``n_samples`` and ``samples`` (raw per-sample seconds, little-endian float64).
``ceilings``        measured device ceilings: ``device_key``, ``name`` (e.g. "copy_gbps",
                    "matmul_tflops"), ``value``, ``unit``, ``source``, ``measured`` (ISO UTC).
``cache``           small JSON values by (``namespace``, ``key``), e.g. tuned configurations.
``sweeps``          (version 2) one row per sweep: ``id``, ``created``, ``spec`` (JSON object:
                    the validated spec), ``provenance`` (JSON object).
``sweep_tasks``     (version 2) one row per task a sweep finished or gave up on: ``key`` (unique:
                    a hash of op, variant, shape, dtype, config, target, kernel source hash and
                    versions), ``sweep_id``, ``kind``, ``op``, ``variant``, ``shape_key``,
                    ``dtype``, ``config``, ``target``, ``status`` ("done" or "failed"),
                    ``attempts``, ``reason`` (why it failed), ``run_id`` (the run holding its
                    result, NULL when failed), ``updated``. A task key is stored once: a
                    result for a key already done is dropped, in the same transaction as the
                    run it would have added (:mod:`kernelab.ledger.sweeps`).

Migrations: a version-1 ledger opened for writing is brought to version 2 in one transaction
(``MIGRATIONS[1]``: a nullable column on ``runs`` and the two sweep tables; nothing existing
is rewritten). A version-1 ledger opened read-only is read as it is (it has no sweeps).

A run and all its cases are written in one transaction: a crash leaves either the whole run or
nothing. JSON is written with orjson and read back with orjson; nothing is ever unpickled.
"""

from __future__ import annotations

APP = "kernelab"
SCHEMA_VERSION = 2

_SWEEP_DDL = (
    """CREATE TABLE IF NOT EXISTS sweeps (
        id TEXT PRIMARY KEY,
        created TEXT NOT NULL,
        spec TEXT NOT NULL,
        provenance TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS sweep_tasks (
        key TEXT PRIMARY KEY,
        sweep_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        op TEXT NOT NULL,
        variant TEXT NOT NULL,
        shape_key TEXT NOT NULL,
        dtype TEXT NOT NULL,
        config TEXT NOT NULL,
        target TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        reason TEXT,
        run_id TEXT,
        updated TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS sweep_tasks_by_sweep ON sweep_tasks (sweep_id, status)",
    "CREATE INDEX IF NOT EXISTS runs_by_sweep ON runs (sweep_id)",
)

#: Statements that create schema version ``SCHEMA_VERSION`` (idempotent).
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
        provenance TEXT NOT NULL,
        sweep_id TEXT
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
    *_SWEEP_DDL,
)

#: Statements that bring a ledger of version N to version N + 1 (run in one transaction).
MIGRATIONS = {
    1: ("ALTER TABLE runs ADD COLUMN sweep_id TEXT", *_SWEEP_DDL),
}

#: Tables a ledger of each version has; used to tell a kernelab ledger from a foreign one.
TABLES_OF = {
    1: ("schema_version", "runs", "cases", "ceilings", "cache"),
    2: ("schema_version", "runs", "cases", "ceilings", "cache", "sweeps", "sweep_tasks"),
}
TABLES = TABLES_OF[SCHEMA_VERSION]
