"""The ledger: round trips, lookups, and refusing files that are not kernelab ledgers."""

import hashlib
import sqlite3

import numpy as np
import pytest

from kernelab import ledger
from kernelab.ledger.schema import DDL, SCHEMA_VERSION

PROV = {"device": {"name": "Test CPU", "key": "Test CPU|2|8GB", "type": "cpu"}, "seed": 7}


def case(op="rmsnorm", variant="kernelab", shape="r4096c4096", samples=(1e-3, 1.1e-3), **kw):
    out = {
        "op": op,
        "variant": variant,
        "shape_key": shape,
        "shape_label": f"{shape} label",
        "dtype": "bfloat16",
        "device": "cpu",
        "mode": "cold",
        "metrics": {"median_s": float(np.median(samples)), "gbps": 12.5, "bound": "memory"},
        "flags": [],
        "samples": list(samples),
    }
    out.update(kw)
    return out


@pytest.fixture
def db(tmp_path):
    with ledger.open(tmp_path / "l.sqlite") as d:
        yield d


def test_round_trip_keeps_raw_samples_bit_exact(db):
    samples = np.random.default_rng(0).lognormal(-7, 0.1, size=257)
    rid = db.record_run("bench", [case(samples=samples), case(variant="torch")], PROV, "base")
    run = db.get_run(rid)
    assert run["id"] == rid and run["kind"] == "bench" and run["label"] == "base"
    assert run["provenance"] == PROV
    assert run["device_key"] == "Test CPU|2|8GB"
    assert [c["variant"] for c in run["cases"]] == ["kernelab", "torch"]
    got = run["cases"][0]
    assert np.array_equal(np.asarray(got["samples"]), samples)  # float64, no rounding
    assert got["n_samples"] == 257 and got["metrics"]["bound"] == "memory"
    assert got["shape_label"] == "r4096c4096 label"


def test_samples_are_a_float64_blob_never_pickle(db, tmp_path):
    db.record_run("bench", [case(samples=[0.5, 0.25])], PROV)
    con = sqlite3.connect(tmp_path / "l.sqlite")
    (blob,) = con.execute("SELECT samples FROM cases").fetchone()
    con.close()
    assert blob == np.array([0.5, 0.25], "<f8").tobytes()


def test_lookups_latest_labels_prefixes_history(db):
    a = db.record_run("bench", [case(samples=[1.0])], PROV, label="nightly")
    b = db.record_run("bench", [case(samples=[2.0])], PROV, label="nightly")
    v = db.record_run("verify", [case(samples=[3.0])], PROV)
    assert db.latest()["id"] == b  # kind defaults to bench
    assert db.latest(kind=None)["id"] == v
    assert db.latest(before=b)["id"] == a
    assert db.latest(label="nope") is None
    assert db.resolve("nightly") == b
    assert db.resolve("latest", kind="bench", before=b) == a
    assert db.resolve(a[:6]) == a
    assert [r["id"] for r in db.list_runs()] == [v, b, a]
    assert [r["id"] for r in db.list_runs(kind="bench", limit=1)] == [b]
    assert db.list_runs(label="nightly")[0]["n_cases"] == 1
    hist = db.history("rmsnorm", variant="kernelab")
    assert [run["id"] for run, _ in hist] == [a, b, v]
    assert [c["metrics"]["median_s"] for _, c in hist] == [1.0, 2.0, 3.0]
    assert db.history("rmsnorm", dtype="float32") == []
    assert db.count_runs() == 3 and db.count_runs("verify") == 1
    with pytest.raises(ValueError, match="neither a run id nor a label"):
        db.resolve("unknown-label")


def test_ceilings_and_cache(db):
    db.put_ceiling("dev", "copy_gbps", 3000.0, "GB/s", "measured: 1 GiB copy")
    db.put_ceiling("dev", "copy_gbps", 3100.0, "GB/s", "measured again")
    db.put_ceiling("dev", "matmul_tflops", 700.0, "TFLOP/s", "measured")
    got = db.ceilings("dev")
    assert got["copy_gbps"]["value"] == 3100.0 and got["copy_gbps"]["source"] == "measured again"
    assert set(got) == {"copy_gbps", "matmul_tflops"} and db.ceilings("other") == {}
    assert db.cache_get("tune", "k") is None
    db.cache_put("tune", "k", {"BLOCK": 128, "time": 1e-5})
    db.cache_put("tune", "k", {"BLOCK": 256})
    assert db.cache_get("tune", "k") == {"BLOCK": 256}
    with pytest.raises(ValueError, match="value"):
        db.put_ceiling("dev", "copy_gbps", -1, "GB/s", "x")


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"op": ""}, r"cases\[1\]\.op"),
        ({"samples": [1.0, float("nan")]}, r"cases\[1\]\.samples"),
        ({"flags": [3]}, r"cases\[1\]\.flags"),
        ({"metrics": [1]}, r"cases\[1\]\.metrics"),
    ],
)
def test_a_bad_case_records_nothing(db, bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        db.record_run("bench", [case(), case(**bad)], PROV)
    assert db.list_runs(kind=None) == []


def test_an_exception_while_producing_cases_rolls_back(db):
    def cases():
        yield case()
        yield case(variant="torch")
        raise RuntimeError("harness died")

    with pytest.raises(RuntimeError, match="harness died"):
        db.record_run("bench", cases(), PROV)
    assert db.list_runs(kind=None) == [] and db.history("rmsnorm") == []
    rid = db.record_run("bench", [case()], PROV)  # the ledger still works
    assert db.list_runs()[0]["id"] == rid and db.check() == "ok"


def test_schema_is_versioned(db, tmp_path):
    con = sqlite3.connect(tmp_path / "l.sqlite")
    assert con.execute("SELECT app, version FROM schema_version").fetchall() == [
        ("kernelab", SCHEMA_VERSION)
    ]
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


def _assert_refused(path, match):
    before = path.read_bytes()
    with pytest.raises(ledger.LedgerError, match=match) as err:
        ledger.open(path)
    assert str(path) in str(err.value)
    assert path.read_bytes() == before  # never overwritten


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    ledger.open(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    _assert_refused(path, "newer than this kernelab")


def test_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "foreign.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    con.execute("INSERT INTO customers VALUES (1, 'x')")
    con.commit()
    con.close()
    _assert_refused(path, "a foreign database")


def test_other_apps_schema_version_is_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE schema_version (app TEXT, version INTEGER, created TEXT)")
    con.execute("INSERT INTO schema_version VALUES ('otherapp', 1, 'x')")
    con.commit()
    con.close()
    _assert_refused(path, "belongs to 'otherapp'")


def test_non_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_text("these are my notes, not a database\n" * 50)
    _assert_refused(path, "not an SQLite database")


def test_corrupt_ledger_gives_a_clear_error(tmp_path):
    path = tmp_path / "corrupt.sqlite"
    with ledger.open(path) as d:
        for i in range(30):
            d.record_run("bench", [case(samples=np.ones(200) * i)], PROV)
    data = bytearray(path.read_bytes())
    # Keep the header, garble every page after the first (the schema page stays readable).
    for i in range(4096, len(data)):
        data[i] = (i * 131) % 256
    path.write_bytes(bytes(data))
    with pytest.raises(ledger.LedgerError, match=str(path)), ledger.open(path) as d:
        d.list_runs()
        d.history("rmsnorm", samples=True)
        d.check()


def test_open_uses_env_and_urls(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAB_LEDGER", str(tmp_path / "env.sqlite"))
    with ledger.open() as d:
        assert d.location == str(tmp_path / "env.sqlite")
    monkeypatch.delenv("KERNELAB_LEDGER")
    monkeypatch.setenv("KERNELAB_DATA_DIR", str(tmp_path / "data"))
    assert ledger.default_path() == tmp_path / "data" / "ledger.sqlite"
    with ledger.open() as d:
        assert d.location == str(tmp_path / "data" / "ledger.sqlite")
    with ledger.open(f"sqlite:///{tmp_path}/url.sqlite") as d:
        assert d.location == f"/{tmp_path}/url.sqlite".replace("//", "/")
    with ledger.open(":memory:") as d:
        d.record_run("bench", [case()], PROV)
        assert d.count_runs() == 1
    # A server URL is never taken for a file name: without SQLAlchemy or the driver (as here),
    # or without the server, it is one clear error naming the URL (password hidden).
    with pytest.raises(ledger.LedgerError, match=r"ledger postgresql\S*://") as err:
        ledger.open("postgresql://user:secret@127.0.0.1:1/kernelab")
    assert "secret" not in str(err.value)


def test_provenance_has_versions_device_and_never_fails_outside_git(tmp_path):
    p = ledger.provenance("cpu", seed=3)
    assert p["device"]["type"] == "cpu" and p["device"]["key"]
    assert p["versions"]["kernelab"] and p["versions"]["torch"] and p["versions"]["python"]
    assert p["seed"] == 3 and p["time"].endswith("+00:00")
    assert ledger.git_info(tmp_path) is None
    git = ledger.git_info()
    assert git is None or len(git["commit"]) == 40


# --- what becomes a ledger, and what read-only commands never create ---------------------------


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_refused_unchanged(path, match, readonly=False):
    before = _digest(path)
    with pytest.raises(ledger.LedgerError, match=match) as err:
        ledger.open(path, readonly=readonly)
    assert str(path) in str(err.value)
    assert _digest(path) == before, "a refused file was changed"
    left = sorted(p.name for p in path.parent.iterdir())
    assert left == [path.name], f"refusing {path.name} left files behind: {left}"


def _partial(path, tables):
    con = sqlite3.connect(path)
    for stmt in DDL:
        name = stmt.split("EXISTS", 1)[1].split()[0] if "TABLE" in stmt else None
        if name in tables:
            con.execute(stmt)
    if "schema_version" in tables:
        con.execute("INSERT INTO schema_version VALUES ('kernelab', ?, 'x')", (SCHEMA_VERSION,))
    con.commit()
    con.close()
    return path


def _tableless(path):
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version = 7")  # a valid SQLite header, not an empty file
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("readonly", [False, True], ids=["writer", "read-only"])
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: p.write_bytes(b"") and p, "an empty file"),
        (_tableless, "an SQLite database without kernelab's tables"),
        (lambda p: _partial(p, {"schema_version"}), r"a partial kernelab ledger \(missing"),
        (
            lambda p: _partial(p, {"schema_version", "runs", "cases"}),
            r"missing tables: cache, ceilings",
        ),
    ],
    ids=["0-byte", "table-less", "schema_version only", "no ceilings or cache"],
)
def test_only_a_missing_path_becomes_a_ledger_anything_else_is_refused_unchanged(
    tmp_path, make, match, readonly
):
    path = tmp_path / "l.sqlite"
    make(path)
    if not path.exists():
        path.write_bytes(b"")
    _assert_refused_unchanged(path, match, readonly)


def test_a_missing_path_becomes_a_whole_ledger_and_nothing_else_is_left(tmp_path):
    path = tmp_path / "new" / "folder" / "l.sqlite"
    with ledger.open(path) as db:
        db.record_run("bench", [case()], PROV)
    assert sorted(p.name for p in path.parent.iterdir()) == ["l.sqlite"]
    with ledger.open(path, readonly=True) as db:
        assert db.count_runs() == 1 and db.check() == "ok"


def test_read_only_opening_changes_nothing_and_refuses_writes(tmp_path):
    path = tmp_path / "l.sqlite"
    with ledger.open(path) as db:
        db.record_run("bench", [case()], PROV, label="base")
    before = _digest(path)
    with ledger.open(path, readonly=True) as db:
        assert db.get_run("base")["cases"][0]["op"] == "rmsnorm"
        with pytest.raises(ledger.LedgerError, match="read-only"):
            db.record_run("bench", [case()], PROV)
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.sqlite"]  # no WAL side files left


def test_read_only_opening_of_a_missing_path_creates_nothing(tmp_path):
    path = tmp_path / "typo" / "l.sqlite"
    with pytest.raises(ledger.LedgerError, match="no such ledger") as err:
        ledger.open(path, readonly=True)
    assert str(path) in str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [["history"], ["history", "rmsnorm"], ["compare"], ["compare", "a", "b"], ["report"]],
    ids=lambda a: " ".join(a),
)
def test_read_only_commands_on_a_mistyped_path_create_nothing(tmp_path, args, monkeypatch):
    from click.testing import CliRunner

    from kernelab.cli import app

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "typo" / "ledger.sqlite"
    result = CliRunner().invoke(app, [*args, "--ledger", str(path)])
    assert result.exit_code == 2, result.output
    assert "no such ledger" in result.output and str(path) in result.output.replace("\n", "")
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == [], "a read-only command created files"
    # KERNELAB_LEDGER names it the same way
    monkeypatch.setenv("KERNELAB_LEDGER", str(path))
    assert CliRunner().invoke(app, args).exit_code == 2
    assert list(tmp_path.iterdir()) == []
