"""model-cost: a model's ops, FLOPs, bytes and floors from the ops' own cost models."""

import json
from dataclasses import replace

import orjson
import pytest
from click.testing import CliRunner

from kernelab.cli import app
from kernelab.core.contract import Cost
from kernelab.core.op import get
from kernelab.hardware import DEVICES
from kernelab.workloads import model_cost as mc

runner = CliRunner()
DECODE64 = mc.Workload(batch=64, context=8192, prefill=512)


@pytest.fixture(scope="module")
def llama8b():
    return mc.cost("llama3-8b", "h200", DECODE64)


def _ops(step):
    return {o.name: o for o in step.ops}


def test_kv_bytes_per_token_llama3_8b_is_128_kib(llama8b):
    # 2 (k and v) x 32 layers x 8 KV heads x 128 x 2 bytes
    assert llama8b.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    fp8 = mc.cost("llama3-8b", "h200", mc.Workload(kv="fp8"))
    assert fp8.kv_bytes_per_token == 64 * 1024


def test_decode_attention_reads_the_whole_cache_once(llama8b):
    att = _ops(llama8b.decode)["attention"]
    assert att.op == "paged_attention"
    cache = 64 * 8192 * llama8b.kv_bytes_per_token  # every sequence's keys and values
    assert att.calls * att.kv_bytes == cache
    assert att.calls * att.bytes == pytest.approx(cache, rel=0.01)  # plus q, out, tables
    assert att.bound == "memory"


def test_weights_and_fit(llama8b):
    # Llama-3-8B has 8.03e9 parameters: 16.06 GB in bf16
    assert llama8b.weight_bytes == pytest.approx(16.06e9, rel=0.005)
    fit = llama8b.fit
    assert fit["kv_tokens"] == int((141 * 2**30 - llama8b.weight_bytes) // (128 * 1024))
    assert fit["max_batch_at_context"] == fit["kv_tokens"] // 8192
    assert fit["max_context_at_batch"] == fit["kv_tokens"] // 64


def test_rows_are_the_ops_own_cost_models(llama8b):
    """A row's FLOPs and bytes are what the op's declared cost gives for that shape."""
    gemm = get("gemm")
    shape = mc._shape("x", {"M": 64, "N": 14336 * 2, "K": 4096}, {"layout": "nk"})
    expect = gemm.cost(gemm.inputs(shape, mc.ACT_DTYPE, "meta"))
    row = _ops(llama8b.decode)["gate_up"]
    assert (row.flops, row.bytes) == (expect.flops, expect.bytes)
    assert row.flops == 2 * 64 * 28672 * 4096


def test_planted_cost_change_shows(monkeypatch):
    """model-cost has no copy of a formula: a changed op cost model moves its row."""
    before = _ops(mc.cost("llama3-8b", "h200", DECODE64).decode)["act_mul"]
    op = get("silu_and_mul")
    real = op.cost
    monkeypatch.setattr(op, "cost", lambda i: Cost(real(i).flops, 2 * real(i).bytes))
    after = _ops(mc.cost("llama3-8b", "h200", DECODE64).decode)["act_mul"]
    assert after.bytes == 2 * before.bytes


def test_fewer_kv_heads_halve_attention_bytes_and_leave_the_rest(llama8b):
    b = mc.cost(mc.load_config("llama3-8b").with_values({"num_key_value_heads": "4"}), "h200",
                DECODE64)  # fmt: skip
    a_ops, b_ops = _ops(llama8b.decode), _ops(b.decode)
    assert b_ops["attention"].kv_bytes == a_ops["attention"].kv_bytes / 2
    q_and_out = a_ops["attention"].bytes - a_ops["attention"].kv_bytes
    assert b_ops["attention"].bytes - b_ops["attention"].kv_bytes == pytest.approx(q_and_out)
    assert b_ops["kv_write"].bytes < a_ops["kv_write"].bytes
    assert b_ops["qkv"].bytes < a_ops["qkv"].bytes  # k and v projections shrink
    for name in ("in_norm", "o_proj", "post_norm", "gate_up", "act_mul", "down", "lm_head"):
        assert b_ops[name] == a_ops[name], name
    d = mc.diff(llama8b, b)
    assert d["ratio"] < 0.7
    assert "of which attention −" in d["summary"]
    assert d["summary"].startswith("decode step floor 17.6 → 10.4 ms (−41%)")


def test_recipes_change_the_gemm_ops():
    w4 = _ops(mc.cost("llama3-8b", "h200", mc.Workload(recipe="w4a16")).decode)
    bf = _ops(mc.cost("llama3-8b", "h200", mc.Workload()).decode)
    assert w4["gate_up"].op == "w4a16_gemm" and w4["lm_head"].op == "gemm"
    assert w4["gate_up"].bytes < bf["gate_up"].bytes / 3.5  # int4 + group scales
    fp8 = _ops(mc.cost("llama3-8b", "h200", mc.Workload(recipe="fp8")).decode)
    assert fp8["in_norm"].op == "rmsnorm_fp8_quant" and fp8["o_quant"].op == "fp8_quant"


def test_llama3_70b_and_every_device():
    c = mc.cost("llama3-70b", "h200", mc.Workload(batch=1, context=8192))
    assert c.weight_bytes == pytest.approx(141.1e9, rel=0.01)  # 70.6e9 parameters
    assert c.fit["weights_fit"]  # 141.1 GB of bf16 weights in 141 GiB (151.4 GB)
    assert c.fit["max_batch_at_context"] == 3  # 10.3 GB left: 31k tokens of 320 KiB
    assert c.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    small = mc.cost("llama3-70b", "h100", mc.Workload(batch=1, context=8192))
    assert not small.fit["weights_fit"] and small.fit["kv_tokens"] == 0
    res = runner.invoke(app, ["model-cost", "llama3-70b", "--device", "h100"])
    assert "do not fit in 80 GiB" in res.output
    for spec in DEVICES:
        assert (
            mc.cost("tiny-llama", spec.aliases[0] if spec.aliases else spec.name).decode.floor_s > 0
        )


def test_config_json_is_parsed(tmp_path):
    path = tmp_path / "config.json"
    values = {**mc.load_config("llama3-8b").__dict__}
    hf = {k: v for k, v in values.items() if k not in ("name",)}
    hf["architectures"] = ["LlamaForCausalLM"]
    path.write_text(json.dumps(hf))
    a = mc.cost(str(path), "h100")
    b = mc.cost("llama3-8b", "h100")
    assert a.decode.floor_s == b.decode.floor_s
    assert mc.load_config(str(tmp_path)).hidden_size == 4096  # a folder holding config.json


@pytest.mark.parametrize(
    "spec, words",
    [
        ("llama-9000", "expected a preset"),
        ({"hidden_size": 64}, "num_hidden_layers"),
        ({**mc.load_config("tiny-llama").__dict__, "num_local_experts": 2,
          "num_experts_per_tok": 4}, "num_experts_per_tok"),
        ({**mc.load_config("tiny-llama").__dict__, "num_local_experts": 8,
          "num_experts_per_tok": 2, "kv_lora_rank": 512}, "latent attention"),
        ({**mc.load_config("tiny-llama").__dict__, "num_local_experts": 8,
          "num_experts_per_tok": 2, "scoring_func": "noaux"}, "scoring_func"),
        ({**mc.load_config("tiny-llama").__dict__, "num_key_value_heads": 3}, "multiple"),
        ({**mc.load_config("tiny-llama").__dict__, "hidden_act": "relu2"}, "hidden_act"),
    ],
)  # fmt: skip
def test_bad_configs(spec, words):
    with pytest.raises(mc.CostError, match=words):
        mc.cost(spec, "h200")


def test_bad_json_and_device(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{'hidden_size': __import__('os')}")
    with pytest.raises(mc.CostError, match="not valid JSON"):
        mc.load_config(str(bad))
    with pytest.raises(mc.CostError, match="device: expected a device of the hardware table"):
        mc.cost("tiny-llama", "h300")


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"num_kv_heads": "4"}, "unknown key 'num_kv_heads'"),
        ({"num_key_value_heads": "four"}, "expects an integer"),
        ({"num_key_value_heads": "0"}, "positive"),
        ({"tie_word_embeddings": "maybe"}, "true or false"),
    ],
)
def test_bad_set(changes, words):
    with pytest.raises(mc.CostError, match=words):
        mc.load_config("llama3-8b").with_values(changes)


def test_cli_table_fits_80_columns_and_json():
    res = runner.invoke(app, ["model-cost", "llama3-8b", "--batch", "1,64"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    assert "paged_attention" in res.output and "128 KiB per token" in res.output
    res = runner.invoke(app, ["model-cost", "llama3-8b", "--batch", "64", "--json"])
    data = orjson.loads(res.output)
    assert data[0]["kv_bytes_per_token"] == 131072
    assert data[0]["decode"]["batch"] == 64


def test_cli_side_by_side():
    res = runner.invoke(
        app,
        ["model-cost", "llama3-8b", "--batch", "64", "--set", "num_key_value_heads=4"],
        env={"COLUMNS": "80"},
    )
    assert res.exit_code == 0, res.output
    assert "decode step floor 17.6 → 10.4 ms (−41%), of which attention" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    res = runner.invoke(app, ["model-cost", "llama3-8b", "--set", "recipe=w4a16", "--json"])
    d = orjson.loads(res.output)[0]["decode"]
    assert {r["name"]: r["op_b"] for r in d["ops"]}["down"] == "w4a16_gemm"


@pytest.mark.parametrize(
    "args, words",
    [
        (["nosuch"], "expected a preset"),
        (["llama3-8b", "--device", "h300"], "device"),
        (["llama3-8b", "--set", "heads"], "KEY=VALUE"),
        (["llama3-8b", "--set", "bogus=1"], "unknown key 'bogus'"),
        (["llama3-8b", "--set", "recipe=int3"], "recipe"),
        (["llama3-8b", "--batch", "0"], "batch"),
        (["llama3-8b", "--set", "kv=fp8", "--set", "kv=bf16"], "given twice"),
        (["llama3-8b", "mistral-7b", "qwen2.5-7b"], "one or two"),
    ],
)
def test_cli_errors(args, words):
    res = runner.invoke(app, ["model-cost", *args])
    assert res.exit_code == 2
    assert words in res.output


def test_any_device_row_and_the_package_export():
    """A device of any vendor works from its row alone (a TPU-like row: no CUDA fields)."""
    from kernelab.hardware import DeviceSpec
    from kernelab.models import cost

    tpu = DeviceSpec("TPU-like", "google", "tpu", 1, 32, 1.6e12, 0, {"bf16": 9.2e14})
    c = cost("llama3-8b", tpu, mc.Workload(batch=1))
    gate_up = _ops(c.decode)["gate_up"]
    assert gate_up.floor_s == pytest.approx(gate_up.bytes / 1.6e12)
    assert c.device == "TPU-like" and c.fit["weights_fit"]


# --- mixtures of experts -----------------------------------------------------------------------


def _row(step, name):
    return next(o for o in step.ops if o.name == name)


@pytest.mark.parametrize(
    "preset, billions", [("mixtral-8x7b", 46.7), ("qwen3-30b-a3b", 30.5)]
)  # the total parameter counts their authors publish
def test_an_moe_weighs_every_expert_and_decode_reads_the_ones_routed_to(preset, billions):
    c = mc.cost(preset, "h200", mc.Workload(batch=1, context=4096))
    assert c.weight_bytes / 2 / 1e9 == pytest.approx(billions, abs=0.05)
    cfg = c.config
    e, k, h = cfg.num_local_experts, cfg.num_experts_per_tok, cfg.hidden_size
    i = cfg.moe_intermediate_size or cfg.intermediate_size
    names = [o.name for o in c.decode.ops]
    assert "gate_up" not in names and names[names.index("post_norm") + 1 :][:3] == [
        "router", "topk", "experts"
    ]  # fmt: skip
    experts = _row(c.decode, "experts")
    assert experts.op == "fused_moe" and experts.calls == cfg.num_hidden_layers
    assert experts.weight_bytes == e * 3 * h * i * 2  # the footprint: every expert
    # one token at decode: its k experts' weights, read once, and little else
    assert k * 3 * h * i * 2 <= experts.bytes < 1.01 * k * 3 * h * i * 2
    assert experts.flops == 6 * k * h * i  # gate, up and down of k experts, 2 FLOPs a MAC
    assert experts.bound == "memory"
    batch = mc.cost(preset, "h200", mc.Workload(batch=64, context=4096))
    assert _row(batch.decode, "experts").bytes > experts.bytes  # more tokens reach more experts


def test_dense_layers_of_an_moe_run_the_dense_mlp():
    c = mc.cost("tiny-qwen3-moe", "h200")  # mlp_only_layers [1]: one of two layers is dense
    assert c.config.moe_layers == 1
    calls = {o.name: o.calls for o in c.decode.ops}
    assert calls["gate_up"] == calls["down"] == 1 and calls["experts"] == calls["router"] == 1
    assert calls["qkv"] == 2


def test_moe_recipes_are_the_moe_ops_kernelab_has():
    w4 = mc.cost("mixtral-8x7b", "h200", mc.Workload(recipe="w4a16"))
    experts = _row(w4.decode, "experts")
    bf16 = _row(mc.cost("mixtral-8x7b", "h200").decode, "experts")
    assert experts.op == "fused_moe_w4a16" and experts.weight_bytes < 0.3 * bf16.weight_bytes
    assert _row(w4.decode, "router").op == "gemm"  # routers stay in 16 bits
    with pytest.raises(mc.CostError, match="no w8a16 MoE op"):
        mc.cost("mixtral-8x7b", "h200", mc.Workload(recipe="w8a16"))


def test_the_fp8_recipe_runs_the_experts_on_fused_moe_fp8():
    c = mc.cost("mixtral-8x7b", "h200", mc.Workload(recipe="fp8", batch=1, context=4096))
    cfg = c.config
    e, k, h, i = cfg.num_local_experts, cfg.num_experts_per_tok, cfg.hidden_size, 14336
    experts = _row(c.decode, "experts")
    assert experts.op == "fused_moe_fp8" and experts.calls == cfg.num_hidden_layers
    # e4m3 weights plus one float32 scale per 128 x 128 block, every expert in the footprint
    scales = 4 * ((2 * i // 128) * (h // 128) + (h // 128) * (i // 128))
    assert experts.weight_bytes == e * (3 * h * i + scales)
    bf16 = _row(
        mc.cost("mixtral-8x7b", "h200", mc.Workload(batch=1, context=4096)).decode, "experts"
    )
    # one token at decode: its k experts at one byte a weight, about half the bf16 bytes
    assert k * (3 * h * i + scales) <= experts.bytes < 0.51 * bf16.bytes
    assert experts.flops == bf16.flops and experts.floor_s < 0.51 * bf16.floor_s
    # every layer is routed: the norm before the experts writes bf16 (router and op read it)
    norms = [o for o in c.decode.ops if o.name.endswith("post_norm")]
    assert [(o.name, o.op, o.calls) for o in norms] == [("post_norm", "rmsnorm", 32)]
    assert _row(c.decode, "router").op == "gemm" and _row(c.decode, "qkv").op == "fp8_gemm"
    prefill = _row(c.prefill, "experts")  # 4096 tokens: every expert, fp8 peak
    assert prefill.bound == "compute" or prefill.bytes >= e * 3 * h * i
    tiny = mc.cost("tiny-qwen3-moe", "h200", mc.Workload(recipe="fp8"))  # one dense layer
    calls = {o.name: (o.op, o.calls) for o in tiny.decode.ops}
    assert calls["post_norm"] == ("rmsnorm", 1)
    assert calls["dense_post_norm"] == ("rmsnorm_fp8_quant", 1)


def test_the_mxfp4_recipe_runs_the_experts_on_fused_moe_mxfp4():
    c = mc.cost("mixtral-8x7b", "h200", mc.Workload(recipe="mxfp4", batch=1, context=4096))
    cfg = c.config
    e, k, h, i = cfg.num_local_experts, cfg.num_experts_per_tok, cfg.hidden_size, 14336
    experts = _row(c.decode, "experts")
    assert experts.op == "fused_moe_mxfp4" and experts.calls == cfg.num_hidden_layers
    # half a byte a weight plus one ue8m0 byte per 32, every expert in the footprint
    per_expert = 3 * h * i // 2 + 3 * h * i // 32
    assert experts.weight_bytes == e * per_expert
    bf16 = _row(
        mc.cost("mixtral-8x7b", "h200", mc.Workload(batch=1, context=4096)).decode, "experts"
    )
    assert k * per_expert <= experts.bytes < 0.27 * bf16.bytes
    assert experts.flops == bf16.flops and experts.floor_s < 0.27 * bf16.floor_s
    # weight-only: the projections on mx_gemm with bf16 activations, the router in bf16
    assert _row(c.decode, "qkv").op == "mx_gemm" and _row(c.decode, "router").op == "gemm"
    assert _row(c.decode, "in_norm").op == "rmsnorm"
    prefill = _row(c.prefill, "experts")  # 2048 tokens: compute-bound at the bf16 peak
    assert prefill.bound == "compute"
    assert prefill.floor_s == _row(mc.cost("mixtral-8x7b", "h200").prefill, "experts").floor_s
    with pytest.raises(mc.CostError, match="recipe mxfp4: fused_moe_mxfp4 has no shared"):
        mc.cost(
            replace(cfg, shared_expert_intermediate_size=64), "h200", mc.Workload(recipe="mxfp4")
        )


def test_set_turns_a_dense_config_into_an_moe():
    base = mc.load_config("tiny-llama")
    moe = base.with_values({"num_local_experts": "4", "num_experts_per_tok": "2"})
    assert moe.moe_layers == base.num_hidden_layers
    assert "experts" in [o.name for o in mc.cost(moe, "h200").decode.ops]
