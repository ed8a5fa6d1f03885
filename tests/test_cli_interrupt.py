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
    assert "repeat with --seed 7" in " ".join(result.output.split())
    assert "interrupted while rmsnorm/torch edge 1x7 float32" in result.output


def _bench_until(second_op: str, tmp_path):
    """Start ``kernelab bench rmsnorm SECOND_OP`` on the CPU in a process of its own; return
    it once its progress says rmsnorm's cases are finished (the second op has begun)."""
    import os
    import subprocess
    import sys
    import time

    from tests import children

    env = {**os.environ, "PYTHONPATH": children.SRC, "KERNELAB_LEDGER": str(tmp_path / "l.sqlite")}
    env["KERNELAB_CACHE_DIR"] = str(tmp_path / "cache")
    args = ["bench", "rmsnorm", second_op, "--device", "cpu", "--variant", "torch"]
    args += ["--dtype", "float32", "--shape", "decode", "--max-time", "0.05", "--min-samples", "3"]
    args += ["--ceilings", "stored"]
    proc = subprocess.Popen(
        [sys.executable, "-c", children._AS_FROM_A_SHELL, "-m", "kernelab", *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines, deadline = [], time.monotonic() + 240
    for line in proc.stderr:
        lines.append(line)
        if f"bench {second_op}" in line or time.monotonic() > deadline:
            break
    return proc, lines


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="signals")
def test_a_sigterm_to_bench_stores_the_finished_cases_and_exits_143(tmp_path):
    import signal

    proc, lines = _bench_until("silu_and_mul", tmp_path)
    try:
        assert proc.poll() is None, "".join(lines)
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = " ".join((("".join(lines)) + rest).split())
    assert proc.returncode == 143, out[-3000:]  # was -15: ended at once, nothing stored
    assert "Traceback" not in out, out[-3000:]
    with ledger.open(str(tmp_path / "l.sqlite"), readonly=True) as db:
        (run,) = db.list_runs()
        stored = db.get_run(run["id"], samples=False)
    assert stored["cases"] and {c["op"] for c in stored["cases"]} >= {"rmsnorm"}
    assert stored["provenance"]["bench"]["interrupted"] is True
