"""The GPU check (benchmarks/gpu_check.py) rehearsed on the CPU: the same steps through the same
harness and the same offline wheel install, with small budgets; and its failure paths."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_rehearsal_runs_every_step_and_writes_the_gpu_check_s_folder(tmp_path):
    ops = ("rmsnorm", "gemm")  # one memory-bound op, one GEMM (`make gpu-check-rehearsal`: all)
    proc = _run("--rehearse", "--out", str(tmp_path), "--ops", *ops)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "rehearsal" and summary["failed"] == []
    steps = [s["args"][0] for s in summary["steps"]]
    assert steps == [
        "install wheels",
        "import installed wheel",
        "ceilings",
        "verify",
        "bench",
        "bench",
        "bench(api)",
        "report",
    ]
    for step in summary["steps"]:
        assert step["status"] == "ok", step
        assert step["command"] and step["seconds"] >= 0
    assert "--no-index" in summary["steps"][0]["command"]
    assert summary["steps"][0]["wheels"] == ["kernelab_rehearsal_probe-1.0-py3-none-any.whl"]
    ceilings = json.loads((tmp_path / "ceilings.json").read_text())
    assert ceilings["device"]["type"] == "cpu"
    verify = json.loads((tmp_path / "verify.json").read_text())
    assert verify["passed"] is True and verify["device"] == "cpu"
    report = (tmp_path / "report.html").read_text()
    for op in ops:
        bench = json.loads((tmp_path / f"bench-{op}.json").read_text())
        assert bench["cases"] and {c["variant"] for c in bench["cases"]} == {"torch"}
        assert op in report  # the report shows every op's run, not only the newest
    assert json.loads((tmp_path / "api" / "bench-rmsnorm.json").read_text())["cases"]
    assert (tmp_path / "ledger.sqlite").is_file()


def test_without_a_gpu_the_check_says_so_and_runs_nothing(tmp_path):
    proc = _run("--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "no CUDA/ROCm device here" in proc.stdout and "--rehearse" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "gpu" and summary["failed"] == ["no device"]
    assert not (tmp_path / "ceilings.json").exists()


def test_a_failed_step_fails_the_rehearsal(tmp_path, monkeypatch):
    gpu_check = _module()

    def kernelab(args, out_file, timeout, env):
        if out_file is not None:
            out_file.write_text("{}")
        if args[0] == "report":
            Path(args[args.index("--out") + 1]).write_text("<html></html>")
        status = "error (exit 3)" if args[0] == "bench" else "ok"
        return {"args": args, "command": "kernelab", "status": status, "seconds": 0.0}

    def api_bench(ops, out, *args, **knobs):
        return [{"args": ["bench(api)", ops[0].name], "status": "ok", "seconds": 0.0}]

    monkeypatch.setattr(gpu_check, "kernelab", kernelab)
    monkeypatch.setattr(gpu_check, "api_bench", api_bench)
    assert gpu_check.main(["--rehearse", "--out", str(tmp_path), "--ops", "rmsnorm"]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == ["bench rmsnorm"]


def test_the_harness_fails_a_step_that_writes_no_json_and_skips_a_missing_command(tmp_path):
    gpu_check = _module()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    step = gpu_check.kernelab(["--version"], tmp_path / "v.json", 120, env)
    assert step["status"] == "error (no JSON in v.json)"
    assert step["command"].endswith("-m kernelab --version")
    step = gpu_check.kernelab(["no-such-command"], None, 120, env)
    assert step["status"] == "missing command"
