"""Patching the mixture-of-experts blocks of Mixtral and Qwen3-MoE with moe_topk + fused_moe:
parity through the interpreter, refusal of a wrong kernel, reversibility."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernelab import ops  # noqa: E402
from kernelab.models import PatchError, _parity, build, patch, state_of, unpatch  # noqa: E402
from kernelab.numerics import error  # noqa: E402

MOE = ("tiny-mixtral", "tiny-qwen3-moe")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _moe_blocks(model):
    return [n for n, m in model.named_modules() if type(m).__name__.endswith("SparseMoeBlock")]


@pytest.mark.parametrize("name", MOE)
def test_moe_blocks_patched_and_parity_checked_on_the_cpu_path(name):
    """The wiring (router, renormalisation, expert weight layout) through the ops' CPU path."""
    model = build(name, dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model, tokens=6)
    before = _parity.logits(model, ids)
    patch(model)
    assert set(_moe_blocks(model)) <= set(state_of(model).names)
    assert error(_parity.logits(model, ids), before).rel_l2 <= _parity.tolerance(torch.bfloat16)
    unpatch(model)


@pytest.mark.slow
@pytest.mark.parametrize("name", MOE)
def test_moe_blocks_run_fused_moe_within_the_contract_through_the_interpreter(name, interpret):
    model = build(name, dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model, tokens=6)
    before = _parity.logits(model, ids)
    patch(model)  # the parity check runs inside, with the Triton kernels interpreted
    blocks = _moe_blocks(model)
    assert blocks and set(blocks) <= set(state_of(model).names)
    err = error(_parity.logits(model, ids), before).rel_l2
    assert err <= _parity.tolerance(torch.bfloat16)
    unpatch(model)
    assert torch.equal(_parity.logits(model, ids), before)


def test_qwen3_moe_dense_layers_keep_the_gated_mlp_patch():
    model = build("tiny-qwen3-moe", dtype=torch.bfloat16)
    patch(model)
    names = state_of(model).names
    assert "model.layers.0.mlp" in names and "model.layers.1.mlp" in names  # MoE, dense
    assert type(model.model.layers[1].mlp).__name__ == "Qwen3MoeMLP"
    unpatch(model)


def test_a_float32_model_keeps_its_moe_blocks():
    model = build("tiny-mixtral", dtype=torch.float32)
    patch(model)
    assert not set(_moe_blocks(model)) & set(state_of(model).names)
    unpatch(model)


@pytest.mark.parametrize(
    "wrong",
    [
        # the routing weights applied twice
        lambda real: lambda x, w1, w2, tw, ti, *a, **k: real(x, w1, w2, tw * tw, ti, *a, **k),
        # every token's experts shifted by one
        lambda real: (
            lambda x, w1, w2, tw, ti, *a, **k: real(x, w1, w2, tw, (ti + 1) % w1.shape[0], *a, **k)
        ),
    ],
    ids=["weights twice", "wrong experts"],
)
def test_a_wrong_fused_moe_is_refused_and_named(monkeypatch, wrong):
    model = build("tiny-mixtral", dtype=torch.bfloat16)
    ids = _parity.probe_inputs(model)
    before = _parity.logits(model, ids)
    monkeypatch.setattr(ops, "fused_moe", wrong(ops.fused_moe))
    with pytest.raises(PatchError, match=r"first module that differs: model\.layers\.0\.mlp"):
        patch(model)
    assert state_of(model) is None
    assert torch.equal(_parity.logits(model, ids), before)
