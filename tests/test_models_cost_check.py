"""model-cost against a CPU profile of a tiny preset: the op mix and each op's counts."""

import pytest
import torch

pytest.importorskip("transformers")

from kernelab.core.contract import Cost
from kernelab.core.op import get
from kernelab.models import build
from kernelab.workloads import cost_check as cc
from kernelab.workloads import model_cost as mc

TOKENS = 6


@pytest.fixture(scope="module")
def events():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return cc.profile_prefill(build("tiny-llama", dtype=torch.float32), TOKENS)
    finally:
        torch.set_num_threads(threads)


def _checks(events):
    step = mc.cost("tiny-llama", "h200", mc.Workload(prefill=TOKENS)).prefill
    return cc.check(step, events)


def test_prediction_matches_the_profile_op_by_op(events):
    checks, unchecked = _checks(events)
    bad = [c for c in checks if not c.ok]
    assert not bad, bad
    names = {c.name.split(" (")[0] for c in checks}
    assert {"qkv", "o_proj", "gate_up", "down", "lm_head", "attention", "embedding"} <= names
    assert len([c for c in checks if c.what == "bytes"]) == 2 * 4 + 1 + 2 + 1
    assert set(unchecked) == {"in_norm", "rope", "kv_write", "post_norm", "act_mul",
                              "final_norm", "sampling"}  # fmt: skip


def _planted(monkeypatch, op_name, arg):
    op = get(op_name)
    real = op.cost

    def twice(inputs):  # the op counts one of its inputs twice
        c = real(inputs)
        t = inputs[arg]
        return Cost(c.flops, c.bytes + t.numel() * t.element_size())

    monkeypatch.setattr(op, "cost", twice)


@pytest.mark.parametrize(
    "op_name, arg, rows",
    [
        ("gemm", "a", {"qkv", "o_proj", "gate_up", "down", "lm_head"}),
        ("attention_prefill", "k", {"attention"}),
    ],
)
def test_a_cost_model_counting_an_input_twice_fails(events, monkeypatch, op_name, arg, rows):
    _planted(monkeypatch, op_name, arg)
    checks, _ = _checks(events)
    bad = {c.name.split(" (")[0] for c in checks if not c.ok}
    assert bad == rows
    assert all(c.what == "bytes" for c in checks if not c.ok)


def test_a_wrong_flop_count_or_op_mix_fails(events, monkeypatch):
    op = get("attention_prefill")
    real = op.cost
    monkeypatch.setattr(op, "cost", lambda i: Cost(2 * real(i).flops, real(i).bytes))
    checks, _ = _checks(events)
    assert {c.what for c in checks if not c.ok} == {"flops"}
    monkeypatch.undo()
    # a prediction for a model with one layer more than the traced one
    step = mc.cost(mc.load_config("tiny-llama").with_values({"num_hidden_layers": "3"}),
                   "h200", mc.Workload(prefill=TOKENS)).prefill  # fmt: skip
    checks, _ = cc.check(step, events)
    assert [c.name for c in checks if not c.ok] == ["projections", "attention"]


def test_cli_check_profile():
    import orjson
    from click.testing import CliRunner

    from kernelab.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["model-cost", "tiny-llama", "--check-profile", "--prefill", "4",
                              "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    data = orjson.loads(res.output[res.output.index("{") :])
    # 3 counts, 9 GEMMs x 2, all the GEMMs, 2 attentions x 2, the embedding
    assert data["ok"] and len(data["prefill"]["checks"]) == len(data["decode"]["checks"]) == 27
    res = runner.invoke(app, ["model-cost", "llama3-8b", "--check-profile"])
    assert res.exit_code == 2 and "one tiny preset" in res.output
    # Gemma-2's block is not the one the cost model's rows describe
    res = runner.invoke(app, ["model-cost", "tiny-gemma2", "--check-profile"])
    assert res.exit_code == 2 and "one tiny preset" in res.output
    assert "tiny-gemma2" not in res.output.split("preset (")[1].split(")")[0]


def test_a_preset_with_projection_biases():
    """Qwen2 has biases on q, k and v: the prediction counts them, and matches its profile."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        events = cc.profile_prefill(build("tiny-qwen2", dtype=torch.float32), TOKENS)
    finally:
        torch.set_num_threads(threads)
    step = mc.cost("tiny-qwen2", "h200", mc.Workload(prefill=TOKENS)).prefill
    checks, _ = cc.check(step, events)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    # without the biases the prediction is caught
    unbiased = {**mc.load_config("tiny-qwen2").__dict__, "attention_bias": False}
    step = mc.cost(unbiased, "h200", mc.Workload(prefill=TOKENS)).prefill
    bad = {c.name.split(" (")[0] for c in cc.check(step, events)[0] if not c.ok}
    assert bad == {"qkv", "all projections"}


def test_a_decode_step_matches_and_a_wrong_kv_count_fails(monkeypatch):
    """Decode: the KV part of paged attention's cost against the cache the model attends."""
    context = 40
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        events = cc.profile_decode(build("tiny-llama", dtype=torch.float32), context)
    finally:
        torch.set_num_threads(threads)

    def decode():
        return mc.cost("tiny-llama", "h200", mc.Workload(batch=1, context=context)).decode

    checks, _ = cc.check(decode(), events)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert any(c.name.startswith("attention") and c.what == "bytes" for c in checks)
    _planted(monkeypatch, "paged_attention", "q")
    bad = {c.name.split(" (")[0] for c in cc.check(decode(), events)[0] if not c.ok}
    assert bad == {"attention"}
    monkeypatch.undo()
    # a context one short of the one attended: the prediction reads too little cache
    short = mc.cost("tiny-llama", "h200", mc.Workload(batch=1, context=context - 1)).decode
    bad = {c.name.split(" (")[0] for c in cc.check(short, events)[0] if not c.ok}
    assert bad == {"attention"}
