"""Sweeps on a local Ray (2 CPUs, one for the whole module): inspect parity, a worker killed
mid-run, exactly-once storage and resume. Skipped without Ray (the ``ray`` extra)."""

import os
import signal
import time

import pytest

from kernelab import ledger, sweep
from kernelab.sweep import engines, runner
from tests.test_sweep import MANY, _check_exactly_once

ray = pytest.importorskip("ray")
#: A local Ray takes seconds to start and its workers import torch: well over a few seconds.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """One local Ray for the module; its workers get this process's environment at start."""
    cache = tmp_path_factory.mktemp("ray-cache")
    saved = {k: os.environ.get(k) for k in ("KERNELAB_CACHE_DIR", "PYTHONPATH")}
    os.environ["KERNELAB_CACHE_DIR"] = str(cache)
    engines._workers_import_this_kernelab()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield cache
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_a_killed_ray_worker_is_retried_and_nothing_is_stored_twice(local_ray, tmp_path):
    path = tmp_path / "l.sqlite"
    spec = sweep.validate(MANY)
    tasks, _ = sweep.expand(spec)
    assert len(tasks) >= 200
    eng = engines.RayEngine()
    assert not eng._started, "the module's Ray is used, not a new one"
    killed, last = [], [0.0]

    def progress(p):
        # a pid that returned a result runs the next task; kill one until a death is seen
        now = time.monotonic()
        if p.done >= 30 and eng.died == 0 and len(killed) < 8 and now - last[0] > 2:
            for pid in sorted(eng.pids - set(killed)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                killed.append(pid)
                last[0] = now
                break

    with ledger.open(path) as db:
        try:
            result = runner.run(spec, db, eng, progress, tasks=tasks)
        finally:
            eng.close()
    p = result.progress
    assert killed and eng.died >= 1 and p.retried >= 1
    assert p.done + p.failed == len(tasks) and p.duplicates == 0
    assert all("died" not in f["reason"] and "Worker" not in f["reason"] for f in result.failures)
    done, failed = _check_exactly_once(path)
    assert len(done) == p.done and len(failed) == p.failed
    eng = engines.RayEngine()
    with ledger.open(path) as db:
        try:
            again = runner.run(spec, db, eng, tasks=tasks)
        finally:
            eng.close()
    assert again.progress.stored == p.done and again.progress.done == 0
    assert _check_exactly_once(path)[0] == done


def test_an_inspect_sweep_on_ray_stores_what_kernelab_inspect_reports(local_ray, tmp_path):
    from kernelab import ops
    from kernelab.inspect.ops import plan
    from kernelab.inspect.report import analyze_jobs
    from kernelab.inspect.targets import TARGETS

    spec = {"kind": "inspect", "ops": ["rmsnorm"], "dtypes": ["bf16"],
            "shapes": ["qwen2.5-7b decode 1x3584"], "targets": ["sm_80"]}  # fmt: skip
    result = sweep.run_sweep(spec, ledger=tmp_path / "l.sqlite", engine="ray")
    assert result.engine == "ray" and result.progress.done == 2 and not result.failures
    with ledger.open(tmp_path / "l.sqlite", readonly=True) as db:
        got = {
            c["metrics"]["report"]["key"]: c["metrics"]["report"]
            for rid in result.runs
            for c in db.get_run(rid)["cases"]
        }
    keys = {t.shape_key for t in sweep.expand(sweep.validate(spec))[0]}
    jobs = [
        j
        for j in plan([ops.get("rmsnorm")], [TARGETS["sm_80"]], dtypes=["bfloat16"]).jobs
        if j.key.split("/")[4] in keys
    ]
    want = {}
    for r in analyze_jobs(jobs, 1, use_cache=True):  # the Ray workers' compilations
        d = r.as_dict()
        assert d.pop("cached"), f"{r.key}: not a launch the Ray workers compiled"
        want[r.key] = d
    assert got == want and len(got) == 2
