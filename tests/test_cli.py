import json

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


def test_unknown_op_is_one_line_and_exit_2():
    result = runner.invoke(app, ["run", "nosuchop"])
    assert result.exit_code == 2
    assert "op: expected one of" in result.output and "Traceback" not in result.output
