import json

import pytest
from click.testing import CliRunner

from kernelab.cli import app

runner = CliRunner()


def test_version_names_kernelab_torch_triton_and_device():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    for word in ("kernelab 0.1.0", "torch ", "triton ", "device cpu"):
        assert word in result.output


def test_ops_lists_rmsnorm_and_its_variants():
    result = runner.invoke(app, ["ops", "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    rms = next(o for o in data["ops"] if o["op"] == "rmsnorm")
    assert {"kernelab", "torch", "compile"} <= {v["name"] for v in rms["variants"]}
    assert rms["inplace"] == ["residual"]


def test_run_prints_one_table_and_passes():
    result = runner.invoke(app, ["run", "rmsnorm", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "report card" in result.output and "rmsnorm" in result.output
    assert "verify seed " in result.output and "(quick tier; kernelab run --seed " in result.output


def test_run_takes_the_seed_it_prints():
    result = runner.invoke(app, ["run", "rmsnorm", "--device", "cpu", "--seed", "4242"])
    assert result.exit_code == 0, result.output
    assert "verify seed 4242 (quick tier; kernelab run --seed 4242 repeats it)" in result.output


def test_unknown_op_is_one_line_and_exit_2():
    result = runner.invoke(app, ["run", "nosuchop"])
    assert result.exit_code == 2
    assert "op: expected one of" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("op", "inplace", "optional", "required"),
    [
        ("rmsnorm", {"residual"}, {"residual"}, {"x", "weight", "eps"}),
        ("rope", {"query", "key"}, set(), {"query", "key"}),
        ("attention_prefill", set(), {"sinks", "block_mask"}, {"q", "k", "v", "cu_seqlens_q"}),
    ],
)
def test_ops_shows_the_calling_convention_of_one_op(op, inplace, optional, required):
    """Argument names, which are in place, which may be omitted, the out= rule and an example
    candidate that is valid Python with exactly those parameters."""
    import ast

    from kernelab import ops

    result = CliRunner().invoke(app, ["ops", op, "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    c = json.loads(result.stdout)["calling"]
    args = {a["name"]: a for a in c["arguments"]}
    declared = ops.get(op)
    assert set(args) >= set(declared.inputs(declared.shapes("edge")[0], declared.dtypes[0], "meta"))
    assert {n for n, a in args.items() if a["inplace"]} == inplace
    assert {n for n, a in args.items() if a["optional"]} >= optional
    assert not any(args[n]["optional"] for n in required)
    assert c["returns"] == list(declared.outputs) and "out=" in c["out_rule"]
    outs = ["out"] if declared.out_arg == "out" else []
    fn = ast.parse(c["example"]).body[0]
    params = [a.arg for a in fn.args.args]
    first = [n for n in args if not args[n]["optional"]]
    assert params == [*first, *(n for n in args if args[n]["optional"]), *outs]
    assert len(fn.args.defaults) == len(params) - len(first)  # the optional ones and out=
    text = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["ops", op, "--device", "cpu"])
    assert text.exit_code == 0 and f"calling convention of {op}" in text.stdout
    assert max(len(line) for line in text.stdout.splitlines()) <= 80
