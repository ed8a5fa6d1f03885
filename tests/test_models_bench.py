"""``kernelab model-bench``: a run lands in the ledger with its decode-step profile."""

import re

import pytest

pytest.importorskip("transformers")

from click.testing import CliRunner

from kernelab import ledger
from kernelab.cli import app

SMALL = ["--preset", "tiny-llama", "--device", "cpu", "--repeats", "1", "--max-time", "1"]
SMALL += ["--prompt-tokens", "4", "--decode-tokens", "2"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_model_bench_stores_timings_and_a_decode_step_profile(tmp_path):
    db_path = tmp_path / "ledger.sqlite"
    args = ["model-bench", *SMALL, "--quantize", "w8a16", "--ledger", str(db_path)]
    result = CliRunner().invoke(app, [*args, "--profile-dir", str(tmp_path / "traces")])
    assert result.exit_code == 0, result.output
    assert "one decode step — original" in result.output
    assert "one decode step — patched-w8a16" in result.output
    assert "framework overhead" in result.output
    run_id = re.search(r"stored as run (\w+)", result.output).group(1)
    with ledger.open(str(db_path)) as db:
        run = db.get_run(run_id)
    assert run["kind"] == "model-bench"
    by_mode = {}
    for case in run["cases"]:
        by_mode.setdefault(case["mode"], {})[case["variant"]] = case
    timed, profiled = by_mode["end-to-end"], by_mode["profile"]
    assert set(timed) == set(profiled) == {"original", "patched-w8a16"}
    assert timed["patched-w8a16"]["flags"] == ["quantize=w8a16"]
    # int8 codes and one scale per output channel: a little over 1 byte per weight
    params = 2 * (4 * 64 * 64 // 2 + 64 * 64 + 3 * 64 * 192)  # q, k/v (2 kv heads), o, MLP
    assert params < timed["patched-w8a16"]["metrics"]["linear_weight_bytes"] < 1.1 * params
    for case in timed.values():
        m = case["metrics"]
        assert m["decode_tokens_per_s"] > 0 and case["samples"]
        # medians with their spread, from at least --repeats (here 1: the rule's floor, 3)
        for spread in (m["prefill_spread"], m["decode_spread"]):
            assert spread["n"] >= 3 and spread["q1_s"] <= spread["q3_s"]
            assert spread["rel_ci"] >= 0 and isinstance(spread["converged"], bool)
        assert len(case["samples"]) == m["prefill_spread"]["n"]
        assert len(m["decode_samples"]) == m["decode_spread"]["n"]
        d = m["decode_spread"]
        assert d["tokens_per_s_q1"] <= m["decode_tokens_per_s"] <= d["tokens_per_s_q3"]
        # one decode step is the inverse of the throughput: the same median, not two
        assert m["decode_step_s"] * m["decode_tokens_per_s"] == pytest.approx(1.0)
    assert "± the median's ~95% interval" in result.output
    for case in profiled.values():
        m = case["metrics"]
        assert m["steps"] == 3 and m["step_us"] > 0 and 0 <= m["framework_overhead_share"] < 1
        assert m["top_cpu_ops"] and all(o["name"].startswith("aten::") for o in m["top_cpu_ops"])
        assert (tmp_path / "traces").joinpath(case["variant"], "decode-step.json").is_file()


def test_model_bench_rejects_an_unknown_quantization(tmp_path):
    result = CliRunner().invoke(app, ["model-bench", *SMALL, "--quantize", "int3", "--no-ledger"])
    assert result.exit_code != 0
    every = "w4a16, w8a16, fp8, fp8-block, mxfp4"
    assert f"quantize: expected one of {every}, got 'int3'" in result.output
    assert "Traceback" not in result.output
