"""The SQLAlchemy backend (server URLs): through SQLAlchemy's own SQLite driver, and against a
real PostgreSQL server started here (with each driver installed) when its binaries exist."""

import importlib
import sqlite3
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kernelab import ledger
from kernelab.ledger._server import convert_params, ddl_for, with_driver
from kernelab.ledger.schema import SCHEMA_VERSION, TABLES
from tests import pgserver

pytest.importorskip("sqlalchemy")

PROV = {"device": {"name": "cpu", "key": "cpu|2|8GB"}}
CASE = {
    "op": "rmsnorm",
    "variant": "kernelab",
    "shape_key": "r8c64",
    "dtype": "float32",
    "device": "cpu",
    "mode": "hot",
    "metrics": {"median_s": 2e-6, "note": "50% done"},
    "samples": [1e-6, 2e-6, 3e-6],
}


def test_server_backend_round_trip_and_same_schema_as_builtin(tmp_path):
    path = tmp_path / "sa.sqlite"
    with ledger.open(f"sqlite+pysqlite:///{path}") as db:
        assert type(db._db).__name__ == "ServerBackend"
        rid = db.record_run("bench", [CASE, {**CASE, "variant": "torch"}], PROV, label="x")
        run = db.get_run("x")
        assert run["id"] == rid and [c["variant"] for c in run["cases"]] == ["kernelab", "torch"]
        assert np.array_equal(run["cases"][0]["samples"], CASE["samples"])
        assert run["cases"][0]["metrics"]["note"] == "50% done"  # '%' survives any paramstyle
        assert db.resolve(rid[:5]) == rid  # LIKE prefix lookups
        db.put_ceiling("cpu|2|8GB", "copy_bytes_per_s", 1e10, "B/s", "test")
        db.put_ceiling("cpu|2|8GB", "copy_bytes_per_s", 2e10, "B/s", "again")
        assert db.ceilings("cpu|2|8GB")["copy_bytes_per_s"]["value"] == 2e10
        db.cache_put("tune", "k", {"BLOCK": 64})
        assert db.cache_get("tune", "k") == {"BLOCK": 64}
        assert len(db.history("rmsnorm")) == 2 and db.check() == "ok"

        def failing():
            yield CASE
            raise RuntimeError("stop")

        with pytest.raises(RuntimeError):
            db.record_run("bench", failing(), PROV)
        assert db.count_runs() == 1  # rolled back
    with ledger.open(path) as db:  # the built-in backend reads what SQLAlchemy wrote
        assert db.get_run("x")["cases"][1]["variant"] == "torch"


def test_server_backend_refuses_newer_and_foreign_databases(tmp_path):
    newer = tmp_path / "newer.sqlite"
    ledger.open(newer).close()
    con = sqlite3.connect(newer)
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    with pytest.raises(ledger.LedgerError, match="newer than this kernelab"):
        ledger.open(f"sqlite+pysqlite:///{newer}")
    foreign = tmp_path / "foreign.sqlite"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE orders (id INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(ledger.LedgerError, match="a foreign database"):
        ledger.open(f"sqlite+pysqlite:///{foreign}")
    with pytest.raises(ledger.LedgerError, match="not supported"):
        ddl_for("mysql")


def test_postgresql_spelling_of_the_schema():
    ddl = "\n".join(ddl_for("postgresql"))
    assert "BIGSERIAL PRIMARY KEY" in ddl and "BYTEA" in ddl and "DOUBLE PRECISION" in ddl
    assert "AUTOINCREMENT" not in ddl and "BLOB" not in ddl and " REAL " not in ddl
    assert convert_params("a LIKE ? AND b = '5%'", "pyformat") == "a LIKE %s AND b = '5%%'"
    assert convert_params("x = ?", "qmark") == "x = ?"


def test_a_plain_postgresql_url_gets_psycopg_then_psycopg2():
    url = "postgresql://u:pw@db.example:5432/ledger"
    assert with_driver(url, lambda m: True) == "postgresql+psycopg://u:pw@db.example:5432/ledger"
    only2 = with_driver(url, lambda m: m == "psycopg2")
    assert only2 == "postgresql+psycopg2://u:pw@db.example:5432/ledger"
    assert (
        with_driver("postgres://u@h/d", lambda m: m == "psycopg2") == "postgresql+psycopg2://u@h/d"
    )
    for explicit in ("postgresql+psycopg2://u@h/d", "postgresql+psycopg://u@h/d", "sqlite:///x"):
        assert with_driver(explicit, lambda m: False) == explicit
    with pytest.raises(ledger.LedgerError, match="no PostgreSQL driver") as err:
        with_driver(url, lambda m: False)
    assert "pw" not in str(err.value)


# --- a real PostgreSQL server (skipped without pg_ctl/initdb or a driver) ----------------------

DRIVERS = ("psycopg", "psycopg2")


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def pg():
    if pgserver.binaries() is None:
        pytest.skip("no PostgreSQL server here (pg_ctl and initdb; .ci/run installs them)")
    if not any(_importable(d) for d in DRIVERS):
        pytest.skip("no PostgreSQL driver installed (psycopg or psycopg2; the dev extra has both)")
    with pgserver.running() as server:
        yield server


@pytest.fixture
def database(pg):
    """A new, empty database of its own on the server."""
    return pg.createdb(f"t_{uuid.uuid4().hex[:12]}")


def _round_trip(url: str) -> None:
    with ledger.open(url) as db:
        rid = db.record_run("bench", [CASE, {**CASE, "variant": "torch"}], PROV, label="x")
        run = db.get_run("x")
        assert run["id"] == rid and [c["variant"] for c in run["cases"]] == ["kernelab", "torch"]
        assert np.array_equal(run["cases"][0]["samples"], CASE["samples"])
        assert run["cases"][0]["metrics"]["note"] == "50% done"
        assert db.resolve(rid[:5]) == rid
        db.put_ceiling("cpu|2|8GB", "copy_bytes_per_s", 1e10, "B/s", "test")
        db.put_ceiling("cpu|2|8GB", "copy_bytes_per_s", 2e10, "B/s", "again")
        assert db.ceilings("cpu|2|8GB")["copy_bytes_per_s"]["value"] == 2e10
        db.cache_put("tune", "k", {"BLOCK": 64})
        assert db.cache_get("tune", "k") == {"BLOCK": 64}
        assert len(db.history("rmsnorm")) == 2 and db.check() == "ok"
    with ledger.open(url, readonly=True) as db:  # a second connection sees it all
        assert db.count_runs() == 1


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_ledger_on_a_real_postgresql_server_with_each_driver(pg, database, driver):
    if not _importable(driver):
        pytest.skip(f"{driver} is not installed")
    _round_trip(pg.url(database, driver))
    assert set(pg.psql(database, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
               .split()) == set(TABLES)  # fmt: skip


@pytest.mark.parametrize("installed", ["psycopg2 only", "psycopg only"])
def test_a_plain_postgresql_url_uses_whichever_driver_is_installed(
    pg, database, installed, monkeypatch
):
    # SQLAlchemy 2.1 maps postgresql:// to psycopg (3) alone: with only psycopg2 installed,
    # the plain URL failed. kernelab picks psycopg, then psycopg2.
    want, hidden = ("psycopg2", "psycopg") if installed == "psycopg2 only" else DRIVERS
    if not _importable(want):
        pytest.skip(f"{want} is not installed")
    monkeypatch.setitem(sys.modules, hidden, None)  # as if it were not installed
    url = pg.url(database)
    assert url.startswith("postgresql://")
    _round_trip(url)
    with ledger.open(url) as db:
        assert db.location.startswith(f"postgresql+{want}://")


def test_a_server_ledger_is_created_once_by_concurrent_writers(pg, database):
    url = pg.url(database)
    with ThreadPoolExecutor(4) as pool:
        dbs = list(pool.map(lambda _: ledger.open(url), range(4)))
    for db in dbs:
        db.record_run("bench", [CASE], PROV)
        db.close()
    assert pg.psql(database, "SELECT count(*) FROM schema_version").strip() == "1"
    with ledger.open(url, readonly=True) as db:
        assert db.count_runs() == 4


def test_a_foreign_or_empty_server_database_is_refused_unchanged(pg, database):
    pg.psql(database, "CREATE TABLE orders (id integer); INSERT INTO orders VALUES (7)")
    with pytest.raises(ledger.LedgerError, match="a foreign database"):
        ledger.open(pg.url(database))
    tables = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
    assert pg.psql(database, tables).split() == ["orders"]
    empty = pg.createdb(database + "_empty")
    with pytest.raises(ledger.LedgerError, match="no such ledger") as err:
        ledger.open(pg.url(empty), readonly=True)  # history, compare, report
    assert "nothing was created" in str(err.value)
    assert pg.psql(empty, tables).split() == []
