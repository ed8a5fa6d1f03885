"""verify stores its runs: every case with its verdict, error, bound and seed; history and the
report show them; a failed ledger write keeps the run beside the ledger (verify and bench,
through the one recording function)."""

import errno
import json

import pytest
from click.testing import CliRunner

from kernelab import ledger
from kernelab.cli import app
from kernelab.ledger._sqlite import SQLiteBackend
from tests.test_verify_cli import GOOD

runner = CliRunner()
FAST = ["--shapes", "edge", "--dtype", "float32", "--trials", "1", "--device", "cpu"]
ONE = ["rmsnorm", "--variant", "torch", *FAST]


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("KERNELAB_LEDGER", str(path))
    return path


def test_a_verify_run_is_stored_case_by_case_and_drawn(db_path, tmp_path):
    result = runner.invoke(app, ["verify", *ONE, "--seed", "7", "--json", "--label", "v1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    with ledger.open(db_path) as db:
        run = db.get_run(db.resolve("latest", kind="verify"))
    assert run["id"] == data["run_id"] and run["label"] == "v1" and run["kind"] == "verify"
    assert len(run["cases"]) == len(data["cases"]) > 0
    assert run["provenance"]["verify"]["seed"] == 7
    assert "--seed 7" in run["provenance"]["verify"]["repeat"]
    for stored, case in zip(run["cases"], data["cases"], strict=True):
        m = stored["metrics"]
        assert (stored["op"], stored["variant"], stored["dtype"]) == ("rmsnorm", "torch", "float32")
        assert stored["shape_label"] == case["shape"] and stored["mode"] == "verify"
        assert m["passed"] is True and m["seed"] == 7 and m["shape_set"] == "edge"
        if case["measures"]:
            assert m["error"] == case["measures"][0]["rel_l2"] and m["tolerance"] > 0
    out = tmp_path / "v.html"
    page = runner.invoke(app, ["report", "latest", "--kind", "verify", "--out", str(out)])
    assert page.exit_code == 0, page.output
    assert f"verify run {run['id']}" in out.read_text()
    hist = runner.invoke(app, ["history", "rmsnorm", "--json"])
    rows = json.loads(hist.stdout)["cases"]
    assert rows and all(r["verdict"].startswith("pass") for r in rows)
    runs = runner.invoke(app, ["history"])
    assert "verify" in runs.output and run["id"] in runs.output


def test_a_failing_case_is_stored_with_its_class(db_path, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(GOOD)
    args = ["verify", "--candidate", f"{path}:skips_last_row", "--op", "rmsnorm", *FAST]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 1, result.output
    with ledger.open(db_path) as db:
        cases = db.get_run(json.loads(result.stdout)["run_id"])["cases"]
    failed = [c for c in cases if not c["metrics"]["passed"]]
    assert failed and all(c["flags"] and c["metrics"]["failure_class"] for c in failed)


def test_no_ledger_stores_nothing(db_path):
    result = runner.invoke(app, ["verify", *ONE, "--no-ledger", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["run_id"] is None
    assert not db_path.exists()


def test_a_selection_of_nothing_is_an_error(db_path):
    result = runner.invoke(app, ["verify", "rmsnorm", "--dtype", "fp64", "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert "nothing selected can be checked here" in result.output
    assert "dtype float64 not supported" in result.output


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    "command",
    [
        ["verify", *ONE],
        [
            "bench",
            "rmsnorm",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--max-time",
            "0.1",
            "--min-samples",
            "3",
            "--shape",
            "decode 1x4096",
            "--variant",
            "torch",
        ],
    ],
)
def test_a_failed_ledger_write_keeps_the_run_beside_the_ledger(command, db_path, monkeypatch):
    ledger.open(db_path).close()  # the ledger exists; every write then fails
    monkeypatch.setattr(SQLiteBackend, "write", _full_disk)
    result = runner.invoke(app, command)
    assert result.exit_code == 1, result.output
    (saved,) = sorted(db_path.parent.glob("*.unrecorded-*.json"))
    assert str(saved) in result.stderr.replace("\n", "") and "No space left" in result.stderr
    run = json.loads(saved.read_bytes())["run"]
    assert run["kind"] == command[0] and run["cases"]
    monkeypatch.undo()
    with ledger.open(db_path) as db:  # the kept run stores as it is
        assert db.count_runs() == 0
        assert len(db.get_run(db.record_run(**run))["cases"]) == len(run["cases"])


def test_record_or_keep_keeps_a_run_when_the_ledger_cannot_be_opened(tmp_path):
    bad = tmp_path / "not-a-ledger.sqlite"
    bad.write_text("this is no database")
    case = {"op": "x", "variant": "v", "shape_key": "k", "dtype": "float32", "device": "cpu",
            "mode": "verify", "metrics": {"passed": True}}  # fmt: skip
    rec = ledger.record_or_keep(str(bad), "verify", [case], {"device": {}}, "l")
    assert rec.run_id is None and rec.path.exists() and str(bad) in rec.error
    assert json.loads(rec.path.read_bytes())["run"]["cases"] == [case]
