"""Several processes writing one ledger lose nothing; a writer killed mid-run leaves no trace."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from kernelab import ledger

SRC = str(Path(__file__).resolve().parents[1] / "src")

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kernelab import ledger
    path, name, runs, gate = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    db = ledger.open(path)
    prov = {"device": {"name": "cpu", "key": "cpu|2|8GB"}, "writer": name}
    (gate / name).write_text("ready")
    while not (gate / "go").exists():  # all writers start at once, after their imports
        time.sleep(0.002)
    for i in range(runs):
        cases = [
            {"op": "rmsnorm", "variant": name, "shape_key": f"s{j}", "dtype": "float32",
             "device": "cpu", "mode": "hot", "metrics": {"median_s": i + j / 10},
             "samples": [float(i)] * 50}
            for j in range(3)
        ]
        db.record_run("bench", cases, prov, label=f"{name}-{i}")
        db.cache_put("writers", f"{name}-{i}", {"i": i})
    db.close()
    """
)

STALLER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kernelab import ledger
    path, marker = sys.argv[1], Path(sys.argv[2])
    db = ledger.open(path)

    def cases():
        for j in range(1000):
            if j == 3:
                marker.write_text("in transaction")
                time.sleep(60)  # killed here, holding the write transaction
            yield {"op": "rmsnorm", "variant": "doomed", "shape_key": f"s{j}",
                   "dtype": "float32", "device": "cpu", "mode": "hot",
                   "samples": [1e-3] * 5000}

    db.record_run("bench", cases(), {"device": {"name": "cpu"}}, label="doomed")
    """
)


def _env():
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_concurrent_writer_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    writers, runs = 4, 12
    gate = tmp_path / "gate"
    gate.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, path, f"w{k}", str(runs), str(gate)],
            env=_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(writers)
    ]
    deadline = time.time() + 120
    while len(list(gate.iterdir())) < writers:
        assert all(p.poll() is None for p in procs), "a writer died before starting"
        assert time.time() < deadline, "writers never got ready"
        time.sleep(0.01)
    (gate / "go").write_text("go")
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with ledger.open(path) as db:
        assert db.count_runs() == writers * runs
        assert db.check() == "ok"
        for k in range(writers):
            labels = {r["label"] for r in db.list_runs(limit=None) if r["label"][1] == str(k)}
            assert labels == {f"w{k}-{i}" for i in range(runs)}
            hist = db.history("rmsnorm", variant=f"w{k}", samples=True)
            assert len(hist) == 3 * runs
            assert all(len(c["samples"]) == 50 for _, c in hist)
            assert db.cache_get("writers", f"w{k}-{runs - 1}") == {"i": runs - 1}


def test_writer_killed_mid_transaction_leaves_the_ledger_consistent(tmp_path):
    path = str(tmp_path / "crash.sqlite")
    with ledger.open(path) as db:
        kept = db.record_run(
            "bench",
            [
                {
                    "op": "a",
                    "variant": "v",
                    "shape_key": "s",
                    "dtype": "f",
                    "device": "cpu",
                    "mode": "hot",
                }
            ],
            {"device": {}},
            label="kept",
        )
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", STALLER, path, str(marker)], env=_env())
    try:
        deadline = time.time() + 60
        while not marker.exists():
            assert proc.poll() is None, "writer exited before reaching the transaction"
            assert time.time() < deadline, "writer never reached the transaction"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with ledger.open(path) as db:
        assert db.check() == "ok"
        assert [r["id"] for r in db.list_runs(kind=None)] == [kept]
        assert db.history("rmsnorm") == []
        after = db.record_run("bench", [], {"device": {}}, label="after")  # writable again
        assert db.resolve("after") == after


def test_concurrent_bench_commands_all_land_in_one_ledger(tmp_path):
    from kernelab.hardware import detect

    path = str(tmp_path / "bench.sqlite")
    key = detect("cpu").key
    with ledger.open(path) as db:  # stored ceilings: no process needs to measure them
        db.put_ceiling(key, "copy_bytes_per_s", 1e10, "B/s", "test")
        db.put_ceiling(key, "matmul_flops_float32", 1e11, "FLOP/s", "test")
    args = ["--device", "cpu", "--ledger", path, "--shape", "decode 1x4096", "--dtype"]
    args += ["float32", "--variant", "torch", "--max-time", "0.2", "--min-samples", "5"]
    args += ["--max-rows", "8"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kernelab", "bench", "rmsnorm", *args, "--label", f"p{k}"],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    with ledger.open(path) as db:
        runs = db.list_runs(kind="bench")
        assert sorted(r["label"] for r in runs) == ["p0", "p1", "p2"]
        for r in runs:
            run = db.get_run(r["id"])
            assert run["cases"] and all(len(c["samples"]) >= 5 for c in run["cases"])
        assert db.check() == "ok"
