"""Sweep specs: strict validation naming the key, files parsed never run, tasks, keys and the
resources each task asks for (checked without a GPU)."""

import json

import pytest
from click.testing import CliRunner

from kernelab import sweep
from kernelab.cli import app
from kernelab.sweep import tasks as tasks_mod
from kernelab.sweep.engines import ray_options

runner = CliRunner()


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"kind": "inspect", "opz": ["rmsnorm"]}, r"spec\.opz: unknown key"),
        ({"kind": "inspect", "ops": "rmsnorm,nope"}, r"spec\.ops\[1\]: unknown op 'nope'"),
        ({"kind": "inspect", "ops": 3}, r"spec\.ops: expected a non-empty list of strings"),
        ({"kind": "inspect", "targets": ["sm_99"]}, r"spec\.targets\[0\]: unknown target 'sm_99'"),
        ({"kind": "verify", "targets": ["sm_90"]}, r"spec\.targets\[0\]: unknown target 'sm_90'"),
        ({"kind": "floors", "targets": ["cpu"]}, r"spec\.targets\[0\]: unknown target 'cpu'"),
        ({"kind": "bench", "dtypes": ["fp12"]}, r"spec\.dtypes\[0\]: unknown dtype 'fp12'"),
        ({"kind": "verify", "trials": "2"}, r"spec\.trials: expected an integer"),
        ({"kind": "verify", "trials": True}, r"spec\.trials: expected an integer"),
        ({"kind": "verify", "seeds": [1, -2]}, r"spec\.seeds\[1\]: expected an integer from 0"),
        ({"kind": "inspect", "seeds": [1]}, r"spec\.seeds: not a key of a inspect sweep"),
        ({"kind": "inspect", "configs": "all"}, r"spec\.configs: expected 'default', 'space'"),
        ({"kind": "inspect", "configs": [{"BLOCK": 1.5}]}, r"spec\.configs\[0\]\.BLOCK"),
        ({"kind": "verify", "variants": ["fast"]}, r"spec\.variants\[0\]: unknown variant"),
        ({"kind": "verify", "shape_sets": ["huge"]}, r"spec\.shape_sets\[0\]"),
        ({"kind": "bench", "retries": 99}, r"spec\.retries: expected an integer from 0 to 20"),
        ({"kind": "sweep"}, r"spec\.kind: expected one of inspect, verify"),
        ({"ops": ["rmsnorm"]}, r"spec\.kind: expected one of"),
    ],
)
def test_a_bad_spec_is_one_error_naming_the_key(raw, match):
    with pytest.raises(sweep.SpecError, match=match):
        sweep.validate(raw)


def test_toml_and_json_files_give_the_same_spec(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text(
        'kind = "inspect"\nops = ["rmsnorm", "gemm"]\ndtypes = ["bf16"]\n'
        'targets = ["sm_80", "sm_90"]\nconfigs = [{num_warps = 4}]\n'
    )
    js = tmp_path / "s.json"
    js.write_text(
        json.dumps(
            {
                "kind": "inspect",
                "ops": ["rmsnorm", "gemm"],
                "dtypes": ["bfloat16"],
                "targets": ["sm_80", "sm_90"],
                "configs": [{"num_warps": 4}],
            }
        )
    )
    a, b = sweep.validate(sweep.load(toml)), sweep.validate(sweep.load(js))
    assert a == b and a.dtypes == ("bfloat16",) and a.configs == ((("num_warps", 4),),)
    assert sweep.sweep_id(a) == sweep.sweep_id(b)


@pytest.mark.parametrize(
    ("text", "suffix", "match"),
    [
        ('kind = "inspect"\nops = [', ".toml", "is not valid TOML"),
        ("[1, 2]", ".json", "must hold a table"),
        ('__import__("os").system("touch pwned")', ".py", "expected a .toml or .json"),
        ('kind = "inspect"\ncolour = "red"\n', ".toml", r"spec\.colour: unknown key"),
        ('kind = "verify"\nops = ["rmsnorm"]\ntargets = ["H100", "TPU"]\n', ".toml",
         r"spec\.targets\[1\]: unknown target 'TPU'"),
    ],
)  # fmt: skip
def test_a_bad_spec_file_runs_nothing_and_stores_nothing(tmp_path, text, suffix, match):
    spec = tmp_path / f"s{suffix}"
    spec.write_text(text)
    db = tmp_path / "l.sqlite"
    result = runner.invoke(
        app, ["sweep", "--spec", str(spec), "--ledger", str(db)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2, result.output
    assert "error:" in result.output
    import re

    assert re.search(match, result.output.replace("\n", " ")), result.output
    assert not db.exists(), "a refused spec created the ledger"
    assert sorted(p.name for p in tmp_path.iterdir()) == [spec.name]


def test_flags_add_to_the_file_and_a_different_kind_is_refused(tmp_path):
    from kernelab.cli.sweep_cmd import spec_from

    f = tmp_path / "s.toml"
    f.write_text('kind = "verify"\nops = ["rmsnorm"]\nseeds = [1]\n')
    raw = spec_from(None, f, {"seeds": "3,4", "target": ("cpu",)})
    assert raw["seeds"] == [3, 4] and raw["targets"] == ["cpu"] and raw["ops"] == ["rmsnorm"]
    with pytest.raises(sweep.SpecError, match=r"spec\.kind: the file says 'verify'"):
        spec_from("bench", f, {})


def test_dry_run_counts_tasks_per_kind_and_creates_nothing(tmp_path):
    db = tmp_path / "l.sqlite"
    args = ["sweep", "verify", "--ops", "rmsnorm,softmax", "--variant", "torch", "--dtype",
            "fp32,bf16", "--seeds", "1,2,3", "--ledger", str(db), "--dry-run"]  # fmt: skip
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["tasks"] == {"verify": 2 * 2 * 3} and out["already_stored"] == 0
    assert out["core_seconds"] > 0 and out["gpu_tasks"] == 0
    table = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert table.exit_code == 0 and "verify" in table.output and "12" in table.output
    assert "estimated cost" in table.output
    assert not db.exists()


def test_inspect_tasks_follow_configs_dtypes_and_backend_targets():
    spec = sweep.validate(
        {"kind": "inspect", "ops": ["rmsnorm"], "dtypes": ["bf16"], "targets": ["sm_90"]}
    )
    tasks, skipped = sweep.expand(spec)
    from kernelab import ops

    shapes = ops.get("rmsnorm").shapes("representative")
    assert len(tasks) == len(shapes) and not skipped
    assert {t.shape_key for t in tasks} == {s.key for s in shapes}
    space = sweep.validate({**spec.as_dict(), "configs": "space"})
    n_space = sum(
        len(ops.get("rmsnorm").tuning_space(s, __import__("torch").bfloat16)) for s in shapes
    )
    assert len(sweep.expand(space)[0]) == n_space > len(tasks)
    some = sweep.validate({**spec.as_dict(), "configs": [{"num_warps": 4}]})
    picked = sweep.expand(some)[0]
    assert 0 < len(picked) < n_space
    assert all(json.loads(t.config)["num_warps"] == 4 for t in picked)
    with pytest.raises(ValueError, match=r"spec\.configs\[0\]\.BLOCK_Q: rmsnorm's configs"):
        sweep.expand(sweep.validate({**spec.as_dict(), "configs": [{"BLOCK_Q": 4}]}))


def test_task_keys_are_stable_and_change_with_what_decides_the_result(monkeypatch):
    spec = sweep.validate({"kind": "floors", "ops": ["rmsnorm"], "targets": ["H100", "B200"]})
    a = [t.key for t in sweep.expand(spec)[0]]
    assert a == [t.key for t in sweep.expand(spec)[0]] and len(set(a)) == len(a)
    real = tasks_mod.versions()
    monkeypatch.setattr(tasks_mod, "versions", lambda: {**real, "triton": "0.0"})
    assert not set(a) & {t.key for t in sweep.expand(spec)[0]}, "versions not in the key"
    monkeypatch.setattr(tasks_mod, "versions", lambda: real)
    import kernelab.core.runtime.tuned as tuned

    monkeypatch.setattr(tuned, "kernel_hash", lambda kernels: "edited")
    assert not set(a) & {t.key for t in sweep.expand(spec)[0]}, "kernel source not in the key"


def test_gpu_tasks_ask_for_one_gpu_of_their_type_and_cpu_tasks_for_cpus_only():
    spec = sweep.validate(
        {
            "kind": "verify",
            "ops": ["rmsnorm"],
            "variants": ["torch"],
            "dtypes": ["fp32"],
            "targets": ["cpu", "H100", "MI300X"],
        }
    )
    by_target = {t.target: t for t in sweep.expand(spec)[0]}
    assert ray_options(by_target["H100"]) == {
        "num_cpus": 1,
        "num_gpus": 1,
        "resources": {"gpu:H100": 1},
        "max_retries": 0,
        "retry_exceptions": False,
    }
    assert ray_options(by_target["MI300X"])["resources"] == {"gpu:MI300X": 1}
    cpu = ray_options(by_target["cpu"])
    assert cpu == {"num_cpus": 1, "max_retries": 0, "retry_exceptions": False}
    bench = sweep.expand(sweep.validate({**spec.as_dict(), "kind": "bench", "seeds": None,
                                         "trials": None, "targets": ["H200"]}))[0]  # fmt: skip
    assert all(ray_options(t)["resources"] == {"gpu:H200": 1} for t in bench) and bench
    floors = sweep.expand(sweep.validate({"kind": "floors", "ops": ["rmsnorm"],
                                          "targets": ["H100"]}))[0]  # fmt: skip
    assert all("num_gpus" not in ray_options(t) for t in floors), "a datasheet needs no GPU"
    ins = sweep.expand(sweep.validate({"kind": "inspect", "ops": ["rmsnorm"], "dtypes": ["bf16"],
                                       "targets": ["sm_100"]}))[0]  # fmt: skip
    assert all("num_gpus" not in ray_options(t) for t in ins), "compiles need no GPU"


def test_the_local_engine_refuses_gpu_tasks_before_anything_runs(tmp_path):
    db = tmp_path / "l.sqlite"
    result = runner.invoke(
        app,
        ["sweep", "verify", "--ops", "rmsnorm", "--target", "H100", "--ledger", str(db)],
    )
    assert result.exit_code == 2 and "need --engine ray" in result.output
    assert not db.exists()


def test_a_validated_spec_round_trips_and_retries_do_not_change_the_sweep():
    raw = {"kind": "verify", "ops": ["rmsnorm"], "variants": ["torch"], "seeds": [3, 1],
           "trials": 1, "dtypes": ["fp32"]}  # fmt: skip
    spec = sweep.validate(raw)
    assert sweep.validate(spec.as_dict()) == spec
    assert "configs" not in spec.as_dict() and "mode" not in spec.as_dict()
    again = sweep.validate({**raw, "retries": 5})
    assert sweep.sweep_id(again) == sweep.sweep_id(spec)
    assert sweep.sweep_id(sweep.validate({**raw, "seeds": [3]})) != sweep.sweep_id(spec)


def test_tune_tasks_cover_each_shape_and_target_with_its_space():
    import torch

    from kernelab import ops

    spec = sweep.validate({"kind": "tune", "ops": ["rmsnorm", "rope"], "dtypes": ["bf16"],
                           "targets": ["sm_90", "gfx942"]})  # fmt: skip
    tasks, skipped = sweep.expand(spec)
    op = ops.get("rmsnorm")
    shapes = op.shapes("representative")
    assert len([t for t in tasks if t.op == "rmsnorm"]) == 2 * len(shapes)
    assert {t.units for t in tasks if t.op == "rmsnorm"} <= {
        len(op.tuning_space(s, torch.bfloat16)) for s in shapes
    }
    if ops.get("rope").tuning_space is None:
        assert "rope: declares no tuning space (nothing to tune)" in skipped


def test_a_gpu_task_on_a_worker_without_that_gpu_fails_with_the_reason():
    from kernelab.sweep import work

    spec = sweep.validate({"kind": "verify", "ops": ["rmsnorm"], "variants": ["torch"],
                           "dtypes": ["fp32"], "targets": ["H200"]})  # fmt: skip
    (task,) = sweep.expand(spec)[0]
    assert task.gpu
    with pytest.raises(RuntimeError, match="task asked for a H200 GPU; this worker has"):
        work.execute(task)


# --- explicit sizes ------------------------------------------------------------------------------


def test_sizes_make_the_shapes_of_inspect_tune_floors_and_bench_tasks():
    from kernelab.sweep import work

    base = {"ops": ["rmsnorm"], "sizes": ["rows=4096,cols=8192", {"rows": 3, "cols": 96}]}
    spec = sweep.validate({**base, "kind": "inspect", "targets": ["sm_90"]})
    assert spec.sizes == ((("rows", 4096), ("cols", 8192)), (("rows", 3), ("cols", 96)))
    assert sweep.validate(spec.as_dict()) == spec  # round trip, as the ledger stores it
    tasks, _ = sweep.expand(spec)
    # one shape per size and per distinct option set of the representative shapes
    dims = {tuple(sorted(json.loads(t.params)["sizes"].items())) for t in tasks}
    assert dims == {(("cols", 8192), ("rows", 4096)), (("cols", 96), ("rows", 3))}
    assert all("rows=" in t.shape_key for t in tasks)
    from kernelab import ops

    shape = work._shape(ops.get("rmsnorm"), tasks[0])  # the worker finds the shape again
    assert shape.dims == json.loads(tasks[0].params)["sizes"] and shape.key == tasks[0].shape_key
    floors = sweep.validate({**base, "kind": "floors", "targets": ["H200"]})
    ftasks, _ = sweep.expand(floors)  # one per dtype
    out = work.execute(next(t for t in ftasks if t.dtype == "bfloat16"))
    assert {c["shape_label"].split()[0] for c in out["cases"]} == {
        "rows=4096,cols=8192", "rows=3,cols=96"
    }  # fmt: skip
    big = [c for c in out["cases"] if c["shape_label"].startswith("rows=4096")]
    assert all(c["metrics"]["bytes"] >= 2 * 4096 * 8192 * 2 for c in big)  # in and out, bf16
    bench = sweep.validate({**base, "kind": "bench", "targets": ["cpu"]})
    (btask,) = [t for t in sweep.expand(bench)[0] if t.dtype == "float32"]
    assert json.loads(btask.params)["sizes"] == [
        {"rows": 4096, "cols": 8192},
        {"rows": 3, "cols": 96},
    ]


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"sizes": ["rows=4096"]}, r"spec\.sizes\[0\]: rmsnorm takes sizes \['cols', 'rows'\]"),
        ({"sizes": ["rows=-1,cols=8"]}, r"spec\.sizes\[0\]: expected sizes as name=integer ≥ 0"),
        ({"sizes": [{"rows": 2, "cols": "8"}]}, r"spec\.sizes\[0\]\.cols: expected a positive"),
        ({"sizes": []}, r"spec\.sizes: expected a non-empty list"),
        ({"sizes": ["rows=2,cols=8"], "shapes": ["decode"]}, r"spec\.sizes: give sizes"),
    ],
)
def test_bad_sizes_name_the_entry(raw, match):
    with pytest.raises(sweep.SpecError, match=match):
        sweep.validate({"kind": "floors", "ops": ["rmsnorm"], "targets": ["H200"], **raw})


def test_the_shape_flag_with_sizes_becomes_the_specs_sizes(tmp_path):
    args = ["sweep", "floors", "--ops", "rmsnorm", "--target", "H200"]
    res = CliRunner().invoke(app, [*args, "--shape", "rows=64,cols=4096", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["spec"]["sizes"] == [{"rows": 64, "cols": 4096}], data["spec"]


def test_tune_on_a_gpu_type_asks_for_that_gpu_and_is_refused_without_it(tmp_path):
    from kernelab.sweep import work

    spec = sweep.validate({"kind": "tune", "ops": ["rmsnorm"], "dtypes": ["bf16"],
                           "targets": ["sm_90", "H100"]})  # fmt: skip
    tasks, _ = sweep.expand(spec)
    by = {}
    for t in tasks:
        by.setdefault(t.target, []).append(t)
    assert set(by) == {"sm_90", "H100"} and len(by["sm_90"]) == len(by["H100"])
    assert not any(t.gpu for t in by["sm_90"]) and all(t.gpu for t in by["H100"])
    assert ray_options(by["H100"][0])["resources"] == {"gpu:H100": 1}
    assert ray_options(by["H100"][0])["num_gpus"] == 1
    assert "num_gpus" not in ray_options(by["sm_90"][0])  # ranked statically on a CPU
    with pytest.raises(RuntimeError, match="task asked for a H100 GPU; this worker has"):
        work.execute(by["H100"][0])
    db = tmp_path / "l.sqlite"
    local = runner.invoke(app, ["sweep", "tune", "--ops", "rmsnorm", "--target", "H100",
                                "--ledger", str(db)])  # fmt: skip
    assert local.exit_code == 2 and "need --engine ray" in local.output, local.output
    assert not db.exists()
    with pytest.raises(sweep.SpecError, match=r"spec\.targets\[0\]: unknown target 'cpu'"):
        sweep.validate({"kind": "tune", "ops": ["rmsnorm"], "targets": ["cpu"]})
