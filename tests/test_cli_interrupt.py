"""Ctrl-C: a command says what it kept (stored, written) and what not, and exits 130."""

import pytest
from click.testing import CliRunner

from kernelab import ledger
from kernelab.cli import app
from kernelab.stages import StageReport

runner = CliRunner()


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("KERNELAB_LEDGER", str(path))
    return path


def test_bench_interrupted_mid_case_says_nothing_was_stored(db_path, monkeypatch):
    def interrupted(ops, device, cfg, candidate=None, db=None, progress=None, remeasure=True):
        progress("bench rmsnorm decode 1x4096 bfloat16 (3/10)")
        raise KeyboardInterrupt

    monkeypatch.setattr("kernelab.bench.bench", interrupted)
    result = runner.invoke(app, ["bench", "rmsnorm", "--device", "cpu"])
    assert result.exit_code == 130, result.output
    out = " ".join(result.output.split())
    assert "interrupted while bench rmsnorm decode 1x4096 bfloat16 (3/10)" in out
    assert "kept: nothing (nothing was stored or written)" in out
    assert "not kept: the case being timed (finished cases are stored on Ctrl-C)" in out
    assert "Aborted" not in out and "Traceback" not in out
    with ledger.open(str(db_path)) as db:
        assert db.list_runs() == []


def test_ceilings_interrupted_lists_the_ceilings_stored(db_path, monkeypatch):
    rows = [
        {"name": name, "value": 1e9, "unit": "B/s", "source": "test"}
        for name in ("copy", "matmul_float32", "matmul_bfloat16")
    ]
    monkeypatch.setattr("kernelab.bench.roofline.measure", lambda *a, **k: rows)
    stored = []

    class Db:
        def put_ceiling(self, key, name, *rest):
            if len(stored) == 2:
                raise KeyboardInterrupt
            stored.append(name)

    monkeypatch.setattr("kernelab.bench.open_ledger", lambda url=None: Db())
    result = runner.invoke(app, ["ceilings", "--device", "cpu"])
    assert result.exit_code == 130, result.output
    assert "kept:" in result.output and "not kept: the ceilings measured so far" in result.output
    for name in stored:
        assert f"• ceiling {name} of " in result.output
    assert "matmul_bfloat16 of" not in result.output


def test_run_interrupted_names_the_finished_stages(monkeypatch):
    def verify_stage(ops, info, progress, **options):
        return StageReport("verify")

    def inspect_stage(ops, info, progress, **options):
        progress("inspect: compiled 2/18 for sm_90")
        raise KeyboardInterrupt

    stages = iter([verify_stage, inspect_stage])
    monkeypatch.setattr("kernelab.cli.run_cmd.load", lambda path: next(stages))
    result = runner.invoke(app, ["run", "rmsnorm", "--device", "cpu"])
    assert result.exit_code == 130, result.output
    out = " ".join(result.output.split())
    assert "interrupted while inspect: compiled 2/18 for sm_90" in out
    assert "not kept: the results of the finished stages (verify)" in out


def test_verify_interrupted_gives_the_seed_to_repeat_it(monkeypatch):
    def interrupted(*args, **kwargs):
        kwargs["progress"]("rmsnorm/torch edge 1x7 float32")
        raise KeyboardInterrupt

    monkeypatch.setattr("kernelab.verify.verify", interrupted)
    result = runner.invoke(app, ["verify", "rmsnorm", "--device", "cpu", "--seed", "7"])
    assert result.exit_code == 130, result.output
    assert "repeat with --seed 7" in result.output
    assert "interrupted while rmsnorm/torch edge 1x7 float32" in result.output
