"""Patching transformers models: parity, reversibility, refusal of a wrong kernel."""

import importlib
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernelab import ops  # noqa: E402
from kernelab.models import (  # noqa: E402
    PatchError,
    _parity,
    build,
    patch,
    patched,
    state_of,
    unpatch,
)
from kernelab.models._arch import blueprint_for  # noqa: E402
from kernelab.numerics import error  # noqa: E402

TINY = ("tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models():
    return {name: build(name, dtype=torch.float32) for name in TINY}


@pytest.mark.parametrize("name", TINY)
def test_patched_logits_match_within_contract_through_the_interpreter(name, interpret):
    for dtype in (torch.float32, torch.bfloat16):
        model = build(name, dtype=dtype)
        ids = _parity.probe_inputs(model, tokens=6)
        before = _parity.logits(model, ids)
        patch(model)  # the parity check runs inside, with the Triton kernels interpreted
        assert state_of(model).names, "nothing was patched"
        err = error(_parity.logits(model, ids), before).rel_l2
        assert err <= _parity.tolerance(dtype)
        unpatch(model)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_greedy_tokens_identical_in_float32_over_16_steps(name, interpret, models):
    model = models[name]
    ids = _parity.probe_inputs(model, tokens=4, seed=3)
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    want = model.generate(ids, **kwargs)
    with patched(model):
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, want)


def test_unpatch_restores_the_original_bitwise(models):
    model = build("tiny-qwen2", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model)
    before = _parity.logits(model, ids)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    patch(model)
    unpatch(model)
    assert torch.equal(_parity.logits(model, ids), before)
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert state_of(model) is None
    assert not any("_kernelab" in a or a == "forward" for m in model.modules() for a in vars(m))


def test_a_wrong_kernel_makes_the_parity_check_refuse_the_patch(monkeypatch):
    model = build("tiny-llama", dtype=torch.float32)
    ids = _parity.probe_inputs(model)
    before = _parity.logits(model, ids)
    real = ops.rmsnorm

    def wrong(x, weight, eps=1e-6, residual=None, out=None):  # drops the weight
        return real(x, torch.ones_like(weight), eps, residual, out)

    monkeypatch.setattr(ops, "rmsnorm", wrong)
    with pytest.raises(PatchError, match=r"first module that differs: model\.layers\.0\."):
        patch(model)
    assert state_of(model) is None
    assert torch.equal(_parity.logits(model, ids), before)


def test_unknown_architecture_lists_what_is_supported():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="'gpt2' is not supported; supported: llama, mistral"):
        patch(model)


def test_bad_arguments(models):
    model = models["tiny-llama"]
    with pytest.raises(ValueError, match="unknown replacement"):
        patch(model, ops=("flash",))
    with pytest.raises(ValueError, match="not patched"):
        unpatch(model)
    with patched(model, check=False), pytest.raises(ValueError, match="already patched"):
        patch(model)


def test_generate_with_static_cache(models):
    model = models["tiny-mistral"]
    ids = _parity.probe_inputs(model, tokens=4)
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation="static")
    want = model.generate(ids, **kwargs)
    with patched(model):
        assert torch.equal(model.generate(ids, **kwargs), want)


def test_importing_kernelab_models_patches_nothing():
    module = importlib.import_module("transformers.models.llama.modeling_llama")
    before = module.LlamaRMSNorm.forward
    importlib.reload(importlib.import_module("kernelab.models"))
    assert module.LlamaRMSNorm.forward is before


def test_model_bench_runs_on_cpu_and_stores_nothing_when_asked(tmp_path):
    from click.testing import CliRunner

    from kernelab.cli import app

    result = CliRunner().invoke(
        app,
        [
            "model-bench",
            "--preset",
            "tiny-llama",
            "--device",
            "cpu",
            "--repeats",
            "1",
            "--decode-tokens",
            "4",
            "--no-ledger",
            "--no-profile",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"variant": "patched"' in result.output


def test_patched_model_compiles_without_graph_breaks(models):
    model = models["tiny-llama"]
    ids = _parity.probe_inputs(model)
    with patched(model):
        explained = torch._dynamo.explain(model)(input_ids=ids, use_cache=False)
    assert explained.graph_break_count == 0, explained.break_reasons


OPCHECKS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)


@pytest.mark.parametrize("name", [op.name for op in ops.all_ops()])
def test_every_op_has_a_generated_custom_op_that_passes_torch_opcheck(name):
    """Schema, mutation, fake implementation and autograd registration, checked by torch on
    the op's own edge inputs (small shapes, on the CPU)."""
    from kernelab.models import _library

    op = ops.get(name)
    lib_op = _library.custom_op(name)
    signature, mutated, _ = _library.schema_of(op)
    assert set(mutated) == set(op.contract.inplace) & set(signature.parameters)
    checked = 0
    for shape in op.shapes("edge")[:4]:
        inputs = op.inputs(shape, op.dtypes[0], "cpu", seed=1)
        args = tuple(inputs.get(p, signature.parameters[p].default) for p in signature.parameters)
        if not any(isinstance(a, torch.Tensor) and a.numel() for a in args):
            continue
        fp8 = any(isinstance(a, torch.Tensor) and a.element_size() == 1 for a in args)
        # torch's schema check compares float8 tensors with arithmetic the CPU lacks for them;
        # the other checks (fake tensor, autograd registration, AOT dispatch) still run.
        utils = [u for u in OPCHECKS if not (fp8 and u == "test_schema")]
        torch.library.opcheck(lib_op, args, test_utils=utils)
        checked += 1
    assert checked


def test_generated_schemas_follow_the_declarations():
    from kernelab.models import _library

    schema = str(_library.custom_op("rmsnorm")._opoverload._schema)
    assert re.fullmatch(
        r"kernelab::rmsnorm\(Tensor x, Tensor weight, float eps=[0-9.e-]+, "
        r"Tensor\(a3!\)\? residual=None\) -> Tensor",
        schema,
    ), schema
    rope = str(_library.custom_op("rope")._opoverload._schema)
    assert "Tensor(a1!) query" in rope and "Tensor(a2!) key" in rope and rope.endswith("-> ()")
    assert "bool is_neox=True, bool check=True)" in rope, rope
    fp8 = str(_library.custom_op("fp8_quant")._opoverload._schema)
    assert fp8.endswith("-> (Tensor, Tensor)") and "ScalarType fp8_dtype" in fp8


def test_rope_replacement_is_scoped_to_patched_models_and_restored():
    module = importlib.import_module("transformers.models.qwen2.modeling_qwen2")
    original = module.apply_rotary_pos_emb
    a, b = build("tiny-qwen2"), build("tiny-qwen2", seed=1)
    patch(a)
    patch(b)
    assert module.apply_rotary_pos_emb is not original
    unpatch(a)
    assert module.apply_rotary_pos_emb is not original  # b still patched
    unpatch(b)
    assert module.apply_rotary_pos_emb is original


def test_a_wrong_rope_is_refused_and_named(monkeypatch):
    model = build("tiny-llama")
    real = ops.rope

    def wrong(positions, query, key, cos_sin_cache, is_neox=True):  # GPT-J pairing for NeoX
        return real(positions, query, key, cos_sin_cache, is_neox=False)

    monkeypatch.setattr(ops, "rope", wrong)
    with pytest.raises(PatchError, match=r"replaced function.*apply_rotary_pos_emb"):
        patch(model)
    module = importlib.import_module("transformers.models.llama.modeling_llama")
    assert not hasattr(module.apply_rotary_pos_emb, "__wrapped__")


def test_patch_returns_what_it_replaced_per_kind():
    """The return value (and ``state_of``) names every module each kind replaced, and only
    those; its repr counts them per kind."""
    model = build("tiny-llama", dtype=torch.float32)
    bp = blueprint_for(model)
    norms = [n for n, m in model.named_modules() if type(m).__name__ == bp.norm_class]
    mlps = [n for n, m in model.named_modules() if type(m).__name__ == bp.mlp_class]
    layers = [n for n, m in model.named_modules() if type(m).__name__ == bp.layer_class]
    state = patch(model, ("rmsnorm", "mlp"), check=False)
    try:
        assert state is state_of(model)
        assert state.replaced == {"rmsnorm": norms, "mlp": mlps}
        text = repr(state)
        assert f"rmsnorm {len(norms)} ({norms[0]} … {norms[-1]})" in text
        assert f"mlp {len(mlps)} ({mlps[0]} … {mlps[-1]})" in text
        assert "fused_residual" not in text and "llama" in text
    finally:
        unpatch(model)
    state = patch(model, ("fused_residual",), check=False)
    try:
        assert state.replaced == {"fused_residual": layers}
    finally:
        unpatch(model)
