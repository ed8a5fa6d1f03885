"""``kernelab inspect``: users' kernels, the committed baseline, and the CI gate end to end."""

import dataclasses
import json
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelab import ops
from kernelab.cli import app
from kernelab.inspect import baseline as bl
from kernelab.inspect.ops import plan
from kernelab.inspect.targets import parse_targets
from tests import children
from tests.user_triton import write_candidate

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
KERNELS = str(ROOT / "tests" / "inspect_kernels.py")
GATE = ["inspect", "rmsnorm", "-t", "sm_90", "--dtype", "bfloat16"]


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    path = tmp_path_factory.getbasetemp() / "inspect-cache"
    path.mkdir(exist_ok=True)
    monkeypatch.setenv("KERNELAB_CACHE_DIR", str(path))


def test_users_kernel_with_signature_as_json():
    sig = "*fp16,*fp16,i32,BLOCK=1024,num_warps=4"
    args = ["inspect", "--kernel", f"{KERNELS}:copy_kernel", "--signature", sig, "-t", "sm_90"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["triton"]
    (rep,) = data["reports"]
    assert rep["kernel"] == "copy_kernel" and rep["target"] == "sm_90"
    assert rep["facts"]["loads"] == {"16": 8}
    assert "vectorisation" in {f["kind"] for f in rep["findings"]}
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "Findings" in table.output and "triton" in table.output


def test_a_plain_triton_kernel_that_verify_interprets_still_compiles(tmp_path):
    path = write_candidate(tmp_path)
    sig = "*bf16:16,i64,*bf16:16,i64,*bf16:16,i64,*bf16:16,i32,fp32,HAS_RESIDUAL=True,BLOCK=4096"
    args = ["inspect", "--kernel", f"{path}:fused_add_rmsnorm_kernel", "--signature", sig]
    result = runner.invoke(app, [*args, "-t", "sm_90", "--json"])
    assert result.exit_code == 0, result.output
    (rep,) = json.loads(result.stdout)["reports"]
    assert rep["kernel"] == "fused_add_rmsnorm_kernel" and rep["target"] == "sm_90"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--kernel", f"{KERNELS}:copy_kernel", "--signature", "*fp16"], "signature:"),
        (["--kernel", f"{KERNELS}:copy_kernel"], "--kernel needs --signature"),
        (["--kernel", f"{KERNELS}:nothing", "--signature", "i32"], "has no attribute"),
        (["--signature", "i32"], "needs --kernel"),
        (["rmsnorm", "-t", "sm_75"], "target: expected"),
        (["rmsnorm", "--check", "--baseline", "/nonexistent/b.json"], "baseline: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    result = runner.invoke(app, ["inspect", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output


def test_committed_baseline_covers_rmsnorm_on_all_targets():
    data = bl.load(ROOT / bl.DEFAULT_PATH)
    # The gate (make inspect-check) covers bfloat16, the inference dtype.
    keys = {
        j.key for j in plan([ops.get("rmsnorm")], parse_targets(None), dtypes=["bfloat16"]).jobs
    }
    assert keys <= set(data["entries"])
    assert {k.split("/")[2] for k in keys} == {
        "sm_80", "sm_90", "sm_100", "gfx942", "tpu_v5e", "tpu_v6e", "tpu7x"
    }  # fmt: skip
    for key in keys:
        e = data["entries"][key]
        if key.split("/")[2].startswith("tpu"):  # its Pallas variant, lowered to Mosaic
            assert e["lowers"] and e["launchable"] and "vmem" not in e["findings"]
        else:
            assert e["spill_bytes"] == 0 and e["narrow_accesses"] == 0 and e["launchable"]


def test_gate_fails_on_a_planted_regression_and_update_rewrites(tmp_path, monkeypatch):
    path = str(tmp_path / "baseline.json")
    first = runner.invoke(app, [*GATE, "--update-baseline", "--baseline", path])
    assert first.exit_code == 0, first.output
    written = Path(path).read_bytes()
    ok = runner.invoke(app, [*GATE, "--check", "--baseline", path])
    assert ok.exit_code == 0, ok.output
    assert "no regressions" in ok.output

    # Plant: the launcher stops passing 16-byte-aligned, 16-divisible arguments.
    op = ops.get("rmsnorm")
    declared = op.launches

    def unaligned(shape, dtype, config=None):
        return [dataclasses.replace(x, divisible_16=()) for x in declared(shape, dtype, config)]

    monkeypatch.setattr(op, "launches", unaligned)
    bad = runner.invoke(app, [*GATE, "--check", "--baseline", path, "--json"])
    assert bad.exit_code == 1, bad.output
    regressions = json.loads(bad.stdout)["check"]["regressions"]
    assert regressions and all("_norm_kernel on sm_90" in r for r in regressions)
    lost = [r for r in regressions if "lost vectorisation: widest load 128 → 16 bits" in r]
    assert len(lost) == len(json.loads(written)["entries"])  # every shape, named by its key
    assert any("registers" in r for r in regressions)  # unpacked accesses cost registers too
    table = runner.invoke(app, [*GATE, "--check", "--baseline", path])
    assert table.exit_code == 1 and "regression(s)" in table.output

    rewrite = runner.invoke(app, [*GATE, "--update-baseline", "--baseline", path])
    assert rewrite.exit_code == 0 and Path(path).read_bytes() != written
    assert runner.invoke(app, [*GATE, "--check", "--baseline", path]).exit_code == 0

    monkeypatch.setattr(op, "launches", declared)
    runner.invoke(app, [*GATE, "--update-baseline", "--baseline", path])
    assert Path(path).read_bytes() == written  # deterministic: same reports, same bytes


def test_ops_without_launches_are_skipped_and_reported():
    class NoLaunches:
        name = "nolaunch"
        launches = None
        tuning_space = None

    p = plan([NoLaunches()], parse_targets("sm_90"))
    assert p.jobs == [] and p.skipped == ["nolaunch: declares no launches (nothing to compile)"]


def test_space_plans_every_config_of_the_tuning_space():
    op = ops.get("rmsnorm")
    default = plan([op], parse_targets("sm_90"), dtypes=["bfloat16"])
    space = plan([op], parse_targets("sm_90"), space=True, dtypes=["bfloat16"])
    shape = op.shapes("representative")[0]
    per_shape = len(op.tuning_space(shape, None))
    assert len(space.jobs) > len(default.jobs) and per_shape > 1
    configs = {j.spec.config_text() for j in space.jobs if shape.key in j.key}
    assert len(configs) == per_shape  # one job per config, the config in its key
    assert len({j.key for j in space.jobs}) == len(space.jobs)


def _gemm_jobs(targets: str) -> dict:
    p = plan([ops.get("gemm")], parse_targets(targets), dtypes=["bfloat16"])
    assert not p.skipped, p.skipped
    return {j.key: j for j in p.jobs}


def test_a_plan_that_takes_the_target_is_described_as_it_runs_there():
    # The default GEMM of a prefill: TMA on Hopper and Blackwell; the LDS budget's tile on
    # gfx942 (two stages of block_k 32); four stages on sm_80. Described without a target,
    # all four were one tiled launch of three stages.
    jobs = _gemm_jobs("sm_80,sm_90,sm_100,gfx942")
    prefill = [k for k in jobs if "M=2048,N=6144,K=4096" in k and k.count("/") == 4]
    kernels = {k.split("/")[2]: k.split("/")[1] for k in prefill}
    assert kernels == {
        "sm_80": "_gemm_kernel",
        "sm_90": "_gemm_tma_kernel",
        "sm_100": "_gemm_tma_kernel",
        "gfx942": "_gemm_kernel",
    }, prefill
    by_target = {k.split("/")[2]: jobs[k].spec for k in prefill}
    assert by_target["gfx942"].num_stages == 2 and by_target["gfx942"].constexprs["BLOCK_K"] == 32
    assert by_target["sm_80"].num_stages == 4


def test_a_variant_with_its_own_config_is_inspected_on_every_target():
    jobs = _gemm_jobs("sm_90,gfx942")
    for target in ("sm_90", "gfx942"):
        persistent = [k for k in jobs if k.endswith("/kernelab-persistent") and target in k]
        assert persistent and all("_gemm_persistent_kernel" in k for k in persistent)
        splitk = [k for k in jobs if k.endswith("/kernelab-splitk") and target in k]
        assert any("_splitk_reduce_kernel" in k for k in splitk)
    # a variant's launch that the default plan already makes for that shape and target (the
    # decode split-K) is not a second job
    default = {}
    for k, j in jobs.items():
        if not k.endswith(("/kernelab-persistent", "/kernelab-splitk")):
            shape = k.split("/")[4]
            default.setdefault((shape, j.target.name), set()).add(j.spec.identity())
    decode = "M=1,N=6144,K=4096;bias=False,layout=nk,residual=False"
    assert (decode, "sm_90") in default
    for k, j in jobs.items():
        if k.endswith(("/kernelab-persistent", "/kernelab-splitk")):
            shape = k.split("/")[4]
            assert j.spec.identity() not in default.get((shape, j.target.name), ()), k


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_inspect_ends_its_compiler_processes(tmp_path, sig):
    # A cold cache, so that the pool has work; the signal goes to the command alone, as
    # `kill` or a job scheduler sends it.
    args = ["inspect", "rmsnorm", "layernorm", "-j", "2", "--no-cache"]
    env = {"KERNELAB_CACHE_DIR": str(tmp_path / "cache")}
    workers, proc = children.signal_when_workers_run(args, env, sig)
    assert proc.returncode != 0
    assert not children.outliving(workers), "compiler processes outlived kernelab inspect"
