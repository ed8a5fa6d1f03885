"""model-cost on hostile config.json files: each refused in one line with exit 2, before any
costing (no traceback, no minutes of work, no gigabytes read)."""

import json

import pytest
from click.testing import CliRunner

from kernelab.cli import app
from kernelab.models.presets import PRESETS
from kernelab.workloads import model_config as mcfg

runner = CliRunner()
MOE = PRESETS["tiny-qwen3-moe"].values()
DENSE = PRESETS["tiny-llama"].values()


def _refused(tmp_path, text: str, words: str):
    path = tmp_path / "config.json"
    path.write_text(text)
    res = runner.invoke(app, ["model-cost", str(path)])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(
    "values, words",
    [
        # a loop over the layers (and a list scan per layer) would run for minutes
        ({**MOE, "num_hidden_layers": 10**10}, "num_hidden_layers: expected a positive integer"),
        ({**MOE, "mlp_only_layers": list(range(200_000))}, "mlp_only_layers: expected at most"),
        ({**MOE, "num_local_experts": 10**15}, "num_local_experts: expected an integer from 0 to"),
        ({**MOE, "num_experts": 10**15}, "num_local_experts: expected an integer from 0"),
        # past int64: the ops' sizes would overflow inside torch
        ({**DENSE, "hidden_size": 10**200}, "hidden_size: expected a positive integer up to"),
        ({**DENSE, "vocab_size": 2**63}, "vocab_size: expected a positive integer up to"),
        ({**MOE, "moe_intermediate_size": 10**30}, "moe_intermediate_size: expected an integer"),
    ],
)  # fmt: skip
def test_hostile_values_are_refused_in_one_line(tmp_path, values, words):
    _refused(tmp_path, json.dumps(values), words)


def test_json_nested_ten_thousand_deep_is_refused(tmp_path):
    _refused(tmp_path, "[" * 10_000 + "]" * 10_000, "nested too deep")
    nested = '{"a": ' * 10_000 + "1" + "}" * 10_000
    _refused(tmp_path, nested, "nested too deep")


def test_a_config_larger_than_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(mcfg, "MAX_CONFIG_BYTES", 1 << 16)  # the refusal, not the size, tested
    _refused(tmp_path, json.dumps({**DENSE, "pad": "x" * (1 << 17)}), "larger than")


def test_a_huge_set_value_is_refused_in_one_line():
    res = runner.invoke(
        app, ["model-cost", "tiny-llama", "--set", "num_hidden_layers=" + "9" * 5000]
    )
    assert res.exit_code == 2 and "set: num_hidden_layers expects an integer" in res.output
    res = runner.invoke(app, ["model-cost", "tiny-llama", "--set", "num_hidden_layers=100000"])
    assert res.exit_code == 2 and "0 to 10,000" in res.output
