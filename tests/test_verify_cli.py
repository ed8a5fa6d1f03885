"""``kernelab verify`` from the command line: tables, --json, users' kernels, clear errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelab.cli import app
from tests.user_triton import write_candidate

runner = CliRunner()
SRC = Path(__file__).resolve().parents[1] / "src"
FAST = ["--shapes", "representative", "--dtype", "float32", "--trials", "1", "--device", "cpu"]

GOOD = """
import torch

def my_rmsnorm(x, weight, eps=1e-6, residual=None, out=None):
    if residual is not None:
        residual.add_(x)
        x = residual
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    return y if out is None else out.copy_(y)

def skips_last_row(x, weight, eps=1e-6, residual=None, out=None):
    y = my_rmsnorm(x, weight, eps, residual)
    if out is None:
        out = torch.empty_like(y)
    out[:-1].copy_(y[:-1])
    return out

def wrong_args(x, w):
    return x
"""

CUSTOM = """
import torch

def inputs(seed, dist="normal"):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(6, 5, generator=g)}

def ref(a):
    return torch.softmax(a, dim=-1)

def mine(a):
    e = torch.exp(a - a.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(GOOD)
    return path


def test_verify_prints_a_table_and_the_seed_and_exits_0():
    result = runner.invoke(app, ["verify", "rmsnorm", "--variant", "torch", *FAST, "--seed", "9"])
    assert result.exit_code == 0, result.output
    assert "kernelab verify" in result.output and "seed 9" in result.output
    assert "all passed" in result.output and "--seed 9" in result.output


def test_json_is_the_documented_schema():
    result = runner.invoke(app, ["verify", "rmsnorm", "--variant", "torch", *FAST, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "kernelab.verify/1" and data["passed"] is True
    assert {"seed", "device", "trials", "groups", "cases", "skipped", "audit"} <= set(data)


def test_candidate_from_a_file_outside_the_project(user_file):
    args = ["verify", "--candidate", f"{user_file}:my_rmsnorm", "--op", "rmsnorm", *FAST]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "my_rmsnorm" in result.output and "pass" in result.output


def test_a_flawed_candidate_fails_with_its_class_and_exit_1(user_file):
    args = ["verify", "--candidate", f"{user_file}:skips_last_row", "--op", "rmsnorm", *FAST]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "unwritten elements" in result.output and "FAILED" in result.output


@pytest.fixture
def no_interpret_flags(monkeypatch):
    for name in ("TRITON_INTERPRET", "KERNELAB_INTERPRET"):
        monkeypatch.delenv(name, raising=False)


def test_a_plain_triton_kernel_is_verified_on_cpu_without_flags(tmp_path, no_interpret_flags):
    """The user's @triton.jit kernel runs through kernelab's interpreter: every shape and dtype
    passes, and the residual, added in bf16, is bitwise eager torch's bf16 add."""
    path = write_candidate(tmp_path)
    args = ["verify", "--candidate", f"{path}:fused_add_rmsnorm", "--op", "rmsnorm"]
    result = runner.invoke(app, [*args, "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and {c["dtype"] for c in data["cases"]} == {
        "float32",
        "float16",
        "bfloat16",
    }
    residual = [
        m
        for c in data["cases"]
        if c["dtype"] == "bfloat16"
        for m in c["measures"]
        if m["target"] == "residual"
    ]
    assert residual and all(m["rel_l2"] == m["eager_error"] for m in residual)


def test_a_plain_triton_kernel_with_a_planted_bug_fails(tmp_path, no_interpret_flags):
    path = write_candidate(tmp_path, bug=True)
    args = ["verify", "--candidate", f"{path}:fused_add_rmsnorm", "--op", "rmsnorm"]
    result = runner.invoke(app, [*args, "--device", "cpu", "--shapes", "edge"])
    assert result.exit_code == 1, result.output
    assert "wrong values" in result.output and "FAILED" in result.output


def test_reference_and_inputs_for_an_unknown_op(tmp_path):
    path = tmp_path / "custom.py"
    path.write_text(CUSTOM)
    args = ["verify", "--candidate", f"{path}:mine", "--reference", f"{path}:ref"]
    result = runner.invoke(app, [*args, "--inputs", f"{path}:inputs", "--device", "cpu"])
    assert result.exit_code == 0, result.output


def test_audit_reports_rmsnorm_sound():
    result = runner.invoke(app, ["verify", "rmsnorm", "--audit", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "rmsnorm: sound" in result.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--candidate", "/no/such/file.py:f", "--op", "rmsnorm"], "no such file"),
        (["--candidate", "{f}:nosuch", "--op", "rmsnorm"], "has no attribute 'nosuch'"),
        (["--candidate", "{f}:wrong_args", "--op", "rmsnorm"], "does not accept"),
        (["--candidate", "{f}:my_rmsnorm"], "expected --op NAME"),
        (["--candidate", "{f}:my_rmsnorm", "--op", "nosuchop"], "op: expected one of"),
        (["--reference", "{f}:my_rmsnorm"], "--reference: expected --candidate"),
        (["rmsnorm", "--shapes", "huge"], "--shapes: expected one of"),
        (["rmsnorm", "--variant", "nosuch"], "variants: expected names among"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(user_file, args, words):
    args = [a.replace("{f}", str(user_file)) for a in args]
    result = runner.invoke(app, ["verify", *args, "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 3  # one logical line, maybe wrapped


def test_candidate_in_a_subprocess(user_file):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-m", "kernelab", "verify"]
    cmd += ["--candidate", f"{user_file}:my_rmsnorm", "--op", "rmsnorm", *FAST, "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=user_file.parent)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["passed"] is True


def test_custom_reference_that_raises_is_one_line(tmp_path):
    path = tmp_path / "custom.py"
    path.write_text(CUSTOM + "\ndef broken_ref(a):\n    raise RuntimeError('boom')\n")
    args = ["verify", "--candidate", f"{path}:mine", "--reference", f"{path}:broken_ref"]
    result = runner.invoke(app, [*args, "--inputs", f"{path}:inputs", "--device", "cpu"])
    assert result.exit_code == 2 and "RuntimeError: boom" in result.output
    assert "Traceback" not in result.output


def test_audit_names_a_broken_op_definition_and_exits_1(monkeypatch):
    from kernelab.core import op as _model
    from tests.flawed import toy_ops

    loose = toy_ops.double_op(tolerance={"float32": 10.0})
    monkeypatch.setitem(_model._REGISTRY, loose.name, loose)
    result = runner.invoke(app, ["verify", loose.name, "--audit", "--device", "cpu"])
    assert result.exit_code == 1, result.output
    assert "toy_double_loose: broken op definition" in result.output


HUGE_ONLY = (
    GOOD
    + """

def wrong_on_huge(x, weight, eps=1e-6, residual=None, out=None):
    y = my_rmsnorm(x, weight, eps, residual)
    if x[torch.isfinite(x)].abs().max() > 1e4:  # an accumulation that only breaks when huge
        y = y * 1.5
    return y if out is None else out.copy_(y)
"""
)


def test_a_failure_names_the_input_distribution_it_showed_on(tmp_path):
    path = tmp_path / "huge.py"
    path.write_text(HUGE_ONLY)
    args = ["verify", "--candidate", f"{path}:wrong_on_huge", "--op", "rmsnorm", *FAST]
    args[args.index("--trials") + 1] = "5"  # one trial per distribution: huge among them
    args += ["--show", "1"]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert text.count("wrong values: out:") == text.count("[huge inputs") > 0
    js = runner.invoke(app, [*args, "--json"])
    failed = [c for c in json.loads(js.stdout)["cases"] if not c["passed"]]
    assert {c["trials"][f["trial"]]["dist"] for c in failed for f in c["failures"]} == {"huge"}


def test_nan_and_inf_stay_apart_in_json_failure_records():
    from kernelab.cli._common import emit_json
    from kernelab.verify._types import Failure, Measure

    nan, inf = float("nan"), float("inf")
    f = Failure("NaN mismatch", "out", "m", [[0], [1], [2]], [nan, inf, -inf], [1.0, nan, 2.0])
    m = Measure("out", inf, inf, nan, [0], nan, -inf, 0.0, "floor", None)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        emit_json({"failure": f.as_dict(), "measure": m.as_dict()})
    data = json.loads(buf.getvalue())
    assert data["failure"]["got"] == ["nan", "inf", "-inf"]
    assert data["failure"]["expected"] == [1.0, "nan", 2.0]
    assert data["measure"]["rel_l2"] == "inf" and data["measure"]["max_rel"] == "nan"
    assert data["measure"]["worst_expected"] == "-inf" and data["measure"]["ratio"] == "inf"
