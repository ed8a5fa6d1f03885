"""inspect for TPU targets: Pallas calls lowered to Mosaic with no TPU, the facts read from the
Mosaic text, the findings (planted defects caught, honest calls clean), the ops' Pallas
variants through the plan, the command and the gate. (The reader on handwritten text and the
gate's rules: test_inspect_mosaic.py; the TPU device rows: test_hardware.py.)"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner

from kernelab.cli import app
from kernelab.inspect import baseline as bl
from kernelab.inspect.report import analyze
from kernelab.inspect.targets import TPU_TARGETS, parse_targets

pytest.importorskip("jax")

from tests import tpu_kernels as tk

MIB = 2**20
runner = CliRunner()


def _kinds(rep):
    return sorted(f.kind for f in rep.findings)


# Each call is lowered once per target for the whole module (~0.1 s a lowering).
CALLS = {
    "rows": tk.rows,
    "matmul": tk.matmul,
    "f32_4x128": lambda: tk.copy((64, 128), (4, 128)),
    "sort": tk.sort_rows,
    "over_capacity": lambda: tk.copy((4096, 8192), (2048, 8192)),
    "over_limit": lambda: tk.rows(vmem_limit_bytes=4 * MIB),
    "arbitrary_only": lambda: tk.rows(semantics=("arbitrary", "arbitrary")),
    "bf16_8x128": lambda: tk.copy((4096, 1024), (8, 128), torch.bfloat16),
    "int8_16x128": lambda: tk.copy((4096, 1024), (16, 1024), torch.int8),
    "int8_32x1024": lambda: tk.copy((4096, 1024), (1024, 1024), torch.int8),
    "small_f32": lambda: tk.copy((1024, 128), (8, 128)),
}


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELAB_CACHE_DIR", str(tmp_path_factory.mktemp("tpu-cache")))
        yield


@pytest.fixture(scope="module")
def reports(_cache_dir):
    reps = {(name, t): analyze(make(), t) for name, make in CALLS.items() for t in TPU_TARGETS}
    assert not any(r.cached for r in reps.values())  # each lowered here, none read back
    return reps


@pytest.mark.parametrize("name", ["rows", "matmul", "int8_32x1024"])
def test_honest_calls_lower_with_no_finding_on_every_target(reports, name):
    for t in TPU_TARGETS:
        rep = reports[(name, t)]
        assert rep.error is None and rep.ok, rep.summary()
        assert rep.findings == [], [f.message for f in rep.findings]


def test_facts_of_a_row_call(reports):
    f = reports[("rows", "tpu_v5e")].facts
    assert f["grid"] == [4, 1] and f["steps"] == 4
    assert f["semantics"] == ["parallel", "parallel"]
    x, w, o = f["windows"]
    assert (x["role"], x["block"], x["array"], x["dtype"]) == (
        "in",
        [256, 4096],
        [1024, 4096],
        "bf16",
    )
    assert (w["block"], w["dtype"], o["role"], o["block"]) == (
        [1, 4096],
        "fp32",
        "out",
        [256, 4096],
    )
    # 2 buffers of each bf16 block (2 MiB) and of the weight row padded to 8 sublanes (128 KB)
    assert f["vmem_estimate_bytes"] == 2 * 2 * 2 * MIB + 2 * 8 * 4096 * 4
    assert f["vmem_limit_bytes"] is None and f["scratch"] == []


def test_facts_of_a_matmul_with_scratch_and_k_loop(reports):
    f = reports[("matmul", "tpu_v6e")].facts
    assert f["grid"] == [2, 2, 2]
    assert f["semantics"] == ["parallel", "parallel", "arbitrary"]
    assert [w["block"] for w in f["windows"]] == [[512, 1024], [1024, 512], [512, 512]]
    (acc,) = f["scratch"]
    assert (acc["shape"], acc["dtype"], acc["memory"]) == ([512, 512], "fp32", "vmem")
    assert f["vmem_scratch_bytes"] == 512 * 512 * 4
    assert f["vmem_block_bytes"] == 2 * (1 + 1 + 0.5) * MIB


def test_vmem_limit_asked_for_is_read_from_the_backend_config(reports):
    assert reports[("over_limit", "tpu7x")].facts["vmem_limit_bytes"] == 4 * MIB


def test_block_off_the_8x128_rule_is_reported_as_not_lowering_with_the_rule(reports):
    for t in TPU_TARGETS:
        rep = reports[("f32_4x128", t)]
        assert not rep.ok and rep.facts is None
        assert rep.error.startswith("does not lower: ValueError")
        assert "divisible by 8 and 128" in rep.error and "(4, 128)" not in rep.summary()[:12]


def test_unsupported_primitive_is_reported_as_not_lowering(reports):
    rep = reports[("sort", "tpu_v6e")]
    assert rep.error.startswith("does not lower: NotImplementedError")
    assert "sort" in rep.error


def test_vmem_over_capacity_and_over_the_asked_limit_are_errors(reports):
    for t in TPU_TARGETS:
        cap = reports[("over_capacity", t)]
        assert _kinds(cap) == ["vmem"] and not cap.ok
        assert "VMEM per TensorCore" in cap.findings[0].message
        lim = reports[("over_limit", t)]
        assert _kinds(lim) == ["vmem"] and "scoped VMEM limit" in lim.findings[0].message


def test_grid_with_only_arbitrary_axes_is_flagged(reports):
    for t in TPU_TARGETS:
        (f,) = reports[("arbitrary_only", t)].findings
        assert f.kind == "no-parallel-axis" and f.severity == "info"  # one TensorCore per device
        assert '"parallel"' in f.suggestion


def test_sub_native_blocks_are_flagged_for_bf16_and_int8_not_for_f32(reports):
    bf16 = reports[("bf16_8x128", "tpu_v5e")]
    tiling = [f for f in bf16.findings if f.kind == "tiling"]
    assert len(tiling) == 2 and "multiple of 16" in tiling[0].message  # in and out blocks
    int8 = [f for f in reports[("int8_16x128", "tpu_v6e")].findings if f.kind == "tiling"]
    assert int8 and "multiple of 32" in int8[0].message
    assert "tiling" not in _kinds(reports[("small_f32", "tpu_v5e")])  # 8×128 is f32's tile


def test_blocks_too_small_for_the_per_step_overhead_are_flagged(reports):
    for t in TPU_TARGETS:
        rep = reports[("small_f32", t)]
        assert _kinds(rep) == ["small-blocks"]
        assert "0.35 µs" in rep.findings[0].message


def test_the_chip_generation_reaches_the_lowering():
    # sign() needs the TPU generation: without an abstract device of a TPU kind it cannot lower
    call = tk.rows()
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        call.lower("tpu")
    assert analyze(call, "tpu_v5e").error is None


KERNEL_FILE = """
import jax.numpy as jnp


def _helper(x):
    return x * {factor}


def scaled_copy(x_ref, o_ref):
    o_ref[...] = _helper(x_ref[...])
"""


def _user_call(path, factor):
    import importlib.util

    path.write_text(KERNEL_FILE.format(factor=factor))
    spec = importlib.util.spec_from_file_location(f"user_kernel_{factor}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    call = tk.copy((1024, 1024), (256, 1024))
    return dataclasses.replace(call, kernel=module.scaled_copy)


def test_tpu_lowerings_are_cached_by_the_source_of_their_files(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAB_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "kern.py"
    first = analyze(_user_call(src, 2), "tpu_v6e")
    again = analyze(_user_call(src, 2), "tpu_v6e")
    assert not first.cached and again.cached and again.facts == first.facts
    assert any((tmp_path / "cache" / "inspect").rglob("*.json"))
    # A helper of the kernel's file changed: the key changes with the file's text
    assert not analyze(_user_call(src, 3), "tpu_v6e").cached
    assert not analyze(_user_call(src, 2), "tpu_v6e", use_cache=False).cached


# --- targets, plans, the command -------------------------------------------------------------


def test_triton_launches_are_not_sent_to_tpu_targets():
    from kernelab import ops
    from kernelab.inspect.ops import plan

    p = plan([ops.get("rmsnorm"), ops.get("softmax")], parse_targets("tpu_v5e"))
    assert p.jobs and all(j.spec.backend == "pallas" and j.op == "rmsnorm" for j in p.jobs)
    assert any("no Pallas variant" in s and "softmax" in s for s in p.skipped)


def test_inspect_rmsnorm_for_tpu_v5e_as_json():
    result = runner.invoke(
        app, ["inspect", "rmsnorm", "-t", "tpu_v5e", "--dtype", "bfloat16", "--json"]
    )
    assert result.exit_code == 0, result.output
    reps = json.loads(result.stdout)["reports"]
    assert reps and all(r["target"] == "tpu_v5e" and r["error"] is None for r in reps)
    for r in reps:
        f = r["facts"]
        assert f["grid"] and f["semantics"] == ["parallel"] * len(f["grid"])
        assert f["vmem_estimate_bytes"] > 0
        x = f["windows"][0]
        assert x["role"] == "in" and x["dtype"] == "bf16" and x["block"][-1] == x["array"][-1]


def _op_report(op_name, shape_index, dtype, config, target):
    from kernelab import ops
    from kernelab.core.runtime import pallas

    op = ops.get(op_name)
    shape = op.shapes("representative")[shape_index]
    (call,) = pallas.launches(op, shape, dtype, config=config, target=target)
    return analyze(call, target)


def test_planted_configs_of_the_ops_pallas_variants_are_caught():
    from kernelab.core.runtime.pallas import RowBlocks
    from kernelab.ops.activation._pallas import ActBlocks

    # rmsnorm 4096x4096 and silu_and_mul 4096x2x14336: prefill shapes, many rows
    rep = _op_report("rmsnorm", 4, torch.float32, RowBlocks(4), "tpu_v5e")
    assert rep.error.startswith("does not lower") and "divisible by 8 and 128" in rep.error
    rep = _op_report("rmsnorm", 4, torch.bfloat16, RowBlocks(8), "tpu_v6e")
    assert "tiling" in _kinds(rep) and "multiple of 16" in rep.findings[0].message
    rep = _op_report("silu_and_mul", 2, torch.bfloat16, ActBlocks(16, 128), "tpu7x")
    assert _kinds(rep) == ["small-blocks"]
    rep = _op_report("silu_and_mul", 2, torch.float32, ActBlocks(4096, 2048), "tpu7x")
    assert _kinds(rep) == ["vmem"]  # 3 blocks of 32 MiB, double-buffered


def test_tpu_table_fits_80_columns(reports, monkeypatch):
    from rich.console import Console

    from kernelab.cli.inspect_cmd import tpu_sheet

    shown = [reports[(n, "tpu_v6e")] for n in ("rows", "matmul", "f32_4x128")]
    console = Console(width=80, record=True, force_terminal=False)
    tpu_sheet(shown).print(console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "4×1" in text and "par,par,arb" in text and "does not lower" in text


# --- an op with a Pallas variant, through the plan and the gate ------------------------------


def _toy_op(vmem_limit_bytes=None):
    from kernelab.core.runtime.pallas import Block, Out, PallasCall, PallasPlan
    from kernelab.ops import Variant
    from tests.flawed import toy_ops

    def plan(x, config=None, target=None):
        whole = Block(tuple(x.shape), lambda i: (0, 0))
        call = PallasCall(
            kernel=tk._copy,
            grid=(1,),
            inputs=(x,),
            in_specs=(whole,),
            outputs=(Out(tuple(x.shape), x.dtype, whole),),
            semantics=("parallel",),
            vmem_limit_bytes=vmem_limit_bytes,
        )
        return PallasPlan(calls=(call,), finish=lambda outs: outs[0][0])

    op = toy_ops.double_op()
    op.add_variant(Variant("pallas", lambda **kw: None, "pallas", plan=plan))
    return op


def test_an_ops_pallas_calls_are_planned_per_tpu_target_and_gated(tmp_path):
    from kernelab.inspect import inspect_ops

    result = inspect_ops([_toy_op()], "tpu_v5e,tpu7x,sm_90")
    tpu = [r for r in result.reports if r.is_tpu]
    assert sorted({r.target for r in tpu}) == ["tpu7x", "tpu_v5e"]
    assert len(tpu) == 2 * 2  # two representative shapes, each lowered for both chips
    assert all(r.ok and r.findings == [] and r.key.startswith("toy_double/_copy/") for r in tpu)
    assert {tuple(r.facts["grid"]) for r in tpu} == {(1,)}
    path = tmp_path / "baseline.json"
    bl.write(path, result.reports)
    base = bl.load(path)
    assert not bl.compare(result.reports, base).failed
    worse = inspect_ops([_toy_op(vmem_limit_bytes=1024)], "tpu_v5e,tpu7x").reports
    c = bl.compare(worse, base)
    assert c.failed and sum("vmem findings 0 → 1" in r for r in c.regressions) == 4


def test_calls_differing_only_in_an_index_map_are_lowered_apart():
    from kernelab.core.runtime.pallas import Block, Out, PallasCall
    from kernelab.inspect.report import Job, analyze_jobs
    from kernelab.inspect.targets import TARGETS
    from kernelab.inspect.tpu import TpuSpec

    x = torch.empty((1024, 1024), dtype=torch.float32, device="meta")

    def call(index_map):
        return PallasCall(
            kernel=tk._copy,
            grid=(4, 4),
            inputs=(x,),
            in_specs=(Block((256, 256), index_map),),
            outputs=(Out((1024, 1024), torch.float32, Block((256, 256), lambda i, j: (i, j))),),
            semantics=("parallel", "parallel"),
        )

    straight, transposed = call(lambda i, j: (i, j)), call(lambda i, j: (j, i))
    assert TpuSpec(straight).identity() == TpuSpec(transposed).identity()  # same description
    t = TARGETS["tpu_v6e"]
    seen = []
    jobs = [Job(TpuSpec(straight), t, "a"), Job(TpuSpec(transposed), t, "b")]
    jobs.append(Job(TpuSpec(straight), t, "c"))  # the very same call: lowered once
    a, b, c = analyze_jobs(jobs, progress=lambda done, total: seen.append(total))
    assert seen[-1] == 2 and a.facts is c.facts and a.facts is not b.facts


def test_no_worker_is_forked_after_a_tpu_lowering(monkeypatch):
    """TPU lowerings run in this process and start jax's threads; GPU compilations (and their
    aligned counterfactuals) run in forked workers, so they all go first, whatever the order
    of the jobs."""
    from kernelab import ops
    from kernelab.inspect import runner
    from kernelab.inspect.ops import plan
    from kernelab.inspect.report import analyze_jobs

    calls = []
    real = runner.run

    def recorded(pairs, *args, **kwargs):
        calls.append({"tpu" if t.is_tpu else "gpu" for _, t in pairs})
        return real(pairs, *args, **kwargs)

    monkeypatch.setattr(runner, "run", recorded)
    p = plan([ops.get("rmsnorm")], parse_targets("tpu_v5e,sm_90,gfx942"))
    jobs = sorted(p.jobs, key=lambda j: not j.target.is_tpu)  # TPU jobs listed first
    reports = analyze_jobs(jobs)
    assert len(reports) == len(jobs) and all(r.facts for r in reports)
    assert [r.target for r in reports] == [j.target.name for j in jobs]  # in the jobs' order
    kinds = [k for k in calls if k]
    assert {"tpu"} in kinds and {"gpu"} in kinds
    first_tpu = kinds.index({"tpu"})
    assert all(k == {"tpu"} for k in kinds[first_tpu:]), kinds
