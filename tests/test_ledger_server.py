"""The SQLAlchemy backend (server URLs), exercised through SQLAlchemy's own SQLite driver."""

import sqlite3

import numpy as np
import pytest

from kernelab import ledger
from kernelab.ledger._server import convert_params, ddl_for
from kernelab.ledger.schema import SCHEMA_VERSION

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
