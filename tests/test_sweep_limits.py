"""Sweeps given bad input: a spec file nested too deeply or too large, a tuning space of plain
values, more tasks than the limit, a config table that selects nothing, a full disk mid-run."""

import errno
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelab import sweep
from kernelab.cli import app
from kernelab.ledger import SQLiteBackend
from kernelab.sweep import spec as spec_mod

runner = CliRunner()


def _invoke(args, **kw):
    return runner.invoke(app, args, env={"COLUMNS": "300", **kw.pop("env", {})}, **kw)


def _one_line(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("arrays.toml", 'kind = "floors"\nx = ' + "[" * 20_000 + "]" * 20_000 + "\n"),
        ("tables.toml", 'kind = "floors"\nx = ' + "{a = " * 8_000 + "1" + "}" * 8_000 + "\n"),
        ("arrays.json", '{"kind": "floors", "x": ' + "[" * 20_000 + "]" * 20_000 + "}"),
        ("shallow.toml", 'kind = "floors"\nx = ' + "[" * 40 + "]" * 40 + "\n"),
    ],
)
def test_a_deeply_nested_spec_file_is_one_error_naming_the_file_and_the_limit(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    result = _invoke(["sweep", "--spec", str(path), "--dry-run"])
    assert result.exit_code == 2, result.output
    out = _one_line(result)
    assert "Traceback" not in result.output and "RecursionError" not in out
    assert str(path) in out and f"{spec_mod.MAX_DEPTH} levels" in out, out


def test_a_spec_file_at_the_depth_limit_parses(tmp_path):
    # the spec's own keys are 3 levels deep (the file's table, configs, a config's table)
    path = tmp_path / "s.toml"
    path.write_text('kind = "inspect"\nops = ["rmsnorm"]\nconfigs = [{num_warps = 4}]\n')
    assert spec_mod.MAX_DEPTH >= 3
    assert sweep.load(path)["configs"] == [{"num_warps": 4}]


def test_a_spec_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text('kind = "floors"\n' + "#" * spec_mod.MAX_SPEC_BYTES + "\n")
    result = _invoke(["sweep", "--spec", str(path), "--dry-run"])
    assert result.exit_code == 2, result.output
    out = _one_line(result)
    assert str(path) in out and f"{spec_mod.MAX_SPEC_BYTES:,} bytes" in out, out


def test_a_space_of_plain_values_makes_tasks_and_a_table_is_refused_by_name():
    from kernelab import ops

    op = ops.get("moe_topk")
    shape = op.shapes("representative")[0]
    values = op.tuning_space(shape, op.dtypes[0])
    assert values and all(isinstance(v, int) for v in values)  # tokens per program
    spec = sweep.validate({"kind": "inspect", "ops": ["moe_topk"], "configs": "space"})
    tasks, _ = sweep.expand(spec)
    configs = {t.config for t in tasks if t.shape_key == shape.key}
    assert configs == {json.dumps(v) for v in values}
    result = _invoke(["sweep", "inspect", "--ops", "moe_topk", "--configs", "space", "--dry-run"])
    assert result.exit_code == 0, result.output
    table = sweep.validate({**spec.as_dict(), "configs": [{"num_warps": 4}]})
    with pytest.raises(ValueError, match=r"spec\.configs\[0\]: moe_topk's configs are plain"):
        sweep.expand(table)


def test_a_config_the_task_key_cannot_hold_is_named_before_any_task_is_made(monkeypatch):
    from kernelab import ops

    op = ops.get("rmsnorm")
    monkeypatch.setattr(op, "tuning_space", lambda shape, dtype: [object()])
    spec = sweep.validate({"kind": "inspect", "ops": ["rmsnorm"], "configs": "space"})
    with pytest.raises(ValueError, match=r"rmsnorm: tuning_space\(.*\)\[0\]: a config of type"):
        sweep.expand(spec)


def test_more_tasks_than_the_limit_are_refused_before_expanding(tmp_path):
    seeds = ",".join(map(str, range(2_000_000)))
    args = ["sweep", "verify", "--ops", "rmsnorm", "--variant", "torch", "--seeds", seeds]
    started = time.perf_counter()
    result = _invoke([*args, "--dry-run", "--ledger", str(tmp_path / "l.sqlite")])
    took = time.perf_counter() - started
    assert result.exit_code == 2, result.output[-2000:]
    out = _one_line(result)
    limit = f"{sweep.DEFAULT_MAX_TASKS:,}"
    assert limit in out and "--max-tasks" in out and "KERNELAB_SWEEP_MAX_TASKS" in out, out
    assert took < 30, f"refused after {took:.0f} s"  # was: over 120 s and 2 GB


@pytest.mark.parametrize(
    "raw",
    [
        {"kind": "inspect", "ops": ["rmsnorm", "gemm"], "configs": "space",
         "targets": ["sm_80", "gfx942"]},
        {"kind": "inspect", "ops": ["rmsnorm"], "configs": [{"num_warps": 4}], "shapes": ["dec"]},
        {"kind": "tune", "ops": ["rmsnorm", "moe_align"], "targets": ["sm_90", "H100"]},
        {"kind": "verify", "ops": ["rmsnorm", "softmax"], "seeds": [1, 2], "dtypes": ["fp32"]},
        {"kind": "bench", "ops": ["rmsnorm", "gemm"], "variants": ["torch"]},
        {"kind": "floors", "ops": ["rmsnorm"], "shape_sets": ["representative", "edge"],
         "targets": ["H100", "B200"]},
    ],
)  # fmt: skip
def test_the_count_checked_before_expanding_is_the_number_of_tasks(raw):
    spec = sweep.validate(raw)
    assert sweep.count(spec) == len(sweep.expand(spec)[0]) > 0


def test_the_task_limit_is_raised_by_the_option_or_the_environment(tmp_path):
    args = ["sweep", "verify", "--ops", "rmsnorm", "--variant", "torch", "--seeds", "1,2"]
    args += ["--dtype", "fp32,bf16", "--dry-run", "--json", "--ledger", str(tmp_path / "l")]
    low = _invoke(args, env={"KERNELAB_SWEEP_MAX_TASKS": "3"})
    assert low.exit_code == 2 and "spec: 4 tasks, more than" in _one_line(low), low.output
    assert _invoke([*args, "--max-tasks", "3"]).exit_code == 2
    ok = _invoke([*args, "--max-tasks", "4"], env={"KERNELAB_SWEEP_MAX_TASKS": "3"})
    assert ok.exit_code == 0 and json.loads(ok.output)["tasks"] == {"verify": 4}, ok.output
    bad = _invoke(args, env={"KERNELAB_SWEEP_MAX_TASKS": "many"})
    assert bad.exit_code == 2 and "KERNELAB_SWEEP_MAX_TASKS" in _one_line(bad), bad.output


def test_a_config_table_that_matches_nothing_is_an_error_naming_it(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text(
        'kind = "inspect"\nops = ["rmsnorm"]\nconfigs = [{num_warps = 4}, {num_warps = 3}]\n'
    )
    result = _invoke(["sweep", "--spec", str(spec), "--ledger", str(tmp_path / "l.sqlite")])
    assert result.exit_code == 2, result.output
    out = _one_line(result)
    assert "spec.configs[1]" in out and "num_warps = 3" in out and "matches no config" in out
    assert not (tmp_path / "l.sqlite").exists()


def test_a_spec_that_selects_no_task_is_an_error_saying_why(tmp_path):
    result = _invoke(["sweep", "tune", "--ops", "moe_align", "--dry-run"])
    assert result.exit_code == 2, result.output
    out = _one_line(result)
    assert "no task to run" in out and "moe_align: declares no tuning space" in out, out


@pytest.mark.parametrize("error", ["os", "sqlite"])
def test_a_full_disk_at_the_start_of_a_sweep_is_one_line(tmp_path, monkeypatch, error):
    """The ledger cannot take the sweep's own row: one line naming the ledger and the cause,
    exit 2, no task run."""
    import sqlite3

    path = tmp_path / "l.sqlite"
    real, ran = SQLiteBackend.write, []

    def full(self, fn):
        if error == "os":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, lambda conn: fn(_Full(conn)))

    class _Full:  # a connection whose every statement meets a full disk
        def __init__(self, conn):
            self.conn = conn

        def execute(self, *args):
            raise sqlite3.OperationalError("database or disk is full")

        executemany = execute

    from kernelab.sweep import work

    monkeypatch.setattr(SQLiteBackend, "write", full)
    monkeypatch.setattr(work, "_floors", lambda task: ran.append(task))
    args = ["sweep", "floors", "--ops", "rmsnorm", "--target", "H100", "-j", "1"]
    result = _invoke([*args, "--ledger", str(path)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    out = _one_line(result)
    assert str(path) in out, out
    if error == "os":
        assert "No space left on device" in out and "was not started" in out, out
    else:
        assert "database or disk is full (is its disk full or failing?)" in out, out
    assert not ran


def test_a_full_disk_mid_sweep_keeps_every_finished_result_and_says_where(tmp_path, monkeypatch):
    path = tmp_path / "l.sqlite"
    real, calls = SQLiteBackend.write, []

    def filling(self, fn):
        calls.append(fn)
        if len(calls) > 3:  # the sweep's row, then two results; then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, fn)

    monkeypatch.setattr(SQLiteBackend, "write", filling)
    args = ["sweep", "floors", "--ops", "rmsnorm,softmax", "--target", "H100,B200", "-j", "1"]
    result = _invoke([*args, "--ledger", str(path), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["done"] == 2 and data["ledger_error"] and "No space left" in data["ledger_error"]
    kept = [Path(p) for p in data["unrecorded"]]
    assert kept and all(p.exists() for p in kept)
    assert data["done"] + len(kept) + data["cancelled"] == data["tasks"]
    err = " ".join(result.stderr.split())
    assert all(p.name in err for p in kept), err
    for p in kept:
        run = json.loads(p.read_bytes())["run"]
        assert run["kind"] == "floors" and run["cases"]
    monkeypatch.undo()
    from kernelab import ledger
    from kernelab.ledger import sweeps

    with ledger.open(path, readonly=True) as db:
        assert len(sweeps.done_keys(db)) == 2
