"""Sweeps in the ledger: version-1 ledgers migrate (SQLite and PostgreSQL) and stay readable;
8 concurrent sweeps into one ledger lose and duplicate nothing."""

import multiprocessing
import sqlite3

import orjson
import pytest

from kernelab import ledger, sweep
from kernelab.ledger import sweeps as lsweeps
from kernelab.ledger.schema import DDL, SCHEMA_VERSION
from tests.test_ledger_server import pg  # noqa: F401  (the real server fixture)

#: Schema version 1 as it was: no sweep tables, no runs.sweep_id.
V1_DDL = [s.replace(",\n        sweep_id TEXT", "") for s in DDL if "sweep" not in s.split("(")[0]]
V1_DDL = [s for s in V1_DDL if "runs_by_sweep" not in s]
SPEC = {"kind": "floors", "ops": ["rmsnorm"], "targets": ["H100"]}


def _v1_statements():
    yield from V1_DDL
    yield "INSERT INTO schema_version (app, version, created) VALUES ('kernelab', 1, 'x')"
    yield (
        "INSERT INTO runs (id, kind, label, created, device_key, provenance) VALUES "
        "('oldrun000001', 'bench', 'before', '2026-01-01T00:00:00', 'cpu|2|8GB', '{}')"
    )
    yield (
        "INSERT INTO cases (run_id, idx, op, variant, shape_key, shape_label, dtype, device, "
        "mode, metrics, flags, n_samples, samples) VALUES ('oldrun000001', 0, 'rmsnorm', "
        "'torch', 's', 's', 'float32', 'cpu', 'hot', '{\"median_s\": 1e-05}', '[]', 0, NULL)"
    )


def _check_migration(url):
    with ledger.open(url, readonly=True) as db:  # read as it is: history, compare, report
        assert db.version == 1 and db.get_run("before")["cases"][0]["op"] == "rmsnorm"
        assert lsweeps.list_sweeps(db) == [] and lsweeps.done_keys(db) == set()
        with pytest.raises(ledger.LedgerError, match="schema version 1 has no sweeps"):
            lsweeps.get_sweep(db, "abcd")
    result = sweep.run_sweep(SPEC, ledger=url, jobs=1)  # a writer migrates, then sweeps
    assert result.progress.done == result.progress.total > 0
    with ledger.open(url, readonly=True) as db:
        assert db.version == SCHEMA_VERSION
        run = db.get_run("before")
        assert run["id"] == "oldrun000001" and run["cases"][0]["metrics"] == {"median_s": 1e-5}
        got = lsweeps.get_sweep(db, result.id)
        assert len(got["tasks"]) == result.progress.total
        assert db.count_runs() == 1 + result.progress.done
    with ledger.open(url) as db:  # opening again migrates nothing twice
        assert db.version == SCHEMA_VERSION and db.count_runs() == 1 + result.progress.done


def test_a_version_1_sqlite_ledger_is_migrated_by_a_writer_and_read_as_is_by_readers(tmp_path):
    path = tmp_path / "v1.sqlite"
    con = sqlite3.connect(path)
    for stmt in _v1_statements():
        con.execute(stmt)
    con.commit()
    con.close()
    _check_migration(str(path))
    con = sqlite3.connect(path)
    cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
    assert cols[-1] == "sweep_id" and con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()


def test_a_version_1_postgresql_ledger_is_migrated(pg):  # noqa: F811
    import uuid

    database = pg.createdb(f"t_{uuid.uuid4().hex[:12]}")
    sql = []
    for stmt in _v1_statements():
        stmt = stmt.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
        sql.append(stmt.replace("BLOB", "BYTEA").replace("REAL", "DOUBLE PRECISION"))
    pg.psql(database, "; ".join(sql))
    _check_migration(pg.url(database))


def _one_sweep(url, spec, out):
    result = sweep.run_sweep(spec, ledger=url, jobs=1)
    with open(out, "wb") as f:
        f.write(orjson.dumps(result.as_dict()))


OPS = ["rmsnorm", "softmax", "silu_and_mul", "gelu_and_mul", "layernorm", "rope", "fp8_quant",
       "merge_attention_states"]  # fmt: skip


def _eight_sweeps(url, tmp_path):
    """8 processes, each sweeping 2 of 8 ops (every op in two sweeps), at the same time."""
    specs = [
        {"kind": "floors", "ops": [OPS[i], OPS[(i + 1) % 8]], "targets": ["H100", "B200"]}
        for i in range(8)
    ]
    ctx = multiprocessing.get_context("fork")
    procs = []
    for i, spec in enumerate(specs):
        p = ctx.Process(target=_one_sweep, args=(url, spec, tmp_path / f"r{i}.json"))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(240)
        assert p.exitcode == 0
    results = [orjson.loads((tmp_path / f"r{i}.json").read_bytes()) for i in range(8)]
    union = {t.key for s in specs for t in sweep.expand(sweep.validate(s))[0]}
    assert sum(r["tasks"] for r in results) == 2 * len(union)  # every task in two sweeps
    for r in results:
        assert r["done"] + r["duplicates_dropped"] + r["already_stored"] == r["tasks"]
        assert not r["failures"]
    assert sum(r["done"] for r in results) == len(union), "a result lost or stored twice"
    with ledger.open(url, readonly=True) as db:
        assert lsweeps.done_keys(db) == union
        runs = db._db.query("SELECT id FROM runs WHERE sweep_id IS NOT NULL")
        linked = db._db.query("SELECT run_id FROM sweep_tasks WHERE status = 'done'")
        assert sorted(r[0] for r in runs) == sorted(r[0] for r in linked)
        assert len(runs) == len(union)
        assert all(db.get_run(r[0], samples=False)["cases"] for r in runs)


def test_eight_concurrent_sweeps_into_one_sqlite_ledger(tmp_path):
    _eight_sweeps(str(tmp_path / "l.sqlite"), tmp_path)


def test_eight_concurrent_sweeps_into_one_postgresql_ledger(pg, tmp_path):  # noqa: F811
    import uuid

    _eight_sweeps(pg.url(pg.createdb(f"t_{uuid.uuid4().hex[:12]}")), tmp_path)


def test_the_report_reads_a_sweeps_bench_verify_and_inspect_runs_and_only_those(tmp_path):
    from click.testing import CliRunner

    from kernelab.cli import app
    from tests.report_fixtures import provenance, synthetic_cases, verify_cases

    path = tmp_path / "l.sqlite"
    row = {"kind": "bench", "op": "rmsnorm", "variant": "torch", "shape_key": "representative",
           "dtype": "bfloat16", "config": "default", "target": "cpu"}  # fmt: skip
    with ledger.open(path) as db:
        lsweeps.start_sweep(db, "abcdef123456", {"kind": "bench"}, {})
        mine = lsweeps.record_task(db, "abcdef123456", {**row, "key": "b1"}, "bench",
                                   synthetic_cases(1), provenance())  # fmt: skip
        checked = lsweeps.record_task(db, "abcdef123456", {**row, "kind": "verify", "key": "v1"},
                                      "verify", verify_cases(), provenance())  # fmt: skip
        lsweeps.record_task(db, "abcdef123456", {**row, "kind": "floors", "key": "f0"}, "floors",
                            [], provenance())  # fmt: skip
        other = db.record_run("bench", synthetic_cases(2), provenance(), label="not-the-sweep")
        lsweeps.start_sweep(db, "fedcba654321", {"kind": "floors"}, {})
        lsweeps.record_task(db, "fedcba654321", {**row, "kind": "floors", "key": "f1"}, "floors",
                            [], provenance())  # fmt: skip
    cli = CliRunner()
    out = tmp_path / "r.html"
    res = cli.invoke(app, ["report", "--sweep", "abcdef", "--ledger", str(path), "-o", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert mine in text and checked in text and other not in text
    assert '<section class="run verify">' in text and "floors run" not in text
    res = cli.invoke(app, ["report", "--sweep", "fedcba654321", "--ledger", str(path)])
    assert res.exit_code == 2 and "stored no bench, verify or inspect runs" in " ".join(
        res.output.split()
    )
    res = cli.invoke(app, ["report", other, "--sweep", "abcdef", "--ledger", str(path)])
    assert res.exit_code == 2 and "not both" in res.output
