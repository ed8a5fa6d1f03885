"""``kernelab trace summary|diff`` and ``kernelab profile``: commands, errors, rendering."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from kernelab.cli import app
from tests import children
from tests.kineto_builder import TraceBuilder
from tests.test_trace import fusible, scenario

runner = CliRunner()
SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_summary_json_round_trips(tmp_path):
    path = scenario().write(tmp_path / "s.json.gz")
    result = runner.invoke(app, ["trace", "summary", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "kernelab.trace.summary/1"
    assert data["gpu"]["idle"][0]["by_cause_us"] == {"sync": 40, "host": 52, "other": 12}


def test_summary_tables_escape_untrusted_names(tmp_path):
    b = TraceBuilder()
    b.launch("[bold red]evil[/] kernel", 0, 5, 10, 10)
    result = runner.invoke(app, ["trace", "summary", str(b.write(tmp_path / "e.json"))])
    assert result.exit_code == 0, result.output
    assert "[bold red]evil[/]" in result.output  # shown as text, not applied as markup


def test_malformed_inputs_are_one_line_errors(tmp_path):
    cases = {
        "empty.json": b"",
        "bad.json": b'{"traceEvents": [',
        "cut.json.gz": gzip.compress(b'{"traceEvents": []}' * 50)[:30],
        "nofield.json": b'{"schemaVersion": 1}',
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        result = runner.invoke(app, ["trace", "summary", str(tmp_path / name)])
        assert result.exit_code == 2, (name, result.output)
        assert "Traceback" not in result.output
        # one message (the terminal may wrap it), not a traceback
        assert result.output.startswith("error: trace:"), result.output
        assert result.output.count("error:") == 1
    missing = runner.invoke(app, ["trace", "summary", str(tmp_path / "absent.json")])
    assert missing.exit_code == 2 and "no such file" in missing.output


def test_nothing_to_analyse(tmp_path):
    path = TraceBuilder().write(tmp_path / "none.json")
    result = runner.invoke(app, ["trace", "summary", str(path)])
    assert result.exit_code == 1
    assert "nothing to analyse" in result.output


def two_traces(tmp_path):
    a, b = TraceBuilder(rank=0), TraceBuilder(rank=1)
    for i in range(3):
        a.launch("gemm_a", i * 100, 5, i * 100 + 10, 40)
        b.launch("gemm_a", i * 100, 5, i * 100 + 10, 50)  # 10 us slower each
        b.launch("nccl_allreduce_kernel", i * 100 + 60, 5, i * 100 + 70, 20)
        a.launch("nccl_allreduce_kernel", i * 100 + 60, 5, i * 100 + 70, 20)
    a.launch("old_kernel", 400, 5, 410, 7)
    return a.write(tmp_path / "rank0.json"), b.write(tmp_path / "rank1.json")


def test_diff_ranks_by_impact(tmp_path):
    pa, pb = two_traces(tmp_path)
    result = runner.invoke(app, ["trace", "diff", str(pa), str(pb), "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    first, second = d["kernels"][:2]
    assert (first["name"], first["delta_us"], first["delta_count"]) == ("gemm_a", 30, 0)
    assert (second["name"], second["status"], second["delta_us"]) == ("old_kernel", "removed", -7)
    comp = next(c for c in d["categories"] if c["category"] == "compute")
    assert comp["delta_us"] == 30 - 7
    table = runner.invoke(app, ["trace", "diff", str(pa), str(pb)])
    assert table.exit_code == 0 and "gemm_a" in table.output


def test_folder_of_ranks_finds_the_straggler(tmp_path):
    two_traces(tmp_path)
    result = runner.invoke(app, ["trace", "summary", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    assert [row["rank"] for row in r["ranks"]] == [0, 1]
    assert r["ranks"][1]["compute_us"] == 150
    assert [s["rank"] for s in r["stragglers"]] == [1]


def test_perfetto_annotations(tmp_path):
    path = scenario().write(tmp_path / "s.json")
    out = tmp_path / "annotated.json.gz"
    result = runner.invoke(app, ["trace", "summary", str(path), "--perfetto", str(out)])
    assert result.exit_code == 0, result.output
    doc = orjson.loads(gzip.decompress(out.read_bytes()))
    ours = [e for e in doc["traceEvents"] if e.get("cat") == "kernelab"]
    idle = [e for e in ours if e["name"].startswith("idle: ")]
    assert sorted(e["args"]["cause"] for e in idle) == sorted(
        ["host"] * 3 + ["sync"] + ["other"] * 3
    )
    assert sum(e["dur"] for e in idle) == 104
    assert any(e["name"] == "graph replay" for e in ours)
    # the original events are all still there
    assert len(doc["traceEvents"]) == len(scenario().events) + len(ours) + 1


@pytest.mark.parametrize("which", ["shapes", "memory"])
def test_trace_summary_json_loads_neither_torch_nor_rich(tmp_path, which):
    """The CLI imports a command's module only when it runs: ``trace summary --json`` (and
    its HTML page) needs numpy and the decoders, not torch (seconds, hundreds of MB), rich,
    sqlalchemy nor numpy.ma (which np.unique, np.isin and np.union1d load), even for ops
    whose cost kernelab's own op models (rms_norm) or a trace with memory events."""
    if which == "shapes":
        b = scenario()
        fusible(b, 1000)
        path = b.write(tmp_path / "s.json")
    else:
        path = Path(__file__).parent / "data" / "cpu_memory.json.gz"
    page = tmp_path / "p.html"
    heavy = ("torch", "rich", "triton", "sqlalchemy", "numpy.ma")
    code = (
        "import sys; from kernelab.cli import main\n"
        f"sys.argv = ['kernelab', 'trace', 'summary', {str(path)!r}, '--json', '--html', "
        f"{str(page)!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    rc = e.code\n"
        f"print('LOADED', sorted(m for m in {heavy!r} if m in sys.modules), rc)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("LOADED [] 0"), out.stdout[-300:]
    assert page.stat().st_size > 1000


MODEL = textwrap.dedent(
    """
    import torch

    _model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    _x = torch.randn(8, 16)

    def step():
        with torch.no_grad():
            _model(_x)
    """
)


def test_profile_tiny_model_on_cpu(tmp_path):
    (tmp_path / "tiny_model.py").write_text(MODEL)
    out = tmp_path / "prof.json.gz"
    result = runner.invoke(
        app,
        [
            "profile",
            f"{tmp_path / 'tiny_model.py'}:step",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert out.exists()
    data = json.loads(result.stdout)
    assert f"trace written: {out}" in result.stderr
    assert data["gpu"] is None
    names = {o["name"] for o in data["cpu"]["ops"]}
    assert "aten::addmm" in names
    assert data["cpu"]["steps"] == 3
    assert data["memory"][0]["device"] == "cpu"  # recorded by default
    assert data["memory"][0]["peak_allocated_bytes"] > 0
    assert 0 <= data["cpu"]["overhead_share"] < 1
    human = runner.invoke(
        app,
        [
            "profile",
            f"{tmp_path / 'tiny_model.py'}:step",
            "--steps",
            "2",
            "--warmup",
            "0",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "p2.json"),
            "--no-memory",
        ],
    )
    assert human.exit_code == 0, human.output
    assert "CPU ops by self time" in human.output and "framework overhead" in human.output
    assert "memory cpu" not in human.output  # not recorded when asked not to


def test_profile_without_out_writes_under_the_cache_dir_and_says_where(tmp_path, monkeypatch):
    (tmp_path / "tiny_model.py").write_text(MODEL)
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("KERNELAB_CACHE_DIR", str(cache))
    target = f"{tmp_path / 'tiny_model.py'}:step"
    args = ["profile", target, "--steps", "1", "--warmup", "0", "--device", "cpu"]
    args += ["--no-memory", "--json"]
    first, second = runner.invoke(app, args), runner.invoke(app, args)
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert list(work.iterdir()) == [], "a file in the working directory nobody named"
    written = sorted((cache / "profiles").iterdir())
    assert len(written) == 2, written  # two runs in one second do not overwrite each other
    assert all(p.name.startswith("tiny_model.py-step-") for p in written)
    for res in (first, second):
        json.loads(res.stdout)  # stdout is the JSON alone
        assert any(f"trace written: {p}" in res.stderr for p in written), res.stderr


def test_profile_bad_target_is_one_line(tmp_path):
    result = runner.invoke(app, ["profile", "no_such_module_xyz:step", "--device", "cpu"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output and "target" in result.output


def _long_trace(path: Path, repeats: int = 200_000) -> Path:
    """A valid trace of 8 million events that gzip keeps small (one block of ten launches
    repeated): seconds of decoding for every worker."""
    b = TraceBuilder()
    for i in range(10):
        b.launch(f"k{i % 7}", 10 * i, 3, 10 * i + 5, 4)
    doc = b.document()
    block = b",\n".join(orjson.dumps(e) for e in doc.pop("traceEvents"))
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(orjson.dumps(doc)[:-1] + b', "traceEvents": [\n')
        for r in range(repeats):
            f.write(block + (b",\n" if r < repeats - 1 else b"\n"))
        f.write(b"]}\n")
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_trace_summary_ends_its_decoding_processes(tmp_path, sig):
    path = _long_trace(tmp_path / "long.json.gz")
    args = ["trace", "summary", str(path), "--json"]
    workers, proc = children.signal_when_workers_run(args, {"KERNELAB_TRACE_WORKERS": "3"}, sig)
    assert proc.returncode != 0
    # Without the fix they decode on for seconds (minutes for a real trace) after it ended.
    assert not children.outliving(workers, grace=1.0), "decoders outlived kernelab trace"


def test_profile_prints_none_of_the_profilers_own_log_lines(tmp_path):
    """Kineto writes ``USDT: ... profiler_start`` to stderr, from C++, unless told not to when
    it first starts: a fresh process, as a user runs it."""
    import os
    import subprocess
    import sys

    (tmp_path / "tiny_model.py").write_text(MODEL)
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["KERNELAB_CACHE_DIR"] = str(tmp_path / "cache")
    cmd = [sys.executable, "-m", "kernelab", "profile", f"{tmp_path / 'tiny_model.py'}:step"]
    cmd += ["--steps", "1", "--warmup", "0", "--device", "cpu", "--no-memory", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    json.loads(proc.stdout)
    assert "USDT:" not in proc.stderr and "STAGE:" not in proc.stderr, proc.stderr
    assert "trace written:" in proc.stderr
