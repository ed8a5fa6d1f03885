"""A local sweep sent SIGTERM ends as on Ctrl-C (finished results kept, workers gone, exit
143); one killed by SIGKILL leaves workers that notice and end within seconds."""

import os
import signal
import subprocess
import sys
import time

import pytest

from kernelab import ledger
from kernelab.ledger import sweeps
from tests import children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: CPU verify tasks of a fraction of a second each: the sweep runs for many seconds.
ARGS = ["sweep", "verify", "--ops", "rmsnorm", "--variant", "torch", "--dtype", "fp32",
        "--shapes", "edge", "--trials", "1", "--seeds", ",".join(map(str, range(400))),
        "-j", "2"]  # fmt: skip


def _start(tmp_path):
    """The sweep, once two workers run and a tenth of its tasks is stored."""
    env = {**os.environ, "PYTHONPATH": children.SRC, "KERNELAB_CACHE_DIR": str(tmp_path / "c")}
    db = tmp_path / "l.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-c", children._AS_FROM_A_SHELL, "-m", "kernelab", *ARGS,
         "--ledger", str(db)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines, deadline = [], time.monotonic() + 120
    for line in proc.stderr:
        lines.append(line)
        if ("sweep: " in line and "done 0," not in line) or time.monotonic() > deadline:
            break
    workers = {c for c in children.children(proc.pid) if children._is_python(c)}
    assert proc.poll() is None and len(workers) == 2, "".join(lines)
    return proc, workers, db, lines


def _stop(proc):
    if proc.poll() is None:
        for c in children.children(proc.pid):
            os.kill(c, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_sigterm_keeps_the_finished_results_ends_the_workers_and_exits_143(tmp_path):
    proc, workers, db, lines = _start(tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        proc.wait(timeout=30)
    finally:
        _stop(proc)
    out = " ".join(("".join(lines) + rest).split())
    assert proc.returncode == 143, out[-3000:]
    assert not children.outliving(workers, grace=2.0), "workers outlived the sweep"
    with ledger.open(db, readonly=True) as d:
        done = len(sweeps.done_keys(d))
    assert done > 0 and f"{done} task result(s) stored" in out, out[-3000:]
    assert "terminated (SIGTERM)" in out and "Traceback" not in out, out[-3000:]


def test_workers_of_a_sweep_killed_by_sigkill_end_within_seconds(tmp_path):
    proc, workers, _, _ = _start(tmp_path)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        _stop(proc)
    assert not children.outliving(workers, grace=5.0), "workers outlived the killed sweep"
