"""Sweeps on the local engine: the same results as the single commands, workers killed
mid-run, failures with reasons, exactly-once storage, resume, Ctrl-C."""

import json
import os
import signal

import pytest
from click.testing import CliRunner

from kernelab import ledger, sweep
from kernelab.cli import app
from kernelab.ledger import sweeps as lsweeps
from kernelab.sweep import engines, runner, work
from tests.children import children

CHEAP_OPS = ["rmsnorm", "softmax", "silu_and_mul", "gelu_and_mul", "layernorm", "rope", "fp8_quant"]
GPUS = ["H100", "H200", "A100", "B200", "MI300X"]
#: More than 200 cheap tasks: every shape's floor, per op, shape set, dtype and GPU type.
MANY = {"kind": "floors", "ops": CHEAP_OPS, "shape_sets": ["representative", "edge"],
        "targets": GPUS}  # fmt: skip


def _stored(path):
    """(done keys, failed rows, runs of sweeps) of the ledger at ``path``."""
    with ledger.open(path, readonly=True) as db:
        rows = db._db.query("SELECT key, status, attempts, reason, run_id FROM sweep_tasks")
        runs = db._db.query("SELECT id, sweep_id FROM runs WHERE sweep_id IS NOT NULL")
    return rows, runs


def _check_exactly_once(path):
    rows, runs = _stored(path)
    done = [r for r in rows if r[1] == "done"]
    assert len({r[0] for r in rows}) == len(rows)
    assert sorted(r[4] for r in done) == sorted(r[0] for r in runs), "a run without its task"
    assert all(r[4] is None and r[3] for r in rows if r[1] == "failed"), "failure without reason"
    return done, [r for r in rows if r[1] == "failed"]


def test_an_inspect_task_stores_what_kernelab_inspect_reports(tmp_path, monkeypatch):
    """Same findings, registers, occupancy, config and keys as inspect's own planning and
    analysis of the same launches. inspect reads the sweep's compilations from the cache:
    every one is a hit, so the sweep compiled exactly inspect's launches (the cache key is the
    kernel source, signature, constexprs, options, target and versions)."""
    from kernelab import ops
    from kernelab.inspect.ops import plan
    from kernelab.inspect.report import analyze_jobs
    from kernelab.inspect.targets import TARGETS

    monkeypatch.setenv("KERNELAB_CACHE_DIR", str(tmp_path / "cache"))
    # (rmsnorm only: a GEMM's compile takes tens of seconds on a loaded 2-core machine;
    # benchmarks/bench_sweep.py makes the same comparison for rmsnorm and gemm's whole space)
    spec = {"kind": "inspect", "ops": ["rmsnorm"], "dtypes": ["bf16"],
            "shapes": ["mistral-7b decode 1x4096"], "targets": ["sm_90"]}  # fmt: skip
    result = sweep.run_sweep(spec, ledger=tmp_path / "l.sqlite", jobs=2)
    assert result.progress.done == result.progress.total >= 2 and not result.failures
    got = {}
    with ledger.open(tmp_path / "l.sqlite", readonly=True) as db:
        for run_id in result.runs:
            run = db.get_run(run_id)
            assert run["kind"] == "inspect"
            for case in run["cases"]:
                rep = case["metrics"]["report"]
                assert case["metrics"]["registers"] == rep["facts"]["registers"]
                got[rep["key"]] = rep
    shape_keys = {t.shape_key for t in sweep.expand(sweep.validate(spec))[0]}
    jobs = [
        j
        for j in plan([ops.get("rmsnorm")], [TARGETS["sm_90"]], dtypes=["bfloat16"]).jobs
        if j.key.split("/")[4] in shape_keys
    ]  # fmt: skip
    want = {}
    for r in analyze_jobs(jobs, 1, use_cache=True):
        d = r.as_dict()
        assert d.pop("cached"), f"{r.key}: not a launch the sweep compiled"
        want[r.key] = d
    assert len(want) == 2  # with and without the residual
    assert got == want
    assert any(r["facts"]["registers"] for r in got.values())


def test_a_killed_worker_is_retried_nothing_is_stored_twice_and_a_rerun_runs_nothing(tmp_path):
    path = tmp_path / "l.sqlite"
    spec = sweep.validate(MANY)
    tasks, _ = sweep.expand(spec)
    assert len(tasks) >= 200
    eng = engines.LocalEngine(2)
    killed = []

    def progress(p):
        if p.done >= 30 and eng.died == 0 and len(killed) < 10 and eng.busy_pids():
            pid = next(iter(eng.busy_pids()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    with ledger.open(path) as db:
        try:
            result = runner.run(spec, db, eng, progress, tasks=tasks)
        finally:
            eng.close()
    p = result.progress
    assert killed and eng.died >= 1 and p.retried >= 1
    assert p.done + p.failed == len(tasks) and p.duplicates == 0
    done, failed = _check_exactly_once(path)
    assert len(done) == p.done and len(failed) == p.failed
    # every failure is a real one of the task (not the kill): it says why
    assert all("died" not in f["reason"] for f in result.failures)
    again = sweep.run_sweep(spec, ledger=path, jobs=2)
    assert again.progress.stored == p.done and again.progress.done == 0
    assert again.progress.failed == p.failed  # failures are tried again, never skipped
    assert _check_exactly_once(path)[0] == done


def _planted(kill_op=None, raise_op=None):
    def run(task):
        if task.op == kill_op:
            os.kill(os.getpid(), signal.SIGKILL)
        if task.op == raise_op:
            raise ValueError("planted: this task always raises")
        return work.execute(task)

    return run


def test_a_task_that_kills_its_worker_fails_after_bounded_tries_and_a_raise_at_once(tmp_path):
    path = tmp_path / "l.sqlite"
    spec = sweep.validate({"kind": "floors", "ops": ["rmsnorm", "softmax", "silu_and_mul"],
                           "targets": ["H100"], "retries": 2})  # fmt: skip
    tasks, _ = sweep.expand(spec)
    eng = engines.LocalEngine(2, run=_planted(kill_op="softmax", raise_op="silu_and_mul"))
    with ledger.open(path) as db:
        try:
            result = runner.run(spec, db, eng, tasks=tasks)
        finally:
            eng.close()
    by_op = {}
    for f in result.failures:
        by_op.setdefault(f["task"].split()[1], []).append(f)
    n_softmax = sum(t.op == "softmax" for t in tasks)
    assert len(by_op["softmax"]) == n_softmax
    assert all(f["attempts"] == 3 and "killed by signal SIGKILL" in f["reason"]
               and "tried 3 times" in f["reason"] for f in by_op["softmax"])  # fmt: skip
    assert all(f["attempts"] == 1 and "ValueError: planted" in f["reason"]
               for f in by_op["silu_and_mul"])  # fmt: skip
    assert result.progress.done == sum(t.op == "rmsnorm" for t in tasks)
    _, failed = _check_exactly_once(path)
    assert len(failed) == len(result.failures)
    # fixed: the re-run runs only what failed, and stores it
    again = sweep.run_sweep(spec, ledger=path, jobs=2)
    assert again.progress.stored == result.progress.done
    assert again.progress.done == len(result.failures) and not again.failures
    done, failed = _check_exactly_once(path)
    assert len(done) == len(tasks) and not failed


def test_ctrl_c_cancels_running_tasks_keeps_finished_ones_and_the_rerun_finishes(tmp_path):
    path = tmp_path / "l.sqlite"
    spec = sweep.validate(MANY)
    tasks, _ = sweep.expand(spec)
    eng = engines.LocalEngine(2)

    def progress(p):
        if p.done >= 40:
            raise KeyboardInterrupt

    with ledger.open(path) as db, pytest.raises(sweep.SweepInterrupted) as err:
        try:
            runner.run(spec, db, eng, progress, tasks=tasks)
        finally:
            eng.close()
    r = err.value.result
    assert r.interrupted and r.progress.done >= 40 and r.cancelled > 0
    assert r.progress.done + r.progress.failed + r.cancelled == len(tasks)
    assert not children(os.getpid()), "a worker outlived the interrupt"
    done, _ = _check_exactly_once(path)
    assert len(done) == r.progress.done
    again = sweep.run_sweep(spec, ledger=path, jobs=2)
    assert again.progress.stored == r.progress.done
    assert again.progress.done + again.progress.failed == len(tasks) - r.progress.done


def test_the_command_says_what_an_interrupt_kept_and_exits_130(tmp_path, monkeypatch):
    def interrupted(spec, db, eng, progress=None, tasks=None, **kw):
        res = runner.SweepResult("abc123def456", spec.kind, eng.name, runner.Progress(5, 0, 3))
        res.cancelled = 2
        raise runner.SweepInterrupted(res)

    monkeypatch.setattr(runner, "run", interrupted)
    result = CliRunner().invoke(
        app, ["sweep", "floors", "--ops", "rmsnorm", "--ledger", str(tmp_path / "l.sqlite")]
    )
    assert result.exit_code == 130, result.output
    out = " ".join(result.output.split())
    assert "sweep abc123def456: 3 task result(s) stored" in out and "2 cancelled" in out


def test_the_command_prints_plain_progress_when_piped_and_json_and_history(tmp_path):
    db = str(tmp_path / "l.sqlite")
    args = ["sweep", "floors", "--ops", "rmsnorm,softmax", "--target", "H100,B200",
            "--ledger", db]  # fmt: skip
    cli = CliRunner()
    res = cli.invoke(app, args, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "sweep: 12/12 — done 12, failed 0, running 0, queued 0" in res.output
    assert "12 done, 0 failed" in " ".join(res.output.split())
    js = cli.invoke(app, [*args, "--json"])
    assert js.exit_code == 0, js.output
    out = json.loads(js.output)
    assert out["already_stored"] == 12 and out["done"] == 0
    hist = cli.invoke(app, ["history", "--sweep", out["sweep"], "--ledger", db, "--json"])
    assert hist.exit_code == 0, hist.output
    h = json.loads(hist.output)
    assert len(h["tasks"]) == 12 and all(t["status"] == "done" for t in h["tasks"])
    rms = [t for t in h["tasks"] if t["op"] == "rmsnorm" and t["target"] == "H100"]
    from kernelab import ops
    from kernelab.bench import floors
    from kernelab.hardware.devices import lookup

    want = floors(lookup("h100"), [ops.get("rmsnorm")])
    got = [c for t in rms for c in t["cases"]]
    assert sorted((c["shape_key"], c["dtype"], c["metrics"]["floor_s"]) for c in got) == sorted(
        (w["shape_key"], w["dtype"], w["floor_s"]) for w in want
    )
    table = cli.invoke(app, ["history", "--sweep", out["sweep"][:6], "--ledger", db],
                       env={"COLUMNS": "80"})  # fmt: skip
    assert table.exit_code == 0 and "rmsnorm/-" in table.output
    assert max(len(line) for line in table.output.splitlines()) <= 80
    listed = cli.invoke(app, ["history", "--sweeps", "--ledger", db, "--json"])
    assert [s["id"] for s in json.loads(listed.output)["sweeps"]] == [out["sweep"]]
    bad = cli.invoke(app, ["history", "--sweep", "ffff0000", "--ledger", db])
    assert bad.exit_code == 2 and "no sweep 'ffff0000'" in bad.output


def test_verify_and_bench_sweeps_on_cpu_store_what_the_instruments_report(tmp_path):
    from kernelab.verify import verify

    path = tmp_path / "l.sqlite"
    spec = {"kind": "verify", "ops": ["silu_and_mul"], "variants": ["torch"], "dtypes": ["fp32"],
            "shape_sets": ["edge"], "seeds": [7], "trials": 1}  # fmt: skip
    res = sweep.run_sweep(spec, ledger=path, jobs=1)
    assert res.progress.done == 1 and not res.failures
    want = verify(["silu_and_mul"], variants=["torch"], shape_sets=["edge"], dtypes=["float32"],
                  device="cpu", seed=7, trials=1)  # fmt: skip
    with ledger.open(path, readonly=True) as db:
        run = db.get_run(res.runs[0])
    assert [(c["shape_key"], c["metrics"]["passed"]) for c in run["cases"]] == [
        (c.shape_key, c.passed) for c in want.cases
    ]
    assert [c["metrics"]["result"]["trials"] for c in run["cases"]] == [
        c.trials for c in want.cases
    ], "not the same seeds and inputs"
    bench_spec = {"kind": "bench", "ops": ["rmsnorm"], "variants": ["torch"], "dtypes": ["fp32"],
                  "shapes": ["decode 1x4096"], "max_rows": 1}  # fmt: skip
    res = sweep.run_sweep(bench_spec, ledger=path, jobs=1)
    assert res.progress.done == 1 and not res.failures, res.failures
    with ledger.open(path, readonly=True) as db:
        run = db.get_run(res.runs[0])
    assert run["kind"] == "bench" and run["cases"]
    c = run["cases"][0]
    assert c["variant"] == "torch" and c["n_samples"] >= 10 and c["metrics"]["median_s"] > 0
    assert "bench" in run["provenance"] and run["provenance"]["sweep_task"]["kind"] == "bench"


def test_a_result_for_a_stored_key_is_dropped_in_the_same_transaction(tmp_path):
    """The idempotent insert itself, and a planted second write of one key."""
    task = {"key": "k1", "kind": "floors", "op": "rmsnorm", "variant": "-", "shape_key": "s",
            "dtype": "float32", "config": "default", "target": "H100"}  # fmt: skip
    case = {"op": "rmsnorm", "variant": "-", "shape_key": "s", "dtype": "float32",
            "device": "H100", "mode": "floor", "metrics": {"floor_s": 1e-6}}  # fmt: skip
    with ledger.open(tmp_path / "l.sqlite") as db:
        lsweeps.start_sweep(db, "sw1", {"kind": "floors"}, {})
        assert lsweeps.record_failure(db, "sw1", task, "worker died", 3)
        first = lsweeps.record_task(db, "sw1", task, "floors", [case], {"device": {}})
        assert first is not None
        assert lsweeps.record_task(db, "sw2", task, "floors", [case], {"device": {}}) is None
        assert not lsweeps.record_failure(db, "sw2", task, "late failure", 1)
        assert db.count_runs() == 1 and lsweeps.done_keys(db) == {"k1"}
        with pytest.raises(ValueError, match=r"task\.target: expected a string"):
            lsweeps.record_task(db, "sw1", {**task, "key": "k2", "target": None}, "floors", [], {})
        assert db.count_runs() == 1


_AFTER_A_PARALLEL_REGION = """
import torch
from kernelab import sweep
from kernelab.sweep import engines

src = torch.randint(0, 255, (64 << 20,), dtype=torch.uint8)
torch.empty_like(src).copy_(src)  # the parent runs an OpenMP parallel region first


def run(task):
    dst = torch.empty_like(src)
    dst.copy_(src)  # and so does the worker: hung forever with the parent's thread count
    return {"threads": torch.get_num_threads(), "equal": bool(torch.equal(dst, src))}


tasks, _ = sweep.expand(sweep.validate({"kind": "floors", "ops": ["rmsnorm"], "targets": ["H100"]}))
eng = engines.LocalEngine(1, run=run)
try:
    eng.submit(tasks[0])
    out = []
    while not out:
        out = eng.poll(5.0)
    print(out[0][1], out[0][2])
finally:
    eng.close()
"""


def test_a_local_worker_runs_torch_after_the_parent_ran_a_parallel_region(tmp_path):
    """A fork copies no OpenMP worker threads: a worker entering a parallel region with the
    parent's thread count waits on them forever. A fresh interpreter makes the parent's
    parallel region certain (a test process may or may not have run one)."""
    import subprocess
    import sys

    script = tmp_path / "fork_after_parallel.py"
    script.write_text(_AFTER_A_PARALLEL_REGION)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the hung worker too
        proc.communicate()
        pytest.fail("the local worker hung in its first parallel region")
    assert proc.returncode == 0, stderr[-2000:]
    assert stdout.split()[0] == "ok", stdout
    assert "'threads': 1" in stdout and "'equal': True" in stdout
